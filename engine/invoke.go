package engine

import (
	"context"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/errdefs"
)

// Invoke runs one request on the current version of function name, or,
// for a body read into a slot Land lent for name, on the version it was
// lent for.
func (e *Engine) Invoke(ctx context.Context, name string, req *call.Request) error {
	t0 := time.Now()
	f, v, ok := e.landed(name, req.Landing)
	if !ok {
		var err error
		if f, v, err = e.tab.resolve(ctx, name, req.Deadline); err != nil {
			return err
		}
	}
	defer v.pool.unref()
	return e.invoke(ctx, f, v, req, t0, e.tab.deadline(req.Deadline, t0))
}

// Land lends memory to read a request's body into for name's current
// version: a slot of a program of it that lends them (a worker's shared
// memory, where its device reads), on the device a request would find an
// idle instance on, else the first. Nil when there is none now: not loaded
// on this node, a batching function (its runs gather several requests), a
// pipeline, a device that does not lend, a pool at its bound, or a slot
// to make while its worker's control channel stays busy; the body then
// goes to ordinary memory and is copied. It reads no store, and a new
// slot waits for its worker's channel 200 ms at most (worker's Lend),
// which spares a request a wait, before its body is read, behind an
// instance's init or a sibling's load. The caller releases what it gets
// once the response is written.
//
// The landing holds the version it was lent for until its release, and
// the request whose body it holds runs on that version (Invoke,
// PinLanding), whatever deploys land while the body is read: as a
// request in flight finishes on the version it started on, a redeploy
// costs a request whose body was on its way nothing (before, its run
// met a slot of another version's worker and answered 503).
func (e *Engine) Land(name string) call.Landing {
	f, v := e.tab.peek(name)
	if v == nil || !v.loaded.Load() || v.batch != nil || v.rec.Kind != "" {
		return nil
	}
	prog := v.pool.lender() // a reference on v with it
	if prog == nil {
		return nil
	}
	handed := false
	defer func() {
		if !handed { // none lent, or Lend panicked (a bug its caller recovers)
			v.pool.unref()
		}
	}()
	l, ok := prog.(device.Lender)
	if !ok {
		return nil
	}
	s, ok := l.Lend(v.manifest.MaxInputBytes, v.manifest.OutBytes)
	if !ok {
		return nil
	}
	handed = true
	return &landing{Slot: s, e: e, f: f, v: v}
}

// PinLanding pins the version a request's body landed for: l is the
// request's landing, which Land lent for name. False when l is nil or not
// such a landing (pin name as usual). A successful pin is released as
// Pin's are.
func (e *Engine) PinLanding(name string, l call.Landing) (Pin, bool) {
	f, v, ok := e.landed(name, l)
	if !ok {
		return Pin{}, false
	}
	return Pin{e, f, v}, true
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
	t0 := time.Now()
	return p.e.invoke(ctx, p.f, p.v, req, t0, p.e.tab.deadline(req.Deadline, t0))
}

// InvokeSince is Invoke for a request that reached the server at t0
// (before its version was resolved): its default deadline and its total
// time count from then, as Engine.Invoke's do.
func (p Pin) InvokeSince(ctx context.Context, req *call.Request, t0 time.Time) error {
	return p.e.invoke(ctx, p.f, p.v, req, t0, p.e.tab.deadline(req.Deadline, t0))
}

// Release ends the pin.
func (p Pin) Release() { p.v.pool.unref() }

// Unready is the error a request to the pinned version would fail with
// now before it ran, for what only a redeploy or time mends: its bundle
// or library refused, or its crashes' back-off; nil when a request may
// run (a version not loaded yet is loaded by its first request). It waits
// for nothing: a model's readiness (the Open Inference Protocol's
// ModelReady, /v2/models/NAME/ready) asks it.
func (p Pin) Unready(now time.Time) error { return p.v.unready(now) }

// unready is Pin.Unready for v.
func (v *version) unready(now time.Time) error {
	if rf := v.refused.Load(); rf != nil {
		return rf
	}
	return v.pool.backingOff(now)
}

// invoke runs req on v, a version of f the caller holds a reference on,
// until deadline (never zero: the entry points applied the default); t0
// is when the request reached the engine. It resolves what runs (the
// version loaded if cold, its input checked), and its batcher or its run
// pool runs it.
func (e *Engine) invoke(ctx context.Context, f *function, v *version, req *call.Request, t0, deadline time.Time) (err error) {
	// Counted when it ends (stats): Total is its time once it succeeded. A
	// panic on the way (a device's or a store's Go bug) goes on up to the
	// transport, which answers it 500: counted as that, not as the success
	// its nil err would read as.
	returned := false
	e.stop.inFlight.Add(1)
	defer func() {
		if !returned {
			err = errdefs.ErrPanicked
		}
		f.stats.ended(err, req.Timing.Total)
		e.stop.ended(err)
	}()
	err = e.invokeOn(ctx, f, v, req, t0, deadline)
	returned = true
	return err
}

// invokeOn is invoke's work, counted by invoke.
func (e *Engine) invokeOn(ctx context.Context, f *function, v *version, req *call.Request, t0, deadline time.Time) (err error) {
	if err := v.pool.backingOff(t0); err != nil {
		return err
	}
	if v.rec.Kind != "" { // a pipeline's version has nothing to run here
		return errorf(errdefs.KindInvalid, nil, "%s is a pipeline: its steps run through package pipeline, not as a function", f.name)
	}
	req.Start = call.Hot
	req.Version = v.rec.ID
	req.Timing = call.Timing{}
	req.Reached = t0
	req.Copied = 0
	req.BatchSize = 0
	req.Device = ""
	if !v.loaded.Load() {
		tl := time.Now()
		// The request's deadline bounds the fetch and load too.
		lctx, cancel := context.WithDeadline(ctx, deadline)
		err := e.load(lctx, v)
		cancel()
		tn := time.Now()
		req.Timing.Load = tn.Sub(tl)
		req.Timing.Prep = req.Timing.Load
		if err != nil {
			// A fetch that failed or outlasted the deadline is the
			// request's time all the same.
			req.Timing.EndIn(&req.Timing.Resolve, tn.Sub(t0))
			return err
		}
		req.Start = call.Cold
	}
	if rf := v.refused.Load(); rf != nil {
		return endUnqueued(req, t0, rf)
	}
	if limit := v.manifest.MaxInputBytes; int64(len(req.Input)) > limit {
		return endUnqueued(req, t0, errorf(errdefs.KindTooLarge, nil, "input is %d bytes; function %s accepts at most %d (max_input_bytes)", len(req.Input), f.name, limit))
	}
	var ran bool
	if v.batch != nil && req.Landing != nil {
		// Land lends a batching version nothing, and its landings run
		// on the version they were lent for: this body landed in a slot
		// lent otherwise (a pin of this version with a landing of
		// another's), whose process may have rewritten it (foreign).
		return endUnqueued(req, t0, LandedElsewhere(f.name))
	}
	if v.batch != nil {
		tq := time.Now()
		req.Timing.Resolve = tq.Sub(t0) - req.Timing.Prep
		err = v.batch.invoke(ctx, req, deadline, t0, tq)
		// Its batch reached an instance's run, well or not (a batch that
		// never did writes no size): its start counts as the unbatched
		// path's does.
		ran = req.BatchSize > 0
	} else {
		ran, err = v.pool.run(ctx, req, deadline, t0)
	}
	if ran {
		f.stats.count(req.Start)
	}
	return err
}
