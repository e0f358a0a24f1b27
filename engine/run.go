package engine

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/errdefs"
)

// take returns an idle instance (Hot), or creates one: Warm on a program
// already loaded, Cold when the program had to be loaded. An idle
// instance on prefer (the device the request's body landed on; nil: any)
// goes first, the most recently used of them.
func (p *pool) take(ctx context.Context, deadline time.Time, prefer device.Device) (*instance, call.Start, error) {
	if in := p.takeIdle(prefer); in != nil {
		h := held{p, in}
		defer h.drop()
		if err := in.dev.dev.Health(); err != nil {
			return nil, call.Hot, unavailable(err, "device %s is unhealthy", in.dev.dev.Name())
		}
		h.in = nil
		return in, call.Hot, nil
	}
	lctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	return p.e.newInstance(lctx, p.v)
}

// takeRetrying is take, once more when the program was lost, as it loaded
// or made the instance, with its tenant's shared worker by another
// function's fault (Collateral): the load did nothing wrong, and the next
// goes into a fresh worker. The loss is logged, not counted as a crash.
// spent says it took the request's one retry for a collateral loss: a
// collateral loss of its run is not retried again (runRetrying), so that a
// sibling that keeps crashing the worker costs a request one more load at
// most.
func (p *pool) takeRetrying(ctx context.Context, deadline time.Time, prefer device.Device) (in *instance, fresh call.Start, spent bool, err error) {
	in, fresh, err = p.take(ctx, deadline, prefer)
	if err == nil || !collateral(err) {
		return in, fresh, false, err
	}
	p.v.runFailed(nil, err) // a loss from the load not yet logged is, here
	in, fresh, err = p.take(ctx, deadline, prefer)
	return in, fresh, true, err
}

// job is what one request runs: the chain, its sizes and its graph key.
type job struct {
	steps          []device.Step
	outLen, tmpLen int64
	key            uint64
}

// run runs req on an instance once a slot admits it, t0 being when the
// request reached the engine. ran reports that it reached an instance's
// run (well or not), so that its start counts.
func (p *pool) run(ctx context.Context, req *call.Request, deadline, t0 time.Time) (ran bool, err error) {
	v, m := p.v, p.v.manifest
	j := job{steps: v.steps, outLen: m.OutBytes, tmpLen: m.TmpBytes, key: 1}
	if !m.Graphs() {
		j.key = 0 // "graph": false: the entries run on every request
	}
	if req.Override != nil {
		if j.outLen, j.tmpLen, err = v.override(req.Override); err != nil {
			return false, endUnqueued(req, t0, err)
		}
		j.key = 0
	}
	tq := time.Now()
	req.Timing.Resolve = tq.Sub(t0) - req.Timing.Prep
	waited, err := p.acquire(ctx, deadline, req.Gone)
	if err != nil {
		// Its deadline passed or its client left while it waited.
		req.Timing.EndIn(&req.Timing.Queue, time.Since(t0))
		return false, err
	}
	defer p.release()
	ta := tq // taken at once, the common case: no second clock read
	if waited {
		ta = time.Now()
	}
	req.Timing.Queue = ta.Sub(tq)
	landed := slotOf(req.Landing) // where the body was read, if a device lent it
	var prefer device.Device
	if landed != nil {
		prefer = landed.Device()
	}
	in, fresh, spent, err := p.takeRetrying(ctx, deadline, prefer)
	if err != nil {
		// An instance's load that failed or outlasted the deadline.
		req.Timing.EndIn(&req.Timing.Load, time.Since(t0))
		return false, v.runFailed(nil, err)
	}
	h := held{p, in}
	defer h.drop()
	tr := p.started(req, in, fresh, ta)
	req.Device = in.dev.name
	if !tr.Before(deadline) {
		h.in = nil
		p.put(in, false, tr)
		req.Timing.End(tr.Sub(t0))
		return false, errorf(errdefs.KindTimeout, nil, "function %s: the request's deadline passed before it ran (queue %v, load %v)", v.fn.name, req.Timing.Queue, req.Timing.Load)
	}
	if p.foreign(landed, in) {
		h.in = nil
		now := time.Now()
		p.put(in, false, now)
		req.Timing.End(now.Sub(t0))
		return false, LandedElsewhere(v.fn.name)
	}
	landed = output(req, in, landed, j.outLen)
	h.in = nil // runRetrying's now
	in, r, tEnd, err := p.runRetrying(ctx, req, in, landed, prefer, j, tr, deadline, spent)
	if r == nil {
		// A chain not found on its device, or a dead worker not
		// replaced in time: after the queue and load, as Dispatch's
		// retries are.
		req.Timing.End(time.Since(t0))
		return false, err
	}
	if err == nil {
		req.Output = req.Output[:r.OutLen]
	}
	req.Copied += r.Timing.Copied
	req.Timing.CopyIn, req.Timing.Kernels, req.Timing.CopyOut = r.Timing.CopyIn, r.Timing.Kernels, r.Timing.CopyOut
	req.Timing.Handoff, req.Timing.Handback = r.Timing.Handoff, r.Timing.Handback
	broken := err != nil && (errors.Is(err, device.ErrUnhealthy) || in.dev.dead.Load() || programLost(err))
	p.put(in, broken, tEnd)
	req.Timing.End(tEnd.Sub(t0))
	if err != nil {
		return true, v.runFailed(in.dev, err)
	}
	p.succeeded()
	return true, nil
}

