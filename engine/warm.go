package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/errdefs"
)

func (e *Engine) load(ctx context.Context, v *version) error {
	v.loadMu.Lock()
	defer v.loadMu.Unlock()
	if v.loaded.Load() {
		return nil
	}
	if v.loadErr != nil {
		return v.loadErr
	}
	t0 := time.Now()
	dir, m, fetched, err := e.cfg.Cache.Get(ctx, e.cfg.Store, v.rec.SHA256)
	if err != nil {
		var fe *bundle.FetchError
		var be *bundle.Error
		switch {
		case errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT):
			// Writing the bundle into the cache failed: the store is fine,
			// and the disk to free is this node's.
			return errorf(errdefs.KindNoSpace, err, "function %s: cold start: this node's disk is full: no room for bundle %s in its bundle cache %s (%v)", v.fn.name, v.rec.SHA256[:12], e.cfg.Cache.Dir(), err)
		case errors.As(err, &fe):
			return unavailable(err, "function %s: cannot fetch bundle %s from the store", v.fn.name, v.rec.SHA256[:12])
		case errors.As(err, &be): // the bundle itself is refused: that will not change
			v.loadErr = errorf(errdefs.KindInvalid, err, "function %s version %s: %s", v.fn.name, v.rec.ID, be.Error())
			return v.loadErr
		default: // local trouble (disk full, a race with eviction): try again later
			e.cfg.Log.Error("cannot prepare bundle", "function", v.fn.name, "sha256", v.rec.SHA256[:12], "error", err)
			return errorf(errdefs.KindUnavailable, err, "function %s: cannot prepare its bundle on this node; see the server log", v.fn.name)
		}
	}
	v.policy = e.policyFor(m)
	if m.Constants != "" {
		fi, err := os.Stat(filepath.Join(dir, m.Constants))
		if err != nil {
			e.cfg.Cache.Release(v.rec.SHA256)
			return errorf(errdefs.KindInternal, err, "function %s: constants", v.fn.name)
		}
		v.constSize = fi.Size()
	}
	v.dir, v.manifest, v.steps, v.unpin = dir, m, manifestSteps(m), func() { e.cfg.Cache.Release(v.rec.SHA256) }
	var freed slotWaiter
	if m.Batch != nil {
		v.batch = newBatcher(e, v)
		freed = v.batch
	}
	v.pool.open(e, v.policy.max, freed, time.Now())
	v.prepMs, v.fetched = ms(time.Since(t0)), fetched // before loaded: place reads them then
	v.loaded.Store(true)
	return nil
}

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
	if v == nil || v.rec.IsPipeline() || (v.rec.MinInstances == 0 && e.cfg.MinInstances == 0) || !v.pool.ref() {
		return
	}
	defer v.pool.unref()
	// A pre-warm runs the bundle's constructors: one that hangs must not
	// hold a deploy (or a server's start) for longer than a request may
	// take.
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	if err := e.warm(ctx, v); err != nil {
		e.cfg.Log.Warn("cannot pre-warm min_instances", "function", f.name, "version", v.rec.ID, "error", err)
	}
}
