package engine

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/registry"
)

// Refresh follows changes made elsewhere (another node's deploy, a
// rollback, a delete) to the functions this node has resolved. It lists the
// records' tags (one store request) and reads only the records whose tag
// changed since this node last applied them, those of names new here
// whose tag it has not read (refreshNew: a function deployed elsewhere that
// asks for instances kept warm is pre-warmed here), and those of the names
// followed here that it has not loaded (refreshFollowed). A store outage
// changes nothing: loaded functions keep serving.
func (e *Engine) Refresh(ctx context.Context) error { return e.refresh(ctx, ctx) }

// refresh is Refresh under ctx, whose deadline (Watch's) bounds the poll's
// reads; life is what a version it installs is pre-warmed under, which the
// poll's end must not cut. The records whose read ran out of the poll's
// time in the last poll are read last: a record whose read stalls takes
// the poll's time and cuts the reads after it, and read first at every
// poll it would keep every other change made elsewhere (a rollback) from
// landing here.
func (e *Engine) refresh(ctx, life context.Context) error {
	names := e.tab.names()
	tags, err := e.tab.reg.Tags(ctx)
	if err != nil {
		return err
	}
	e.names.listed(tags) // Names serves it: no listing of its own while polled
	p := &poll{ctx: ctx, slow: e.slowReads.take(), cut: map[string]bool{}}
	loaded := make(map[string]bool, len(names))
	var later []string
	for _, name := range names {
		loaded[name] = true
		if p.slow[name] {
			later = append(later, name)
			continue
		}
		p.read(name, func() error { return e.refreshOne(ctx, life, name, tags) })
	}
	followed := e.refreshFollowed(ctx, life, loaded, tags, p)
	e.refreshNew(ctx, life, loaded, followed, tags, p)
	for _, name := range later {
		p.read(name, func() error { return e.refreshOne(ctx, life, name, tags) })
	}
	e.slowReads.keep(p.cut)
	return p.err
}

// refreshOne applies name's record if its tag changed. A panic while it
// does (a bug a record can reach, in its parsing or in applying it) is
// name's error, not the end of the process: Watch runs on every node with
// no transport above it, and the record would end them all, and each again
// as it restarts. Its stack is logged once per name, until its record is
// applied or gone (the map holds only names that panicked and since did
// neither). The panic may leave the record half-applied (its new version
// current, the old not retired); the next poll reads it again.
func (e *Engine) refreshOne(ctx, life context.Context, name string, tags map[string]string) (err error) {
	defer e.recordPanicked(name, &err)
	if tag, ok := tags[name]; ok && tag != "" && tag == e.tab.appliedTag(name) {
		return nil // unchanged since applied
	}
	at := e.tab.at()
	rec, tag, err := e.tab.reg.GetTagged(ctx, name)
	if errors.Is(err, registry.ErrNoFunction) {
		e.tab.forget(name, at)
		e.refreshPanics.Delete(name) // a name made anew may panic anew: its stack logged again
		return nil
	}
	if err != nil {
		return err // the registry's errors name the function
	}
	// A record deleted and made anew elsewhere between two polls is a new
	// function under the name (its output, its counts), not a new version
	// of the one this node had: switchTo sees it.
	cv, err := rec.CurrentVersion()
	if err != nil {
		return err
	}
	f, changed := e.tab.switchTo(name, cv, rec, at, tag)
	if f == nil {
		return nil // overtaken by a change here
	}
	if changed {
		e.warmAside(life, f, cv.ID)
	}
	e.refreshPanics.Delete(name)
	return nil
}

// refreshFollowed is Refresh's part for names followed here and not
// loaded (loaded: those that are, as keys), which it returns (as keys):
// one store read per changed record per poll, whatever the number of
// followers. A record that asks for instances kept warm is taken on and
// pre-warmed under life, as refreshNew does for names new here; the table
// then keeps the name's followers. The names whose read the last poll cut
// are read last (p.slow), and its errors are p's.
func (e *Engine) refreshFollowed(ctx, life context.Context, loaded map[string]bool, tags map[string]string, p *poll) map[string]bool {
	fl := &e.tab.followed
	mine, changed := fl.toCheck(e.logs, loaded, tags)
	names := make([]string, 0, len(changed))
	for name := range changed {
		names = append(names, name)
	}
	slices.SortStableFunc(names, func(a, b string) int { return cmpBool(p.slow[a], p.slow[b]) })
	for _, name := range names {
		was := changed[name]
		p.read(name, func() error {
			at := e.tab.at()
			rec, tag, err := e.tab.reg.GetTagged(ctx, name)
			switch {
			case errors.Is(err, registry.ErrNoFunction):
				fl.gone(e.logs, name, was)
			case err != nil:
				return fmt.Errorf("reading the record of a function followed here: %w", err)
			default:
				took, wanted := e.takeOnWarm(life, name, rec, tag, at)
				if !took {
					if wanted {
						tag = "" // overtaken by a change here: read again at the next poll
					}
					fl.followIn(e.logs, name, rec, tag, was)
				}
			}
			return nil
		})
	}
	return mine
}

