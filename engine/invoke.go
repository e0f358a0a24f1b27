package engine

import (
	"context"
	"errors"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/errdefs"
)

// Invoke runs one request on the current version of function name.
func (e *Engine) Invoke(ctx context.Context, name string, req *call.Request) error {
	t0 := time.Now()
	f, v, err := e.tab.resolve(ctx, name)
	if err != nil {
		return err
	}
	defer v.unref()
	return e.invoke(ctx, f, v, req, t0)
}

// Full returns the error a request to name would get now for its
// function's full queue (max_queue: 429), or nil. A front door asks before
// it reads a request's body, so that a flood of large bodies for one
// function is turned away without its bytes. It reads no store and waits
// for nothing; a function not loaded on this node is never full.
func (e *Engine) Full(name string) error {
	e.tab.mu.Lock()
	var v *version
	if f := e.tab.funcs[name]; f != nil {
		v = f.cur
	}
	e.tab.mu.Unlock()
	if v == nil || !v.loaded.Load() || !v.full() { // loaded: full reads what load wrote
		return nil
	}
	return v.busy()
}

// Pin is a function's version resolved once and held for one call: a
// caller that reads the version (its tensors, its id) before running it
// runs that very version, whatever deploys happen meanwhile. A pinned
// version that a deploy replaced still serves the call, as any request in
// flight finishes on the version it started on.
type Pin struct {
	e *Engine
	f *function
	v *version
}

// Pin resolves name's current version, without loading it, and holds it
// until Release. Every successful Pin must be released.
func (e *Engine) Pin(ctx context.Context, name string) (Pin, error) {
	f, v, err := e.tab.resolve(ctx, name)
	if err != nil {
		return Pin{}, err
	}
	return Pin{e, f, v}, nil
}

// Version is the pinned version's record.
func (p Pin) Version() api.Version { return p.v.rec }

// Invoke runs one request on the pinned version.
func (p Pin) Invoke(ctx context.Context, req *call.Request) error {
	return p.e.invoke(ctx, p.f, p.v, req, time.Now())
}

// InvokeSince is Invoke for a request that reached the server at t0
// (before its version was resolved): its default deadline and its total
// time count from then, as Engine.Invoke's do.
func (p Pin) InvokeSince(ctx context.Context, req *call.Request, t0 time.Time) error {
	return p.e.invoke(ctx, p.f, p.v, req, t0)
}

// Release ends the pin.
func (p Pin) Release() { p.v.unref() }

