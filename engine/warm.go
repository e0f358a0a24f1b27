package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/errdefs"
)

// warm loads v and creates instances up to its min_instances.
func (e *Engine) warm(ctx context.Context, v *version, loaded func()) error {
	err := e.load(ctx, v)
	loaded() // the bundle is in use from here (or not at all)
	if err != nil {
		return err
	}
	for {
		n, retired := v.pool.instances()
		if n >= v.policy.min || retired {
			return nil
		}
		// Hold a slot like a request, so warming never takes the function
		// past max_instances; if requests hold them all, they are creating
		// the instances anyway.
		if !v.pool.trySlot() {
			return nil
		}
		if err := e.warmOne(ctx, v); err != nil {
			return err
		}
	}
}

// warmOne makes one idle instance of v in the slot warm took for it, and
// gives the slot back however it ends. A device's Go code that panics
// (Health, MemInfo, Load, NewInstance), recovered above (a transport, a
// poll's warmAside), left the slot held for good with no instance: the
// pool read as building one, so the reaper never topped it up nor
// unloaded it, and with max_instances 1 every request waited out its
// deadline.
func (e *Engine) warmOne(ctx context.Context, v *version) error {
	defer v.pool.release()
	in, _, err := e.newInstance(ctx, v)
	if err != nil {
		return err
	}
	v.pool.put(in, false, time.Now())
	return nil
}

// Prewarm brings every function whose policy asks for min_instances up to
// them, as a server does at start. The record says which functions want
// instances (the server default applies to all), so other bundles are not
// fetched: they stay in the store until their first request.
func (e *Engine) Prewarm(ctx context.Context) error {
	// Bounded: the server's start runs it under its own life, and a
	// listing that stalls (no read of a body is bounded by minio-go once
	// its headers came) would warm nothing, and say nothing, for as long
	// as it lives. Not by one request's time: at start the listing reads
	// every record in turn (a round trip each on S3), and 500 functions
	// at 30 ms each took the default 30 s, so that the cut warmed none.
	lctx, cancel := context.WithTimeout(ctx, prewarmListing*e.cfg.Timeout)
	// The tags, listed before the records: a record listed here whose tag
	// a poll finds unchanged is not read again as new here (refreshNew),
	// which at a start beside thousands of functions read every record
	// once more, a few per poll. One changed since has another tag.
	tags, terr := e.tab.reg.Tags(lctx)
	recs, err := e.tab.reg.List(lctx)
	cancel()
	if err != nil {
		return fmt.Errorf("prewarm: %w", err)
	}
	var firstErr error
	for _, rec := range recs {
		cv, err := rec.CurrentVersion()
		if err != nil || !e.wantsWarm(cv) {
			if tag := tags[rec.Name]; terr == nil && tag != "" {
				e.fresh.read(rec.Name, tag, false)
			}
			continue
		}
		if err := e.prewarmOne(ctx, rec.Name); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	return firstErr
}

// prewarmOne is Prewarm's warm of name. A panic in it (a device's Go
// code) is name's error: the server's start runs Prewarm on a goroutine
// of its own, which nothing above recovers, and the other functions are
// still to be warmed.
func (e *Engine) prewarmOne(ctx context.Context, name string) (err error) {
	defer func() {
		if p := e.survived("pre-warming at start", name, recover()); p != nil {
			err = p
		}
	}()
	f, err := e.tab.lookup(ctx, name, time.Time{})
	if err != nil {
		return err
	}
	e.warmIfWanted(ctx, f)
	return nil
}

// prewarmListing is how many request timeouts Prewarm's listing may take
// (10 minutes at the default 30 s: some 20,000 records on S3).
const prewarmListing = 20

// warmIfWanted brings f's current version up to its min_instances.
// Functions without a minimum (by their record, or the server default) are
// left unloaded, and nothing is fetched for them.
func (e *Engine) warmIfWanted(ctx context.Context, f *function) {
	e.warmIfWantedAt(ctx, f, "")
}

// warmIfWantedAt is warmIfWanted, only while f's current version is id
// (any, for ""): a poll's warm of the version it installed leaves one
// landed since (a deploy here, which warms its own) alone.
func (e *Engine) warmIfWantedAt(ctx context.Context, f *function, id string) {
	v := e.tab.currentOf(f)
	if v == nil || id != "" && v.rec.ID != id || !e.wantsWarm(v.rec) {
		return
	}
	e.warmCurrent(ctx, f, v)
}

// wantsWarm reports whether rv, by its record or the server's default,
// asks for instances kept warm (a pipeline has none).
func (e *Engine) wantsWarm(rv api.Version) bool {
	return !rv.IsPipeline() && (rv.MinInstances > 0 || e.cfg.MinInstances > 0) && e.runsHere(rv.Target)
}

// runsHere says whether this node has a device of target, a version's
// (empty, from a record written before versions named theirs: may). A
// store may be shared by nodes of several kinds: a host-only node
// pre-warming a CUDA function fetched and held its bundle for good, and
// its top-ups warned without end.
func (e *Engine) runsHere(target string) bool {
	return target == "" || abi.RunsOn(target, e.targets) == nil
}

// warmAside pre-warms version id of f (warmIfWantedAt), which a poll
// installed, on a goroutine of its own: a constructor may take up to the
// request timeout, and the poll meanwhile follows the other functions'
// changes (a delete among them). One at a time per function: a poll that
// finds one under way leaves it the version it installed, warmed next
// (the reaper tries again only a version whose warm failed). Only a poll's version is
// warmed: one this node deployed, or a request landed, is warmed by its
// own deploy or built by its request, and a second warm beside it made a
// second instance. A panic is logged, as a poll's is.
func (e *Engine) warmAside(ctx context.Context, f *function, id string) {
	if !e.aside.start(f, id) {
		return
	}
	go func() {
		defer func() {
			if e.survived("pre-warming a polled function", f.name, recover()) != nil {
				e.aside.drop(f)
			}
		}()
		for ; id != ""; id = e.aside.end(ctx, f) {
			e.warmIfWantedAt(ctx, f, id)
		}
	}()
}

// asideWarms is the functions a poll's pre-warm is under way for, each
// with the version a poll installed since it began, to warm next ("":
// none).
type asideWarms struct {
	mu sync.Mutex
	m  map[*function]string
}

// start reports whether a warm of f is to begin; if one is under way, it
// is left version id to warm next instead.
func (a *asideWarms) start(f *function, id string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, busy := a.m[f]; busy {
		a.m[f] = id
		return false
	}
	if a.m == nil {
		a.m = map[*function]string{}
	}
	a.m[f] = ""
	return true
}

// end is the version the warm of f under way is to warm next ("" once
// ctx is done or none was left it: the warm is over).
func (a *asideWarms) end(ctx context.Context, f *function) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if id := a.m[f]; id != "" && ctx.Err() == nil {
		a.m[f] = ""
		return id
	}
	delete(a.m, f)
	return ""
}