// endUnqueued ends the timing of req, refused before it queued by its
// version's checks of it, t0 being when it reached the engine: its time is
// its resolve (and a cold request's fetch). It returns err. It lives
// here, below invoke.go and batch.go, which call it too: the engine's
// files call downwards only.
func endUnqueued(req *call.Request, t0 time.Time, err error) error {
	req.Timing.EndIn(&req.Timing.Resolve, time.Since(t0))
	return err
}

// held is an instance a request took and has neither put back nor handed
// to runOn (which closes it if its run panics). A panic on the way there (a
// bug: the cold start's accounting, the output's placement, a chain's
// kernels looked up) would leak it, never put back nor closed and counted
// live for good: a deferred drop puts it back broken (closed).
type held struct {
	p  *pool
	in *instance
}

func (h *held) drop() {
	if h.in != nil {
		h.p.put(h.in, true, time.Now())
	}
}

// started counts how req found in (fresh) in its start and load time,
// from ta, the clock at its admission, and returns the clock when it may
// run: a hot request reads the clock once between queue and run.
func (p *pool) started(req *call.Request, in *instance, fresh call.Start, ta time.Time) time.Time {
	if fresh == call.Hot {
		return ta
	}
	if req.Start < fresh {
		req.Start = fresh
	}
	tr := time.Now()
	req.Timing.Load += tr.Sub(ta)
	if fresh == call.Cold {
		req.Timing.Program = p.e.coldStarted(p.v.fn, p.v, in, req.Timing.Load)
	}
	return tr
}

// output points req.Output at outLen bytes where in's run writes them:
// landed's output when the body landed on in's device (returned: the run
// reads the body there), else ordinary memory, copied (nil returned).
func output(req *call.Request, in *instance, landed device.Slot, outLen int64) device.Slot {
	if landsOn(landed, in) && int64(len(landed.Output())) >= outLen {
		// The body is where this instance's device reads it: the output
		// lands there too, and the response is written from it.
		req.Output = landed.Output()[:outLen]
		return landed
	}
	if int64(cap(req.Output)) < outLen || req.Landing != nil && overlaps(req.Output, req.Landing.Output()) {
		req.Output = make([]byte, outLen)
	}
	req.Output = req.Output[:outLen]
	return nil
}

// ownedSlot is a slot one program lent (a worker's: its process maps the
// memory).
type ownedSlot interface{ Owner() device.Program }

// landsOn reports whether in's run works on landed in place: a slot of
// in's device, and of in's own program when a program lent it. Another
// program's slot may be mapped by another process (a tenant's worker,
// after a redeploy by another token between the body and the run): the
// output must not be written where that process can read it.
func landsOn(landed device.Slot, in *instance) bool {
	if landed == nil || in.dev.dev != landed.Device() {
		return false
	}
	o, ok := landed.(ownedSlot)
	return !ok || o.Owner() == in.dev.prog
}

