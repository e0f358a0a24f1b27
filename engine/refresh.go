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
func (e *Engine) Refresh(ctx context.Context) error {
	names := e.tab.names()
	tags, err := e.tab.reg.Tags(ctx)
	if err != nil {
		return err
	}
	e.names.listed(tags) // Names serves it: no listing of its own while polled
	var firstErr error
	loaded := make(map[string]bool, len(names))
	for _, name := range names {
		loaded[name] = true
		if err := e.refreshOne(ctx, name, tags); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	if err := e.refreshFollowed(ctx, loaded, tags); err != nil && firstErr == nil {
		firstErr = err
	}
	return firstErr
}

// refreshOne applies name's record if its tag changed. A panic while it
// does (a bug a record can reach, in its parsing or in applying it) is
// name's error, not the end of the process: Watch runs on every node with
// no transport above it, and the record would end them all, and each again
// as it restarts. Its stack is logged once per name, until its record is
// applied or gone (the map holds only names that panicked and since did
// neither). The panic may leave the record half-applied (its new version
// current, the old not retired); the next poll reads it again.
func (e *Engine) refreshOne(ctx context.Context, name string, tags map[string]string) (err error) {
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
	f, changed := e.tab.switchTo(name, cv, rec, at)
	if f == nil {
		return nil // overtaken by a change here
	}
	if changed {
		e.warmAside(ctx, f, cv.ID)
	}
	e.tab.applied(name, tag)
	e.refreshPanics.Delete(name)
	return nil
}

// Watch calls Refresh every interval until ctx ends.
func (e *Engine) Watch(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := e.Refresh(ctx)
		if err != nil && !failing {
			e.cfg.Log.Warn("cannot refresh function records; serving what is loaded", "error", err)
		} else if err == nil && failing {
			e.cfg.Log.Info("function records readable again")
		}
		failing = err != nil
	}
}
