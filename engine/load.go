package engine

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/objectstore"
)

// loadState is the version's bundle as load prepared it, and teardown
// unloads (loadTok is taken in this file alone): written once, holding
// loadTok, before loaded is set, and read-only after; but for refused (set
// by a device's refusal) and prep, which the first program load takes.
type loadState struct {
	loadTok chan struct{} // one fetch and unpack at a time; waits honour the request's deadline
	// placeToks is the token of the version's program loads on each
	// device (placeTok): one load on a device at a time, however many
	// requests ask; waits honour the request's deadline. One token for
	// the version made two cold starts on two GPUs load one after the
	// other.
	placeMu   sync.Mutex
	placeToks map[device.Device]chan struct{}
	loaded    atomic.Bool
	loadErr   error                         // a permanent refusal (invalid bundle), not an outage
	refused   atomic.Pointer[errdefs.Error] // a device refused the library, or load refused the bundle (loadErr): as permanent

	dir       string
	manifest  *abi.Manifest
	steps     []device.Step // the manifest chain: entries 0..k-1 of every program
	policy    policy
	constSize int64
	batch     *batcher // non-nil for a batching function (manifest "batch")
	unpin     func()   // ends the version's use of its cached bundle
	// prep is the fetch, verify and unpack of the bundle, until the first
	// program load takes it for its cold start's log (place), whichever
	// device it loads on.
	prep atomic.Pointer[coldLoad]
}

// load prepares v's bundle on this node (fetched, verified, unpacked;
// its policy and run pool set) once, however many requests ask at a time.
func (e *Engine) load(ctx context.Context, v *version) error {
	// A token, not a mutex: a request that finds another's fetch under way
	// (a store that hangs, up to that request's deadline) gives up at its
	// own deadline, not at the other's, and at the end of a drain's grace
	// (RefuseQueued) is refused, where the exit cut it unanswered.
	sha := v.rec.SHA256[:min(12, len(v.rec.SHA256))]
	if err := e.takeTurn(ctx, v.loadTok, v.fn.name, "fetch of its bundle "+sha, "fetch its bundle "+sha); err != nil {
		switch {
		case errors.Is(err, errShutDown):
			return err
		case !errors.Is(err, context.DeadlineExceeded): // as pool.acquire tells them
			return errorf(errdefs.KindUnavailable, err, "function %s: the request was cancelled while another request fetched its bundle %s", v.fn.name, sha)
		}
		return errorf(errdefs.KindTimeout, err, "function %s: the request's deadline passed while another request fetched its bundle %s", v.fn.name, sha)
	}
	defer func() { <-v.loadTok }()
	if v.loaded.Load() {
		return nil
	}
	if v.loadErr != nil {
		return v.loadErr
	}
	t0 := time.Now()
	dir, m, fetched, err := e.cfg.Cache.Get(ctx, e.cfg.Store, v.rec.SHA256)
	if err != nil {
		var fe *bundle.FetchError
		var be *bundle.Error
		switch {
		case errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT):
			// Writing the bundle into the cache failed: the store is fine,
			// and the disk to free is this node's. The client is told the
			// stage and the errno; where the node keeps its files is the
			// log's alone.
			return e.cacheFull(v, err)
		case errors.As(err, &fe) && errors.Is(ctx.Err(), context.DeadlineExceeded):
			// The request's deadline bounds the fetch: its 504, as for a
			// record read cut by it (readCut), not the store's 503.
			return errorf(errdefs.KindTimeout, err, "function %s: the request's deadline passed while bundle %s was fetched from the store", v.fn.name, v.rec.SHA256[:12])
		case errors.Is(err, bundle.ErrDamagedInUse):
			// The node's disk, not the store: its paths are the log's.
			e.cfg.Log.Error("a cached bundle is damaged and still in use", "function", v.fn.name, "version", v.rec.ID, "error", err)
			return errorf(errdefs.KindUnavailable, err, "function %s: bundle %s in this node's cache is damaged and still in use by a loaded version; it is fetched again once that version unloads (the server log says what is damaged)", v.fn.name, v.rec.SHA256[:12])
		case errors.As(err, &fe) && errors.Is(err, objectstore.ErrNotFound):
			return e.bundleMissing(ctx, v, err) // no outage: retries would not mend it
		case errors.As(err, &fe):
			return unavailable(err, "function %s: cannot fetch bundle %s from the store", v.fn.name, v.rec.SHA256[:12])
		case errors.As(err, &be) || isManifestRefusal(err):
			// The bundle itself is refused, its manifest included: that
			// will not change, and it is not fetched again at every
			// request (a 503 a client retries forever).
			why := err.Error()
			if be != nil {
				why = be.Error()
			}
			rf := errorf(refusalKind(err), err, "function %s version %s: %s", v.fn.name, v.rec.ID, why)
			v.loadErr = rf
			v.refused.Store(rf) // for Pin.Unready, which takes no lock
			return v.loadErr
		default: // local trouble (disk full, a race with eviction): try again later
			e.cfg.Log.Error("cannot prepare bundle", "function", v.fn.name, "sha256", v.rec.SHA256[:12], "error", err)
			return errorf(errdefs.KindUnavailable, err, "function %s: cannot prepare its bundle on this node; see the server log", v.fn.name)
		}
	}
	v.policy = e.policyFor(m)
	if m.Constants != "" {
		fi, err := os.Stat(filepath.Join(dir, m.Constants))
		if err != nil {
			e.cfg.Cache.Release(v.rec.SHA256)
			return errorf(errdefs.KindInternal, err, "function %s: constants", v.fn.name)
		}
		v.constSize = fi.Size()
	}
	v.dir, v.manifest, v.steps, v.unpin = dir, m, manifestSteps(m), func() { e.cfg.Cache.Release(v.rec.SHA256) }
	var freed slotWaiter
	if m.Batch != nil {
		v.batch = newBatcher(e, v)
		freed = v.batch
	}
	v.pool.open(e, v.policy.max, freed, time.Now())
	v.prep.Store(&coldLoad{fetched: fetched, fetchMs: ms(time.Since(t0))})
	v.loaded.Store(true)
	return nil
}

