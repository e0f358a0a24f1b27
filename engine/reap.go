package engine

import (
	"context"
	"time"
)

// ReapEvery runs Reap periodically until ctx ends.
func (e *Engine) ReapEvery(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			e.Reap(now)
		}
	}
}

// Reap releases instances idle for longer than their function's idle_ttl,
// keeping min_instances, and unloads (scales to zero) functions that have
// had no instance for that long. The server calls it periodically.
func (e *Engine) Reap(now time.Time) {
	for _, fv := range e.tab.versions(true) {
		v := fv.v
		if !v.loaded.Load() {
			continue
		}
		ttl := v.idleTTL()
		if ttl <= 0 {
			continue
		}
		closed, zero := v.pool.reap(now, ttl, v.minInstances())
		if closed > 0 {
			e.cfg.Log.Info("released idle instances", "function", fv.f.name, "count", closed, "idle_ttl", ttl)
		}
		if zero && e.unload(fv.f, v) {
			e.cfg.Log.Info("scaled to zero", "function", fv.f.name, "version", v.rec.ID, "idle_ttl", ttl)
		}
	}
}

// unload replaces v, if still current, by an unloaded copy of the same
// version and retires v: its programs go once in-flight requests end. The
// next request is a cold start.
func (e *Engine) unload(f *function, v *version) bool {
	if !e.tab.detach(f, v, nil) {
		return false
	}
	v.pool.retire()
	return true
}