// invoke runs req on v, a version of f the caller holds a reference on;
// t0 is when the request reached the engine.
func (e *Engine) invoke(ctx context.Context, f *function, v *version, req *call.Request, t0 time.Time) (err error) {
	deadline := req.Deadline
	if deadline.IsZero() {
		deadline = t0.Add(e.cfg.Timeout)
	}
	f.stats.requests.Add(1)
	defer func() {
		if err != nil {
			f.stats.errors.Add(1)
		}
	}()
	if b := v.backoffUntil.Load(); b != 0 && t0.UnixNano() < b {
		return v.backoffError(b)
	}
	if v.rec.Kind != "" { // a pipeline's version has nothing to run here
		return errorf(errdefs.KindInvalid, nil, "%s is a pipeline: its steps run through package pipeline, not as a function", f.name)
	}
	req.Start = call.Hot
	req.Version = v.rec.ID
	req.Timing = call.Timing{}
	req.BatchSize = 0
	req.Device = ""
	if !v.loaded.Load() {
		tl := time.Now()
		// The request's deadline bounds the fetch and load too.
		lctx, cancel := context.WithDeadline(ctx, deadline)
		err := e.load(lctx, v)
		cancel()
		if err != nil {
			return err
		}
		req.Start = call.Cold
		req.Timing.Load = time.Since(tl)
		req.Timing.Prep = req.Timing.Load
	}
	if rf := v.refused.Load(); rf != nil {
		return rf
	}
	m := v.manifest
	if int64(len(req.Input)) > m.MaxInputBytes {
		return errorf(errdefs.KindTooLarge, nil, "input is %d bytes; function %s accepts at most %d (max_input_bytes)", len(req.Input), f.name, m.MaxInputBytes)
	}
	if v.batch != nil {
		err := v.batch.invoke(ctx, req, deadline)
		req.Timing.Total = time.Since(t0)
		if req.BatchSize > 0 { // it ran, well or not: count its start as the unbatched path does
			f.stats.count(req.Start)
		}
		if err != nil {
			return err
		}
		f.stats.latencyNs.Add(int64(req.Timing.Total))
		return nil
	}
	steps, outLen, tmpLen, key := v.steps, m.OutBytes, m.TmpBytes, uint64(1)
	if !m.Graphs() {
		key = 0 // "graph": false: the entries run on every request
	}
	if req.Override != nil {
		if outLen, tmpLen, err = v.override(req.Override); err != nil {
			return err
		}
		key = 0
	}
	tq := time.Now()
	if err := v.acquire(ctx, deadline, req.Gone); err != nil {
		return err
	}
	defer v.release()
	ta := time.Now()
	req.Timing.Queue = ta.Sub(tq)
	in, fresh, err := e.take(ctx, v, deadline)
	if err != nil {
		return v.runFailed(nil, err)
	}
	tr := ta // a hot request reads the clock once between queue and run
	if fresh != call.Hot {
		if req.Start < fresh {
			req.Start = fresh
		}
		tr = time.Now()
		req.Timing.Load += tr.Sub(ta)
		if fresh == call.Cold {
			req.Timing.Program = e.coldStarted(f, v, in.dev, req.Timing.Load)
		}
	}
	req.Device = in.dev.name
	if !tr.Before(deadline) {
		v.put(in, false, tr)
		return errorf(errdefs.KindTimeout, nil, "function %s: the request's deadline passed before it ran (queue %v, load %v)", f.name, req.Timing.Queue, req.Timing.Load)
	}
	if int64(cap(req.Output)) < outLen {
		req.Output = make([]byte, outLen)
	}
	req.Output = req.Output[:outLen]
	var r *device.Run
	var tEnd time.Time // one reading: the run's end, the instance's last use and the total
	for retried := false; ; retried = true {
		err = nil
		if req.Override != nil && req.Override.Chain != nil {
			if steps, err = v.resolveChain(in.dev, req.Override.Chain); err != nil {
				// A worker that was dead before the lookup, or that the
				// server stopped (an earlier chain past its deadline, its
				// memory limit, a message out of turn), fails here before
				// anything ran: retried once below like a run refused for
				// it. One the lookup itself crashed (a bundle's IFUNC
				// resolver runs in it) is not.
				if retried || !(beforeRun(err) || stoppedByServer(err)) {
					v.put(in, processGone(err), time.Now())
					return v.runFailed(in.dev, err)
				}
			}
		}
		r = &in.run
		if err == nil {
			r.Input, r.Output, r.Chain, r.TmpLen, r.ZeroTmp, r.ZeroOut, r.ChainKey, r.Deadline = req.Input, req.Output, steps, tmpLen, m.ZeroTmp, m.ZeroesOut(), key, deadline
			var wait time.Duration
			wait, tEnd, err = e.runOn(ctx, f, in, r, tr, deadline, req.Gone)
			req.Timing.Sched += wait
			if err == nil || retried || !beforeRun(err) {
				break
			}
		}
		// The instance's worker had died while it was idle (a chain that
		// ran past an earlier deadline, a thread the bundle left behind):
		// this request ran nowhere, so it runs once more on a fresh worker.
		r.Input, r.Output = nil, nil
		v.put(in, true, time.Now())
		v.workerDied(in.dev, exitOf(err))
		now := time.Now()
		if b := v.backoffUntil.Load(); b != 0 && now.UnixNano() < b {
			return v.backoffError(b)
		}
		if !now.Before(deadline) {
			return errorf(errdefs.KindTimeout, nil, "function %s: the request's deadline passed before it ran (its worker had died)", f.name)
		}
		if in, fresh, err = e.take(ctx, v, deadline); err != nil {
			return v.runFailed(nil, err)
		}
		if req.Start < fresh {
			req.Start = fresh
		}
		tr = time.Now()
	}
	r.Input, r.Output = nil, nil
	if err == nil {
		req.Output = req.Output[:r.OutLen]
	}
	req.Timing.CopyIn, req.Timing.Kernels, req.Timing.CopyOut = r.Timing.CopyIn, r.Timing.Kernels, r.Timing.CopyOut
	broken := err != nil && (errors.Is(err, device.ErrUnhealthy) || in.dev.dead.Load() || processGone(err))
	v.put(in, broken, tEnd)
	req.Timing.Total = tEnd.Sub(t0)
	f.stats.count(req.Start)
	if err != nil {
		return v.runFailed(in.dev, err)
	}
	if v.crashCount.Load() > 0 { // the common case takes no lock
		v.succeeded()
	}
	f.stats.latencyNs.Add(int64(req.Timing.Total))
	return nil
}

// full reports a version whose next request would be refused now for its
// full queue (a batching one: its batch queue); busy is that refusal.
// full reports a version whose next request would be refused now for its
// full queue (version.busy).
func (v *version) full() bool {
	if v.batch != nil {
		return v.batch.full()
	}
	return len(v.slots) == cap(v.slots) && int(v.waiting.Load()) >= v.policy.queue
}
