package engine

import (
	"context"
	"errors"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/registry"
)

// Refresh follows changes made elsewhere (another node's deploy, a
// rollback, a delete) to the functions this node has resolved. It lists the
// records' tags (one store request) and reads only the records whose tag
// changed since this node last applied them. A store outage changes
// nothing: loaded functions keep serving.
func (e *Engine) Refresh(ctx context.Context) error {
	e.mu.Lock()
	names := make([]string, 0, len(e.funcs))
	for n := range e.funcs {
		names = append(names, n)
	}
	e.mu.Unlock()
	tags, err := e.reg.Tags(ctx)
	if err != nil {
		return err
	}
	var firstErr error
	for _, name := range names {
		if tag, ok := tags[name]; ok && tag != "" && tag == e.appliedTag(name) {
			continue // unchanged since applied
		}
		e.mu.Lock()
		at := e.epoch
		e.mu.Unlock()
		rec, tag, err := e.reg.GetTagged(ctx, name)
		if errors.Is(err, registry.ErrNoFunction) {
			e.forget(name, at)
			continue
		}
		if err == nil {
			var cv api.Version
			if cv, err = rec.CurrentVersion(); err == nil {
				f, changed := e.switchTo(name, cv, at)
				if changed {
					e.warmIfWanted(ctx, f)
				}
				if f != nil { // applied, not overtaken by a change here
					e.mu.Lock()
					e.tags[name] = tag
					e.mu.Unlock()
				}
				continue
			}
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	return firstErr
}

// appliedTag is the tag of the record Refresh last applied for name.
func (e *Engine) appliedTag(name string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.tags[name]
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