// refreshNew is Refresh's part for names new here (loaded and followed:
// those that are not, as keys; refreshFollowed reads the records of the
// followed ones). Its errors are p's.
func (e *Engine) refreshNew(ctx, life context.Context, loaded, followed map[string]bool, tags map[string]string, p *poll) {
	for _, name := range e.fresh.toRead(loaded, followed, tags) {
		listed := tags[name]
		p.read(name, func() error {
			seen, err := e.refreshNewOne(ctx, life, name, listed)
			e.fresh.read(name, seen, err != nil)
			return err
		})
	}
}

// refreshNewOne reads the record of name, new here and listed with tag
// listed, and takes the function on (takeOnWarm); it returns the tag read
// not to read again ("": none, the function taken on, gone, or to be read
// again).
func (e *Engine) refreshNewOne(ctx, life context.Context, name, listed string) (seen string, err error) {
	defer e.recordPanicked(name, &err)
	at := e.tab.at()
	rec, tag, err := e.tab.reg.GetTagged(ctx, name)
	if errors.Is(err, registry.ErrNoFunction) {
		return "", nil // deleted since the listing: nothing to follow here
	}
	if errors.Is(err, registry.ErrCorruptRecord) && listed != "" {
		// Read again once the listing shows it changed: a request names
		// it to its client, and failing every poll it hid the store's
		// real failures from the poll's log.
		e.cfg.Log.Warn("the record of a function new to this node cannot be decoded", "function", name, "error", err)
		return listed, nil
	}
	if err != nil {
		return "", fmt.Errorf("reading the record of a function new to this node: %w", err)
	}
	switch took, wanted := e.takeOnWarm(life, name, rec, tag, at); {
	case took:
		e.refreshPanics.Delete(name)
		return "", nil
	case wanted:
		return "", nil // overtaken by a change here: read again at the next poll unless loaded
	}
	return tag, nil
}

// takeOnWarm makes this node run name's function, not loaded here, from
// rec (read with tag at the table's epoch at) if its current version asks
// for instances kept warm, and pre-warms it aside under life. It reports
// whether it did, and whether the record asked (then, not done: a change
// here overtook the read).
func (e *Engine) takeOnWarm(life context.Context, name string, rec *api.Record, tag string, at uint64) (took, wanted bool) {
	cv, err := rec.CurrentVersion()
	if err != nil || !e.wantsWarm(cv) {
		return false, false // a record it cannot read is a request's to report
	}
	f, changed := e.tab.switchTo(name, cv, rec, at, tag)
	if f == nil {
		return false, true
	}
	if changed {
		e.warmAside(life, f, cv.ID)
	}
	return true, true
}

// recordPanicked, deferred, makes a panic while name's record is applied
// name's error (*err), its stack logged once per name (refreshOne).
func (e *Engine) recordPanicked(name string, err *error) {
	if v := recover(); v != nil {
		*err = fmt.Errorf("function %s: applying its record panicked: %v", name, v)
		if _, logged := e.refreshPanics.LoadOrStore(name, true); !logged {
			e.cfg.Log.Error("applying a function's record panicked; it is left as it was", "function", name, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
		}
	}
}

// pollLimit is how long one poll of Watch may take: twice its interval,
// and 10 s at least, so that a store slow to list or to answer a record
// read (a busy S3, a short --poll) still finishes its poll. It bounds the
// poll because nothing else does: minio-go bounds no read of a body once
// its headers came, and a read that stalls held the poll, and with it
// every change made elsewhere (a rollback, a delete), with no line said.
func pollLimit(interval time.Duration) time.Duration {
	return max(2*interval, 10*time.Second)
}

// Watch calls Refresh every interval until ctx ends, each under pollLimit
// (e.pollDeadline in tests). A poll cut by it is said once until a poll
// finishes in time, apart from the store's errors (said once until it
// reads again); its records are read again at the next.
func (e *Engine) Watch(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	limit := e.pollDeadline
	if limit <= 0 {
		limit = pollLimit(interval)
	}
	failing, overran := false, false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, limit)
		err := e.refresh(pctx, ctx)
		over := errors.Is(pctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil
		cancel()
		switch {
		case over && !overran:
			e.cfg.Log.Warn("a poll of the function records ran past its deadline and was cut; the functions whose records it did not read serve what this node last saw, and the next poll reads them again", "deadline", limit, "error", err)
		case err != nil && !over && !failing:
			e.cfg.Log.Warn("cannot refresh function records; serving what is loaded", "error", err)
		case err == nil && (failing || overran):
			e.cfg.Log.Info("function records readable again")
		}
		failing, overran = err != nil && !over, over
	}
}