// drop ends the warm of f under way, whatever was left it.
func (a *asideWarms) drop(f *function) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.m, f)
}

// warmCurrent brings v up to its min_instances while it is f's current
// version (a deploy landing meanwhile pre-warms the new one), and says why
// it could not (logged here); unless a warm of v is under way already:
// that one makes the instances. Two deploys (or a deploy and a rollback)
// landing together each warmed the version current then, the same one:
// both read no instance yet and made one each, two for a min_instances
// of 1.
func (e *Engine) warmCurrent(ctx context.Context, f *function, v *version) error {
	if !v.warming.CompareAndSwap(false, true) {
		return nil
	}
	defer v.warming.Store(false)
	return e.warmTaken(ctx, f, v)
}

// warmTaken is warmCurrent's warm of v, whose warming its caller holds
// (topUp holds it too). A version not loaded yet is left to its first
// request where its bundle would take the bundle cache past its limit
// with those in use or being warmed (Cache.Reserve): requests still load
// it. A pre-warm runs the bundle's constructors: one that hangs must not
// hold a deploy (or a server's start, or the reaper's top-up) for longer
// than a request may take.
func (e *Engine) warmTaken(ctx context.Context, f *function, v *version) error {
	if !v.pool.ref() {
		return nil
	}
	defer v.pool.unref()
	if e.tab.currentOf(f) != v {
		return nil
	}
	// Failed unless it ends well, a panic too: the reaper then tries it
	// again though it is not loaded (topUp).
	warmed := false
	defer func() { v.warmFailed.Store(!warmed) }()
	release := func() {}
	if !v.loaded.Load() {
		// Reserved until the load holds the bundle in use, at its size
		// unpacked where the deploy measured it: packed, a bundle of
		// zeros is a few KiB.
		size := max(v.rec.Size, v.rec.Unpacked)
		r, ok := e.cfg.Cache.Reserve(v.rec.SHA256, size)
		if !ok {
			return e.notWarmed(f, v, e.pastCacheLimit(size))
		}
		// Released once the load holds the bundle in use, not after the
		// constructors: counted twice meanwhile, it refused other
		// pre-warms for nothing.
		release = r
		defer r() // a panic's too
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	if err := e.warm(ctx, v, release); err != nil {
		return e.notWarmed(f, v, err)
	}
	warmed = true
	return nil
}

// pastCacheLimit is why a pre-warm of a bundle of size bytes could not
// reserve it in the bundle cache: larger than --cache-limit by itself, a
// refusal of the bundle's size (KindTooLarge, as a deploy past the cache's
// limit on objects is) that no unload mends; else crowded out by the
// bundles in use or being warmed, which may unload.
func (e *Engine) pastCacheLimit(size int64) error {
	if limit := e.cfg.Cache.Limit(); limit > 0 && size > limit {
		return errorf(errdefs.KindTooLarge, nil, "not kept warm: its bundle (%d bytes) is larger than this node's --cache-limit (%d bytes) by itself; it loads at its first request", size, limit)
	}
	return fmt.Errorf("not kept warm: its bundle (%d bytes) and the bundles in use or being warmed would pass this node's --cache-limit; it loads at its first request", size)
}

// warmRefusal is a warm's failure that no later try of the version
// mends on this node (lastingRefusal).
type warmRefusal struct {
	err *errdefs.Error
	// cold: it holds only while the version is not loaded (its bundle
	// alone past --cache-limit, a bound only pre-warms keep to): once a
	// request loaded it anyway, it is kept at its min_instances as any
	// loaded version is, as it was before this refusal was kept.
	cold bool
}

// warmRefusal is why v is not to be warmed again on this node, where
// that still holds; nil where a try may yet succeed.
func (v *version) warmRefusal() *errdefs.Error {
	r := v.warmRefused.Load()
	if r == nil || r.cold && v.loaded.Load() {
		return nil
	}
	return r.err
}

// notWarmed logs err, why a warm of v made none or not all of the
// instances min_instances keeps, and returns it. One that no later try
// mends (lastingRefusal) is kept as v's (warmRefused): the reaper tries
// v no more, which otherwise it did every back-off, to about 10 minutes,
// warning each time, for as long as v was current; the log says so at
// the one try, and the function's listing goes on saying why.
func (e *Engine) notWarmed(f *function, v *version, err error) error {
	if rf := e.lastingRefusal(v, err); rf != nil {
		v.warmRefused.Store(&warmRefusal{err: rf, cold: rf.Kind == errdefs.KindTooLarge})
		e.cfg.Log.Warn("cannot make the instances min_instances keeps, and will not try this version again: a new version is tried afresh", "function", f.name, "version", v.rec.ID, "error", rf)
		return err
	}
	e.cfg.Log.Warn("cannot make the instances min_instances keeps", "function", f.name, "version", v.rec.ID, "error", err)
	return err
}

// lastingRefusal is err, a failed warm of v, where every later warm of v
// on this node would fail so too; nil where a try may succeed (the store
// unreachable, a deadline, a device without room now, a constructor that
// failed, which the crashes' back-off paces). Lasting: v's bundle or
// library refused, as its requests are (refused: an unknown manifest
// field too, which only another node or a newer server runs); a refusal
// of the bundle's own (KindInvalid: no device here large enough for it;
// KindTooLarge: past --cache-limit by itself); or v built for no device
// of this node, which a record older than the targets records keep could
// not tell before its load (wantsWarm).
func (e *Engine) lastingRefusal(v *version, err error) *errdefs.Error {
	if rf := v.refused.Load(); rf != nil {
		return rf
	}
	var ee *errdefs.Error
	if !errors.As(err, &ee) {
		ee = errorf(errdefs.KindInternal, err, "%s", err.Error())
	}
	if ee.Kind == errdefs.KindInvalid || ee.Kind == errdefs.KindTooLarge || v.loaded.Load() && !e.runsHere(v.manifest.Target) {
		return ee
	}
	return nil
}
