package engine

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/plover-run/plover/registry"
)

// Refresh follows changes made elsewhere (another node's deploy, a
// rollback, a delete) to the functions this node has resolved. It lists the
// records' tags (one store request) and reads only the records whose tag
// changed since this node last applied them, and those of the names
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
	e.refreshFollowed(ctx, loaded, tags, p)
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
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("function %s: applying its record panicked: %v", name, v)
			if _, logged := e.refreshPanics.LoadOrStore(name, true); !logged {
				e.cfg.Log.Error("applying a function's record panicked; it is left as it was", "function", name, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			}
		}
	}()
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
