package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/plover-run/plover/abi"
)

// policy is a version's pool policy: its manifest over the server defaults.
type policy struct {
	min, max, queue int
	idleTTL         time.Duration // <= 0: never release for idleness
}

func (e *Engine) policyFor(m *abi.Manifest) policy {
	p := policy{min: e.cfg.MinInstances, max: e.cfg.MaxInstances, queue: e.cfg.MaxQueue, idleTTL: e.cfg.IdleTTL}
	if m.MinInstances > 0 {
		p.min = m.MinInstances
	}
	if m.MaxInstances > 0 {
		p.max = m.MaxInstances
	}
	if m.MaxQueue > 0 {
		p.queue = m.MaxQueue
	}
	if d, ok := m.IdleTTLDuration(); ok {
		p.idleTTL = d
	}
	if p.min > p.max {
		p.min = p.max
	}
	return p
}

// warm loads v and creates instances up to its min_instances.
func (e *Engine) warm(ctx context.Context, v *version) error {
	if err := e.load(ctx, v); err != nil {
		return err
	}
	for {
		v.mu.Lock()
		n, retired := v.live, v.retired
		v.mu.Unlock()
		if n >= v.policy.min || retired {
			return nil
		}
		// Hold a slot like a request, so warming never takes the function
		// past max_instances; if requests hold them all, they are creating
		// the instances anyway.
		select {
		case v.slots <- struct{}{}:
		default:
			return nil
		}
		in, _, err := e.newInstance(ctx, v)
		if err == nil {
			v.put(in, false, time.Now())
		}
		v.release()
		if err != nil {
			return err
		}
	}
}

// Prewarm brings every function whose policy asks for min_instances up to
// them, as a server does at start. The record says which functions want
// instances (the server default applies to all), so other bundles are not
// fetched: they stay in the store until their first request.
func (e *Engine) Prewarm(ctx context.Context) error {
	recs, err := e.reg.List(ctx)
	if err != nil {
		return fmt.Errorf("prewarm: %w", err)
	}
	var firstErr error
	for _, rec := range recs {
		cv, err := rec.CurrentVersion()
		if err != nil || (cv.MinInstances == 0 && e.cfg.MinInstances == 0) {
			continue
		}
		f, err := e.lookup(ctx, rec.Name)
		if err == nil {
			e.warmIfWanted(ctx, f)
		} else if firstErr == nil {
			firstErr = err
		}
	}
	return firstErr
}

// warmIfWanted brings f's current version up to its min_instances.
// Functions without a minimum (by their record, or the server default) are
// left unloaded, and nothing is fetched for them.
func (e *Engine) warmIfWanted(ctx context.Context, f *function) {
	e.mu.Lock()
	v := f.cur
	e.mu.Unlock()
	if v == nil || (v.rec.MinInstances == 0 && e.cfg.MinInstances == 0) || !v.ref() {
		return
	}
	defer v.unref()
	// A pre-warm runs the bundle's constructors: one that hangs must not
	// hold a deploy (or a server's start) for longer than a request may
	// take.
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	if err := e.warm(ctx, v); err != nil {
		e.cfg.Log.Warn("cannot pre-warm min_instances", "function", f.name, "version", v.rec.ID, "error", err)
	}
}

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
	for _, fv := range e.current() {
		v := fv.v
		if !v.loaded.Load() || v.policy.idleTTL <= 0 {
			continue
		}
		var closing []*instance
		v.mu.Lock()
		// idle is a stack: the least recently used instances are at the bottom.
		for len(v.idle) > 0 && v.live > v.policy.min && now.Sub(v.idle[0].lastUsed) >= v.policy.idleTTL {
			closing = append(closing, v.idle[0])
			v.idle = v.idle[1:]
			v.live--
		}
		zero := v.live == 0 && v.refs == 0 && v.policy.min == 0 && now.Sub(v.lastUsed) >= v.policy.idleTTL
		v.mu.Unlock()
		for _, in := range closing {
			in.inst.Close()
		}
		if len(closing) > 0 {
			e.cfg.Log.Info("released idle instances", "function", fv.f.name, "count", len(closing), "idle_ttl", v.policy.idleTTL)
		}
		if zero && e.unload(fv.f, v) {
			e.cfg.Log.Info("scaled to zero", "function", fv.f.name, "version", v.rec.ID, "idle_ttl", v.policy.idleTTL)
		}
	}
}

type funcVersion struct {
	f *function
	v *version
}

func (e *Engine) current() []funcVersion {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]funcVersion, 0, len(e.funcs))
	for _, f := range e.funcs {
		if f.cur != nil {
			out = append(out, funcVersion{f, f.cur})
		}
	}
	return out
}