// LandedElsewhere is the error of a request to function name whose body
// landed in a slot of a program that does not run the version it came
// to (foreign): for the engine's pools, and for a batching function or a
// pipeline, which Land lends nothing, so that a landed body was lent by
// what the name was before.
func LandedElsewhere(name string) error {
	return errorf(errdefs.KindUnavailable, call.ErrLandedElsewhere, "function %s: the worker this request's body was read into was replaced (it crashed) or redeployed meanwhile, and does not run this version: it may have changed the body; retry", name)
}

// foreign reports whether the body landed in a slot lent by a program
// that is not one of this version's now, mapped by a process other than
// in's: one a crash ended since the body was read (Land's reference
// keeps the version from being unloaded or evicted meanwhile), or
// another version's (a landing run on a version other than the one Land
// lent it for, which Invoke and PinLanding do not do: a caller's own). That process can have read and rewritten the body (before
// its end too, if it ended); copying it out now would not undo that, so
// the request fails (503: a retry lands in a slot of this version's). A
// slot of the very process in runs in (a tenant's worker that reloaded
// the version) is not foreign: that process can rewrite the input as it
// runs anyway. Where the owner was this version's before a crash or an
// idle unload, the refusal is needless but rare (the body's read and
// the run straddle the end), and nothing here can tell it from another
// version's.
func (p *pool) foreign(landed device.Slot, in *instance) bool {
	o, ok := landed.(ownedSlot)
	if !ok || o.Owner() == in.dev.prog {
		return false
	}
	owner := o.Owner()
	// A program in a worker process; compared by the process itself, as
	// the owner's may be dead and its pid the running worker's now.
	type worker interface{ SameProcess(device.Program) bool }
	if r, ok := in.dev.prog.(worker); ok && r.SameProcess(owner) {
		return false
	}
	for _, pl := range p.programs() {
		if pl.prog == owner {
			return false
		}
	}
	return true
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

// runRetrying runs j for req on in, from tr (the clock before it), and once
// more on a fresh instance if in's worker had died while it was idle (the
// run reached no bundle code) or was lost with its tenant's shared worker
// by another function's fault (Collateral), unless that is a collateral
// loss and the request had its one retry for one already (spent: its
// load's). It returns the instance that ran last with
// its run and the clock at the run's end, for the caller to put back; a
// nil run: it ran nowhere, and err is the request's (the instance is put
// back already).
func (p *pool) runRetrying(ctx context.Context, req *call.Request, in *instance, landed device.Slot, prefer device.Device, j job, tr, deadline time.Time, spent bool) (*instance, *device.Run, time.Time, error) {
	v, m := p.v, p.v.manifest
	h := held{p, in}
	defer h.drop()
	for retried := false; ; retried = true {
		var err error
		if req.Override != nil && req.Override.Chain != nil {
			if j.steps, err = v.resolveChain(ctx, in.dev, req.Override, deadline); err != nil {
				// A worker that was dead before the lookup, or that the
				// server stopped (an earlier chain past its deadline, its
				// memory limit, a message out of turn), fails here before
				// anything ran: retried once below like a run refused for
				// it. So is one lost with its tenant's shared worker
				// (Collateral). One the lookup itself crashed (a bundle's
				// IFUNC resolver runs in it) is not.
				if retried || !(mayRunAgain(err) || stoppedByServer(err)) || spent && collateral(err) {
					h.in = nil
					p.put(in, programLost(err), time.Now())
					return nil, nil, time.Time{}, v.runFailed(in.dev, err)
				}
			} else {
				// The lookup may have waited (a tenant's worker's, behind
				// a sibling's load): the run is admitted, billed and
				// timed from now, not from before it, whose wait its
				// device time would otherwise be charged with.
				tr = time.Now()
			}
		}
		r := &in.run
		if err == nil {
			r.Input, r.Output, r.Chain, r.TmpLen, r.ZeroTmp, r.ZeroOut, r.ChainKey, r.Deadline = req.Input, req.Output, j.steps, j.tmpLen, m.ZeroTmp, m.ZeroesOut(), j.key, deadline
			r.Slot = nil
			if landsOn(landed, in) {
				r.Slot = landed
			}
			var wait time.Duration
			var tEnd time.Time
			h.in = nil
			wait, tEnd, err = p.runOn(ctx, in, r, tr, deadline, req.Gone, nil)
			req.Timing.Sched += wait
			if err == nil || retried || !mayRunAgain(err) || spent && collateral(err) {
				r.Input, r.Output, r.Slot = nil, nil, nil
				return in, r, tEnd, err
			}
		}
		r.Input, r.Output, r.Slot = nil, nil, nil
		h.in = nil
		next, fresh, now, err := p.replace(ctx, in, err, deadline, prefer)
		if err != nil {
			return nil, nil, time.Time{}, err
		}
		if next == nil {
			return nil, nil, time.Time{}, errorf(errdefs.KindTimeout, nil, "function %s: the request's deadline passed before it ran (its worker had died)", v.fn.name)
		}
		in, h.in = next, next
		if req.Start < fresh {
			req.Start = fresh
		}
		tr = time.Now()
		req.Timing.Load += tr.Sub(now) // a fresh worker's load; the run that found the dead one is Dispatch's
	}
}

// replace puts back in, whose worker had died while it was idle (err says
// how: the run reached no bundle code) or was lost with its tenant's
// worker, counts the death (workerDied: not a collateral one), and takes
// another instance for the run to go once more, reading the clock (now)
// before it takes. With the version now backing off, or a failed take,
// it returns the request's error; with deadline passed, no instance and
// no error (the caller says whose deadline it was).
func (p *pool) replace(ctx context.Context, in *instance, err error, deadline time.Time, prefer device.Device) (*instance, call.Start, time.Time, error) {
	p.put(in, true, time.Now())
	p.v.workerDied(in.dev, lossOf(err))
	now := time.Now()
	if err := p.backingOff(now); err != nil {
		return nil, call.Hot, now, err
	}
	if !now.Before(deadline) {
		return nil, call.Hot, now, nil
	}
	next, fresh, err := p.take(ctx, deadline, prefer)
	if err != nil {
		return nil, fresh, now, p.v.runFailed(nil, err)
	}
	return next, fresh, now, nil
}

// runOn runs r on in once the device's scheduler admits it: the one path
// by which a chain reaches a device. start is the caller's clock reading
// just before; it returns how long the run waited for admission and the
// clock at the run's end (a hot request reads the clock once per phase).
// A run not admitted fails with an *Error. gone is polled while the run
// waits for admission; admitted (nil: none) is set once it has it.
//
// A run that panics (a bug in a device's Go code) goes on up, to the
// transport that recovers it (a 500, gRPC's Internal: httpapi's and
// grpcapi's recover.go; a batched run's through its requests,
// errdefs.Panic), but first gives back what it held: its slot on
// the device's scheduler, not held to its deadline, minutes on; and its
// instance, closed (its memory freed, its worker told to drop it), not
// put back idle, since what the run left in it is unknown. The caller
// then has no instance to put back.
func (p *pool) runOn(ctx context.Context, in *instance, r *device.Run, start, deadline time.Time, gone func() bool, admitted *atomic.Bool) (time.Duration, time.Time, error) {
	// r is the instance's, reused: a run the scheduler refuses must not
	// hand its request the last run's parts and bytes.
	r.Timing = device.Timing{}
	ended := false
	defer func() {
		if !ended {
			p.put(in, true, time.Now())
		}
	}()
	fl := in.dev.flow
	if fl == nil {
		if admitted != nil {
			admitted.Store(true)
		}
		err := in.inst.Run(r)
		ended = true
		return 0, time.Now(), err
	}
	tk, wait, err := fl.AdmitAt(ctx, start, deadline, gone)
	if err != nil {
		ended = true
		return wait, time.Now(), notAdmitted(p.v.fn, in.dev.dev, err)
	}
	defer func() {
		if !ended {
			tk.Done()
		}
	}()
	if admitted != nil {
		admitted.Store(true)
	}
	err = in.inst.Run(r)
	end := time.Now()
	ended = true
	tk.DoneUsed(end, r.Timing.Busy)
	return wait, end, err
}
