package runtime

import (
	"context"
	"fmt"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/cuda"
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

// unload replaces v, if still current, by an unloaded copy of the same
// version and retires v: its constants and library go once in-flight
// requests end. The next request is a cold start.
func (e *Engine) unload(f *function, v *version) bool {
	e.mu.Lock()
	if f.cur != v {
		e.mu.Unlock()
		return false
	}
	f.cur = e.newVersion(f, v.rec)
	e.mu.Unlock()
	v.retire()
	return true
}

// reserve makes need bytes free on dev, evicting least recently used idle
// instances first and then unloading least recently used functions with no
// instance and no request. Memory of busy instances is never taken, and
// nothing is evicted when everything evictable would still not be enough.
// Callers hold e.memMu.
func (e *Engine) reserve(dev cuda.Device, need int64, forV *version) error {
	mi := dev.MemInfo()
	mi.Free -= e.pending[dev]
	if mi.Free >= need {
		return nil
	}
	if mi.Free+e.reclaimable(dev, forV) < need {
		return errorf(KindUnavailable, nil, "function %s needs %d bytes on %s, %d are free of %d, and idle functions hold too little to make up the rest",
			forV.fn.name, need, dev.Name(), mi.Free, mi.Total)
	}
	for {
		mi := dev.MemInfo()
		mi.Free -= e.pending[dev]
		if mi.Free >= need {
			return nil
		}
		if found, freed := e.evictIdleInstance(dev); found {
			if freed {
				e.evictions.instances.Add(1)
			}
			continue
		}
		if fv, ok := e.idleFunction(dev, forV); ok && e.unload(fv.f, fv.v) {
			e.evictions.functions.Add(1)
			e.cfg.Log.Info("evicted idle function", "function", fv.f.name, "device", dev.Name(), "needed_bytes", need, "free_bytes", mi.Free)
			continue
		}
		return errorf(KindUnavailable, nil, "function %s needs %d bytes on %s, %d are free of %d; everything else is in use",
			forV.fn.name, need, dev.Name(), mi.Free, mi.Total)
	}
}

// reclaimable is what evicting every idle instance (above min_instances)
// and then every function left without instances would free on dev.
func (e *Engine) reclaimable(dev cuda.Device, forV *version) int64 {
	var n int64
	for _, fv := range e.current() {
		v := fv.v
		if !v.loaded.Load() {
			continue
		}
		v.mu.Lock()
		spare := v.live - v.policy.min
		for _, in := range v.idle {
			if spare > 0 && in.dev.dev == dev {
				n += in.bytes
				spare--
			}
		}
		if v != forV && v.policy.min == 0 && v.refs == 0 && len(v.idle) == v.live {
			for _, p := range v.placements {
				if p.dev == dev {
					n += p.prog.ConstantsBytes()
				}
			}
		}
		v.mu.Unlock()
	}
	return n
}

// evictIdleInstance closes the least recently used idle instance on dev.
// found is false when there is none; freed is false when the pool changed
// under it (look again).
func (e *Engine) evictIdleInstance(dev cuda.Device) (found, freed bool) {
	var victim *version
	var at int
	var oldest time.Time
	for _, fv := range e.current() {
		v := fv.v
		if !v.loaded.Load() { // policy is written by load
			continue
		}
		v.mu.Lock()
		if v.live <= v.policy.min {
			v.mu.Unlock()
			continue // min_instances hold even under memory pressure
		}
		for i, in := range v.idle {
			if in.dev.dev == dev && (victim == nil || in.lastUsed.Before(oldest)) {
				victim, at, oldest = v, i, in.lastUsed
			}
		}
		v.mu.Unlock()
	}
	if victim == nil {
		return false, false
	}
	victim.mu.Lock()
	if at >= len(victim.idle) || victim.idle[at].lastUsed != oldest {
		victim.mu.Unlock()
		return true, false
	}
	in := victim.idle[at]
	victim.idle = append(victim.idle[:at], victim.idle[at+1:]...)
	victim.live--
	victim.mu.Unlock()
	in.inst.Close()
	return true, true
}

// idleFunction finds the least recently used loaded function, other than
// except, with constants on dev (so unloading it frees something), no
// instance and no request in flight.
func (e *Engine) idleFunction(dev cuda.Device, except *version) (funcVersion, bool) {
	var best funcVersion
	var oldest time.Time
	for _, fv := range e.current() {
		v := fv.v
		if v == except || !v.loaded.Load() {
			continue
		}
		if p := v.placement(dev); p == nil || p.prog.ConstantsBytes() == 0 {
			continue
		}
		v.mu.Lock()
		idle, last := v.live == 0 && v.refs == 0, v.lastUsed
		v.mu.Unlock()
		if idle && (best.v == nil || last.Before(oldest)) {
			best, oldest = fv, last
		}
	}
	return best, best.v != nil
}
