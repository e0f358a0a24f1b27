package engine

import (
	"context"
	"fmt"
	"runtime/debug"
	"time"
)

// warm loads v and creates instances up to its min_instances.
func (e *Engine) warm(ctx context.Context, v *version) error {
	if err := e.load(ctx, v); err != nil {
		return err
	}
	for {
		n, retired := v.pool.instances()
		if n >= v.policy.min || retired {
			return nil
		}
		// Hold a slot like a request, so warming never takes the function
		// past max_instances; if requests hold them all, they are creating
		// the instances anyway.
		if !v.pool.trySlot() {
			return nil
		}
		in, _, err := e.newInstance(ctx, v)
		if err == nil {
			v.pool.put(in, false, time.Now())
		}
		v.pool.release()
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
	recs, err := e.tab.reg.List(ctx)
	if err != nil {
		return fmt.Errorf("prewarm: %w", err)
	}
	var firstErr error
	for _, rec := range recs {
		cv, err := rec.CurrentVersion()
		if err != nil || cv.IsPipeline() || (cv.MinInstances == 0 && e.cfg.MinInstances == 0) {
			continue
		}
		f, err := e.tab.lookup(ctx, rec.Name, time.Time{})
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
	v := e.tab.currentOf(f)
	if v == nil || v.rec.IsPipeline() || (v.rec.MinInstances == 0 && e.cfg.MinInstances == 0) {
		return
	}
	e.warmCurrent(ctx, f, v)
}

// warmAside pre-warms f (warmIfWanted) on a goroutine of its own, for a
// poll: a constructor may take up to the request timeout, and the poll
// meanwhile follows the other functions' changes (a delete among them).
// One at a time per function: the one under way warms again a version
// that landed meanwhile (the reaper tops up loaded versions only). A
// panic is logged, as a poll's is.
func (e *Engine) warmAside(ctx context.Context, f *function) {
	if _, busy := e.warmingAside.LoadOrStore(f, true); busy {
		return
	}
	go func() {
		defer func() {
			if v := recover(); v != nil {
				e.warmingAside.Delete(f)
				e.cfg.Log.Error("pre-warming a polled function panicked", "function", f.name, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			}
		}()
		for {
			v := e.tab.currentOf(f)
			e.warmIfWanted(ctx, f)
			// Given up before looking again: a poll that switches f now
			// either sees it free or is seen here.
			e.warmingAside.Delete(f)
			if e.tab.currentOf(f) == v || ctx.Err() != nil {
				return
			}
			if _, busy := e.warmingAside.LoadOrStore(f, true); busy {
				return
			}
		}
	}()
}

// warmCurrent brings v up to its min_instances while it is f's current
// version (a deploy landing meanwhile pre-warms the new one), and says why
// it could not (logged here). A pre-warm runs the bundle's constructors:
// one that hangs must not hold a deploy (or a server's start, or the
// reaper's top-up) for longer than a request may take.
func (e *Engine) warmCurrent(ctx context.Context, f *function, v *version) error {
	if !v.pool.ref() {
		return nil
	}
	defer v.pool.unref()
	if e.tab.currentOf(f) != v {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	err := e.warm(ctx, v)
	if err != nil {
		e.cfg.Log.Warn("cannot make the instances min_instances keeps", "function", f.name, "version", v.rec.ID, "error", err)
	}
	return err
}