// cacheFull is the 507 of a cold start whose fetch or unpack of v's
// bundle into the bundle cache found this node's disk full.
func (e *Engine) cacheFull(v *version, err error) error {
	sha := v.rec.SHA256[:12]
	e.cfg.Log.Error("cold start: this node's disk is full", "function", v.fn.name, "sha256", sha, "cache", e.cfg.Cache.Dir(), "error", err)
	stage := "writing" // not seen: Get says the stage of every write
	var se *bundle.StageError
	if errors.As(err, &se) {
		stage = se.Stage
	}
	why := syscall.ENOSPC
	errors.As(err, &why)
	return errorf(errdefs.KindNoSpace, err, "function %s: cold start: this node's disk is full: %s bundle %s into the node's bundle cache failed (%v)", v.fn.name, stage, sha, why)
}

// teardown closes every program: constants freed, library unloaded or
// worker stopped. Every instance is closed by now: refs is 0, so none is
// busy, and retire closed the idle ones. It takes loadTok so that it never
// runs beside a load.
func (v *version) teardown() {
	v.loadTok <- struct{}{}
	defer func() { <-v.loadTok }()
	if v.unpin != nil {
		defer v.unpin() // a program's Close that panics must not keep the bundle in use in the cache for good
	}
	eachDespitePanics(v.pool.unplace(), func(p *placement) {
		if err := p.prog.Close(); err != nil {
			v.lg.Info("unload failed", "function", v.fn.name, "version", v.rec.ID, "device", p.dev.Name(), "error", err)
		}
	})
	if v.loaded.Load() {
		v.lg.Info("unloaded", "function", v.fn.name, "version", v.rec.ID)
	}
}
