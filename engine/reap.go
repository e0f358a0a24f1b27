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
		var closing []*instance
		v.mu.Lock()
		// idle is a stack: the least recently used instances are at the bottom.
		for len(v.idle) > 0 && v.live > v.minInstances() && now.Sub(v.idle[0].lastUsed) >= ttl {
			closing = append(closing, v.idle[0])
			v.idle = v.idle[1:]
			v.live--
		}
		zero := v.live == 0 && v.refs == 0 && v.minInstances() == 0 && now.Sub(v.lastUsed) >= ttl
		v.mu.Unlock()
		for _, in := range closing {
			in.inst.Close()
		}
		if len(closing) > 0 {
			e.cfg.Log.Info("released idle instances", "function", fv.f.name, "count", len(closing), "idle_ttl", ttl)
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
	if !e.tab.detach(f, v) {
		return false
	}
	v.retire()
	return true
}
