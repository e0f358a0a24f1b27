package engine

import (
	"context"
	"errors"
	"time"
	"unsafe"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/errdefs"
)

// Invoke runs one request on the current version of function name.
func (e *Engine) Invoke(ctx context.Context, name string, req *call.Request) error {
	t0 := time.Now()
	f, v, err := e.tab.resolve(ctx, name, req.Deadline)
	if err != nil {
		return err
	}
	defer v.unref()
	return e.invoke(ctx, f, v, req, t0)
}

// Land lends memory to read a request's body into for name's current
// version: a slot of a program of it that lends them (a worker's shared
// memory, where its device reads), on the device a request would find an
// idle instance on, else the first. Nil when there is none now: not loaded
// on this node, a batching function (its runs gather several requests), a
// pipeline, a device that does not lend, or a pool at its bound; the body
// then goes to ordinary memory and is copied. It reads no store and waits
// for nothing; the caller releases what it gets once the response is
// written.
func (e *Engine) Land(name string) call.Landing {
	_, v := e.tab.peek(name)
	if v == nil || !v.loaded.Load() || v.batch != nil || v.rec.Kind != "" {
		return nil
	}
	m := v.manifest
	v.mu.Lock()
	var prog device.Program
	if n := len(v.idle); n > 0 {
		prog = v.idle[n-1].dev.prog
	} else if len(v.placements) > 0 {
		prog = v.placements[0].prog
	}
	v.mu.Unlock()
	l, ok := prog.(device.Lender)
	if !ok {
		return nil
	}
	s, ok := l.Lend(m.MaxInputBytes, m.OutBytes)
	if !ok {
		return nil
	}
	return s
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
// until Release. Every successful Pin must be released. A store read it
// needs ends at deadline (the request's; zero: the engine's request
// timeout from now).
func (e *Engine) Pin(ctx context.Context, name string, deadline time.Time) (Pin, error) {
	f, v, err := e.tab.resolve(ctx, name, deadline)
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
			f.stats.failed(err)
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
	req.Copied = 0
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
		tq := time.Now()
		req.Timing.Resolve = tq.Sub(t0) - req.Timing.Prep
		err := v.batch.invoke(ctx, req, deadline, tq)
		req.Timing.End(time.Since(t0))
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
	req.Timing.Resolve = tq.Sub(t0) - req.Timing.Prep
	if err := v.acquire(ctx, deadline, req.Gone); err != nil {
		return err
	}
	defer v.release()
	ta := time.Now()
	req.Timing.Queue = ta.Sub(tq)
	var landed device.Slot // where the body was read, if a device lent it
	if req.Landing != nil {
		landed, _ = req.Landing.(device.Slot)
	}
	var prefer device.Device
	if landed != nil {
		prefer = landed.Device()
	}
	in, fresh, err := e.take(ctx, v, deadline, prefer)
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
			req.Timing.Program = e.coldStarted(f, v, in, req.Timing.Load)
		}
	}
	req.Device = in.dev.name
	if !tr.Before(deadline) {
		v.put(in, false, tr)
		return errorf(errdefs.KindTimeout, nil, "function %s: the request's deadline passed before it ran (queue %v, load %v)", f.name, req.Timing.Queue, req.Timing.Load)
	}
	if landed != nil && in.dev.dev == landed.Device() && int64(len(landed.Output())) >= outLen {
		// The body is where this instance's device reads it: the output
		// lands there too, and the response is written from it.
		req.Output = landed.Output()[:outLen]
	} else {
		landed = nil // ordinary memory, copied
		if int64(cap(req.Output)) < outLen || req.Landing != nil && overlaps(req.Output, req.Landing.Output()) {
			req.Output = make([]byte, outLen)
		}
		req.Output = req.Output[:outLen]
	}
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
					v.put(in, programLost(err), time.Now())
					return v.runFailed(in.dev, err)
				}
			}
		}
		r = &in.run
		if err == nil {
			r.Input, r.Output, r.Chain, r.TmpLen, r.ZeroTmp, r.ZeroOut, r.ChainKey, r.Deadline = req.Input, req.Output, steps, tmpLen, m.ZeroTmp, m.ZeroesOut(), key, deadline
			r.Slot = nil
			if landed != nil && in.dev.dev == landed.Device() {
				r.Slot = landed
			}
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
		r.Input, r.Output, r.Slot = nil, nil, nil
		v.put(in, true, time.Now())
		v.workerDied(in.dev, lossOf(err))
		now := time.Now()
		if b := v.backoffUntil.Load(); b != 0 && now.UnixNano() < b {
			return v.backoffError(b)
		}
		if !now.Before(deadline) {
			return errorf(errdefs.KindTimeout, nil, "function %s: the request's deadline passed before it ran (its worker had died)", f.name)
		}
		if in, fresh, err = e.take(ctx, v, deadline, prefer); err != nil {
			return v.runFailed(nil, err)
		}
		if req.Start < fresh {
			req.Start = fresh
		}
		tr = time.Now()
		req.Timing.Load += tr.Sub(now) // a fresh worker's load; the run that found the dead one is Dispatch's
	}
	r.Input, r.Output, r.Slot = nil, nil, nil
	if err == nil {
		req.Output = req.Output[:r.OutLen]
	}
	req.Copied += r.Timing.Copied
	req.Timing.CopyIn, req.Timing.Kernels, req.Timing.CopyOut = r.Timing.CopyIn, r.Timing.Kernels, r.Timing.CopyOut
	broken := err != nil && (errors.Is(err, device.ErrUnhealthy) || in.dev.dead.Load() || programLost(err))
	v.put(in, broken, tEnd)
	req.Timing.End(tEnd.Sub(t0))
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

// overlaps reports whether a and b share memory (an output buffer the
// caller passed that is a landing's own output: it must not be written as
// ordinary memory by another device's run).
func overlaps(a, b []byte) bool {
	if cap(a) == 0 || cap(b) == 0 {
		return false
	}
	a0, b0 := uintptr(unsafe.Pointer(unsafe.SliceData(a))), uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return a0 < b0+uintptr(cap(b)) && b0 < a0+uintptr(cap(a))
}
