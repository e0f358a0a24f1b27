package engine

import (
	"context"
	"errors"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/registry"
)

// Versions returns a function's record: every version and the current one.
func (c *Control) Versions(ctx context.Context, name string) (*api.Record, error) {
	e := c.e
	rec, err := e.reg.Get(ctx, name)
	if errors.Is(err, registry.ErrNoFunction) {
		return nil, errorf(KindNotFound, err, "function %q not found", name)
	}
	if err != nil {
		return nil, unavailable(err, "function %s: store unavailable", name)
	}
	return rec, nil
}

// Rollback makes an earlier (or later) version of name current. In-flight
// requests finish on the version they started on.
func (c *Control) Rollback(ctx context.Context, name, version string) (api.FunctionInfo, error) {
	e := c.e
	rv, err := e.reg.SetCurrent(ctx, name, version)
	switch {
	case errors.Is(err, registry.ErrNoFunction):
		return api.FunctionInfo{}, errorf(KindNotFound, err, "function %q not found", name)
	case errors.Is(err, registry.ErrNoVersion) && len(version) < 8:
		return api.FunctionInfo{}, errorf(KindNotFound, err, "function %s has no version %q: give a version id or a unique prefix of at least 8 characters (plover versions %s)", name, version, name)
	case errors.Is(err, registry.ErrNoVersion):
		return api.FunctionInfo{}, errorf(KindNotFound, err, "function %s has no version %q", name, version)
	case errors.Is(err, registry.ErrConflict):
		return api.FunctionInfo{}, errorf(KindConflict, err, "rollback %s: %s", name, err.Error())
	case err != nil:
		return api.FunctionInfo{}, unavailable(err, "rollback %s: cannot update the store", name)
	}
	f, _ := e.switchTo(name, rv, 0)
	if f == nil {
		return api.FunctionInfo{}, errorf(KindUnavailable, nil, "rolled %s back to %s, but this server is shutting down", name, rv.ID)
	}
	e.warmIfWanted(ctx, f)
	e.cfg.Log.Info("current version set", "function", name, "version", rv.ID)
	return e.info(f, rv, e.versionCount(ctx, name)), nil
}

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

// GC deletes bundles no function record references, older than grace.
func (c *Control) GC(ctx context.Context, grace time.Duration) ([]string, error) {
	e := c.e
	removed, err := e.reg.GC(ctx, grace)
	if err != nil {
		return removed, unavailable(err, "gc: store unavailable")
	}
	return removed, nil
}
