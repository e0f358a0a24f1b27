// Package pipeline runs functions and pipelines by name: the one entry
// point the transports (HTTP, gRPC) call. A pipeline ("kind": "pipeline"
// in plover.json) is a list of steps, each a function or several run in
// parallel on the same input; each step runs through the engine's own
// request path (admission, the device scheduler, batching, deadlines) as
// any request does, and its output becomes the next step's input without
// leaving the server. Package pipedef, below this one, checks definitions
// at deploy.
package pipeline

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/apierr"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/ioshare"
)

// Engine is what pipelines need of the engine (engine.Engine).
type Engine interface {
	// Pin and PinVersion read the store within deadline (the request's;
	// zero: the engine's request timeout) when the name is new to the node.
	Pin(ctx context.Context, name string, deadline time.Time) (engine.Pin, error)
	PinVersion(ctx context.Context, name, ref string, deadline time.Time) (engine.Pin, error)
	Land(name string) call.Landing
	// PinLanding pins the version a request's body landed for when
	// landing is one Land lent for name (false: pin name).
	PinLanding(name string, landing call.Landing) (engine.Pin, bool)
	IO(name string) *ioshare.Flow
	// Deadline is d, or the engine's request timeout from start when d
	// is zero.
	Deadline(d, start time.Time) time.Time
	Refused(name string, status int)
	Names() []string
	Health() (bool, []api.DeviceHealth)
}

// Runner runs functions and pipelines; it is safe for concurrent use.
type Runner struct {
	e    Engine
	met  *metrics
	bufs sync.Pool // *[]byte: intermediate outputs
	mem  Memory    // nil: pipelines' outputs bounded by nothing (Bound)
}

// New returns a Runner over e, registering the per-step metrics on reg
// (nil: none).
func New(e Engine, reg prometheus.Registerer) *Runner {
	r := &Runner{e: e, met: newMetrics(reg)}
	r.bufs.New = func() any { return new([]byte) }
	return r
}

// Invoke runs name on req: a function's chain, or a pipeline's steps.
// req's deadline (the front door's: frontdoor.Door.Begin) bounds the
// name's store reads too.
func (r *Runner) Invoke(ctx context.Context, name string, req *call.Request) error {
	t0 := time.Now() // before the name is resolved, which may read the store
	if req.Deadline.IsZero() {
		// A caller that did not come through the door (a library
		// user): one deadline still covers every step.
		req.Deadline = r.e.Deadline(time.Time{}, t0)
	}
	// A body read into a slot Land lent runs on the version it was lent
	// for (a function's: Land lends a pipeline nothing), whatever deploys
	// landed since.
	p, ok := r.PinLanding(name, req.Landing)
	if !ok {
		var err error
		if p, err = r.Pin(ctx, name, req.Deadline); err != nil {
			return err
		}
	}
	// Deferred: a device's panic goes up to the transport through here,
	// and a pin kept would hold its version (its program, its device
	// memory) for the process's life.
	defer p.Release()
	return p.invoke(ctx, req, t0)
}

// Deadline is the engine's: d, or its request timeout from start when d
// is zero (frontdoor.Runner).
func (r *Runner) Deadline(d, start time.Time) time.Time { return r.e.Deadline(d, start) }

// Land is the engine's: memory to read a request's body into where the
// function's device reads it, or nil (a pipeline: its first step's input
// is its own request's).
func (r *Runner) Land(name string) call.Landing { return r.e.Land(name) }

// PinLanding pins the function version l, a landing Land lent for name,
// was lent for: the request whose body it holds runs there. False where l
// is nil, not such a landing, or released (pin name as usual).
func (r *Runner) PinLanding(name string, l call.Landing) (Pin, bool) {
	top, ok := r.e.PinLanding(name, l)
	if !ok {
		return Pin{}, false
	}
	return Pin{r: r, top: top}, true
}

// IO is the engine's: name's share of the server's I/O (a pipeline's own,
// for its request's body and answer), or nil for a name it has no record
// of.
func (r *Runner) IO(name string) *ioshare.Flow { return r.e.IO(name) }

// Refused is the engine's: a request the transport refused before Invoke,
// counted in name's requests and, by status, client errors or errors.
func (r *Runner) Refused(name string, status int) { r.e.Refused(name, status) }

// Names is the engine's: every function's name, for a did-you-mean.
func (r *Runner) Names() []string { return r.e.Names() }

// Health is the engine's.
func (r *Runner) Health() (bool, []api.DeviceHealth) { return r.e.Health() }

// Pin is a function, or a pipeline and every function it runs, resolved
// once and held for one call: the versions a caller reads (Version) are
// the versions that run, whatever deploys happen meanwhile.
type Pin struct {
	r    *Runner
	top  engine.Pin
	plan *plan // nil: a function
}

// Release ends the pin.
func (p Pin) Release() {
	if p.plan != nil {
		p.plan.release()
	}
	p.top.Release()
}

// Unready is the error a request would fail with now before it ran, for
// what only a redeploy or time mends (engine.Pin.Unready): the function's,
// or for a pipeline the first of its functions' that has one; nil when a
// request may run.
func (p Pin) Unready(now time.Time) error {
	if err := p.top.Unready(now); err != nil || p.plan == nil {
		return err
	}
	for _, fp := range p.plan.pins {
		if err := fp.Unready(now); err != nil {
			return err
		}
	}
	return nil
}

// Pipeline reports whether the pin is a pipeline's.
func (p Pin) Pipeline() bool { return p.plan != nil }

// Runs calls f with the name of every function and nested pipeline the
// pinned pipeline runs, once per version pinned (a name pinned at two
// versions comes twice), until f returns an error; for a function, it
// calls nothing.
func (p Pin) Runs(f func(name string) error) error {
	if p.plan == nil {
		return nil
	}
	for _, fp := range p.plan.pins {
		if err := f(fp.Name()); err != nil {
			return err
		}
	}
	return nil
}

// Version is the pinned version's record. A pipeline's input bound is its
// first step's (Admit's), its tensors are its first step's inputs and its
// last step's outputs (a parallel last step:
// each function's outputs in order); a side whose functions declare none,
// or whose names clash, is the raw bytes.
func (p Pin) Version() api.Version {
	v := p.top.Version()
	if p.plan == nil {
		return v
	}
	ts := abi.Tensors{Inputs: abi.RawTensors.Inputs, Outputs: abi.RawTensors.Outputs}
	if in := firstTensors(p.plan.stages); in != nil {
		ts.Inputs = in.Inputs
	}
	if outs, ok := lastOutputs(p.plan.stages); ok {
		ts.Outputs = outs
	}
	v.Tensors = &ts
	// Its input is its first step's: bound it as Admit does, so that a
	// transport refuses an input no step would take before laying it out.
	v.MaxInputBytes, _ = firstMaxInput(&p.plan.stages[0])
	return v
}

// Invoke runs the pinned function or pipeline on req. For a pipeline,
// req.Timing sums its steps' parts (Total is the whole request), req.Start
// is the coldest step's start, req.Version the pipeline's version and
// req.Steps each step's own; one deadline (req's, which the front door
// sets; zero: none of the pipeline's own, each step the engine's timeout)
// covers every step, and a request whose client left (req.Gone) stops
// before its next step.
func (p Pin) Invoke(ctx context.Context, req *call.Request) error {
	return p.invoke(ctx, req, time.Now())
}

// InvokeSince is Invoke for a request whose runner call began at t0, before
// the pin (Runner.Pin, which may read the store: for a pipeline, every
// step's record): its total time counts from then, as Runner.Invoke's
// does, and for a function so does its resolve.
func (p Pin) InvokeSince(ctx context.Context, req *call.Request, t0 time.Time) error {
	return p.invoke(ctx, req, t0)
}

func (p Pin) invoke(ctx context.Context, req *call.Request, t0 time.Time) error {
	req.Steps = req.Steps[:0]
	if p.plan == nil {
		return p.top.InvokeSince(ctx, req, t0)
	}
	if req.Override != nil {
		return &errdefs.Error{Kind: errdefs.KindBadRequest, Msg: fmt.Sprintf("%s is a pipeline: its steps run their own manifests' chains, so a request may not override chain, out_bytes or tmp_bytes", p.plan.name)}
	}
	if req.Landing != nil {
		// Land lends a pipeline nothing, and Invoke runs a body Land
		// lent on the function version it was lent for: this one landed
		// in a slot lent otherwise, whose worker may have rewritten it;
		// the steps' runs, given the input alone, could not tell.
		return engine.LandedElsewhere(p.plan.name)
	}
	x := run{r: p.r, pl: p.plan, deadline: req.Deadline, gone: req.Gone, t0: t0}
	req.Start, req.BatchSize, req.Version, req.Reached = call.Hot, 0, p.top.Version().ID, t0
	// A request refused room is counted as one that ran and failed; one
	// that panicked (a step's device bug, raised again here) as the 500 its
	// transport answers.
	counted := false
	defer func() {
		if !counted {
			p.top.Account(time.Since(t0), errdefs.ErrPanicked)
		}
	}()
	out := req.Output[:0]
	var waited time.Duration
	err := p.inputFits(len(req.Input))
	if err == nil {
		var release func()
		release, waited, err = x.hold(ctx, p.top)
		if err == nil {
			defer release()
			out, err = x.seq(ctx, p.plan.stages, req.Input, out, &req.Steps, true)
		}
	}
	req.Output = out
	req.Copied = x.copied.Load()
	t := call.Timing{Queue: waited} // for room in the node's Memory, as a step's for its slot
	for _, s := range req.Steps {
		t.Queue += s.Timing.Queue
		t.Load += s.Timing.Load
		t.CopyIn += s.Timing.CopyIn
		t.Kernels += s.Timing.Kernels
		t.CopyOut += s.Timing.CopyOut
		t.BatchWait += s.Timing.BatchWait
		t.Sched += s.Timing.Sched
		t.Resolve += s.Timing.Resolve
		t.Dispatch += s.Timing.Dispatch
		t.Handoff += s.Timing.Handoff
		t.Handback += s.Timing.Handback
		req.Start = max(req.Start, s.Start)
	}
	t.Total = time.Since(t0)
	req.Timing = t
	counted = true
	p.top.Account(t.Total, err)
	return err
}

// run is one pipeline request's walk.
type run struct {
	r        *Runner
	pl       *plan
	deadline time.Time // zero: none of the walk's own (each step's engine timeout)
	gone     func() bool
	t0       time.Time
	// ran is set once a step has run: a client is asked whether it left
	// only between steps, so a request whose first step fails or succeeds
	// is answered as a function's would be.
	ran atomic.Bool
	// failed is set by the first step that fails: the request is lost,
	// so parallel branches still running take no further step. cause is
	// that step's error (fail): a parallel step answers it, not the
	// failure of a branch listed before it that a step already running
	// made later.
	failed atomic.Bool
	cause  atomic.Pointer[error]
	// copied is the payload bytes the steps' runs copied on the host
	// (call.Request.Copied), and a parallel step's concatenation of its
	// branches' outputs: the request's, counted under the pipeline's name.
	copied atomic.Int64
	// own counts this request's steps in flight per pinned version, and
	// the ends of them, for its parallel branches (invoke); nil until a
	// parallel step.
	mu  sync.Mutex
	own map[engine.Pin]*inFlight
}

// stepGone is a step's request's Gone: its client left, or a parallel
// branch failed (a step still waiting in its function's queue or the
// scheduler's is given up; one running runs on).
func (x *run) stepGone() bool {
	return x.failed.Load() || (x.gone != nil && x.gone())
}

// fail marks the request lost by err, which is its cause where no step
// failed before it, and returns err.
func (x *run) fail(err error) error {
	if x.failed.CompareAndSwap(false, true) {
		x.cause.Store(&err)
	}
	return err
}

// errSibling is a branch stopped because another branch failed: never
// the request's answer while that failure is there to give.
var errSibling = errors.New("pipeline: a parallel branch failed")

// seq runs stages in order on in, the last writing into out (reusing its
// capacity); intermediate outputs go to pooled buffers, each read by the
// next stage in place. client says in is the request's own input.
func (x *run) seq(ctx context.Context, stages []stage, in, out []byte, steps *[]call.StepTiming, client bool) ([]byte, error) {
	var bufs [2]*[]byte
	defer func() {
		for _, b := range bufs {
			if b != nil {
				x.r.putBuf(b)
			}
		}
	}()
	cur := in
	for i := range stages {
		st := &stages[i]
		if err := x.before(st); err != nil {
			return out, err
		}
		last := i == len(stages)-1
		dst := out[:0]
		if last {
			// The output of the stage before the one before is not read
			// again: not held beside the answer (Pin.Holds counts a
			// stage's input and its own).
			if b := bufs[i%2]; b != nil {
				bufs[i%2] = nil
				x.r.putBuf(b)
			}
		} else {
			if bufs[i%2] == nil {
				bufs[i%2] = x.r.getBuf()
			} else if st.par != nil && cap(*bufs[i%2]) > keptBuf {
				// The output of the stage before the one before, which
				// fitting keeps where its size is the join's: a parallel
				// stage's join would hold it while the branches run, and
				// Pin.Holds counts the join only once they have ended
				// (stageHolds: 2*out). Dropped here, the join is made
				// whole after them (parallel), at every nesting, since a
				// branch is walked by seq too. Not counted instead: that
				// would count a join most stages never keep. The last
				// stage writes the caller's buffer, not this one (above);
				// one up to keptBuf is the pool's, as a fresh one is.
				*bufs[i%2] = nil
			}
			dst = fitting(bufs[i%2], st.out)
		}
		res, err := x.stage(ctx, st, cur, dst, steps, client && i == 0)
		if last {
			out = res
		} else {
			*bufs[i%2] = res // keep what it grew to
		}
		if err != nil {
			return out, err
		}
		cur = res
	}
	return out, nil
}

// before stops the walk between steps: for a client that left, or a
// deadline that passed (the engine would refuse the step anyway, but not
// say how far the pipeline got).
func (x *run) before(st *stage) error {
	if x.failed.Load() {
		return errSibling
	}
	if x.gone != nil && x.ran.Load() && x.gone() {
		return atStep(x.pl.name, st.index, st.label, &errdefs.Error{Kind: errdefs.KindGone, Msg: fmt.Sprintf("pipeline %s: the client went away before step %d (%s)", x.pl.name, st.index, st.label)})
	}
	if now := time.Now(); !x.deadline.IsZero() && !now.Before(x.deadline) {
		return atStep(x.pl.name, st.index, st.label, &errdefs.Error{Kind: errdefs.KindTimeout, Msg: fmt.Sprintf("pipeline %s: the request's deadline passed before step %d (%s), %v after it started", x.pl.name, st.index, st.label, now.Sub(x.t0).Round(time.Microsecond))})
	}
	return nil
}

// stage runs one stage on in, writing into dst; client says in is the
// request's own input.
func (x *run) stage(ctx context.Context, st *stage, in, dst []byte, steps *[]call.StepTiming, client bool) ([]byte, error) {
	if st.par == nil {
		return x.step(ctx, st, in, dst, steps, client)
	}
	return x.parallel(ctx, st, in, dst, steps, client)
}

// step runs a function's stage: one request of its own through the
// engine, its timing appended to steps.
func (x *run) step(ctx context.Context, st *stage, in, dst []byte, steps *[]call.StepTiming, client bool) ([]byte, error) {
	sub := call.Request{Input: in, Output: dst, Deadline: x.deadline, Gone: x.stepGone}
	start := time.Now()
	begin := start.Sub(x.t0)
	err := x.invoke(ctx, st.pin, &sub, start)
	if errdefs.KindOf(err) == errdefs.KindGone && x.failed.Load() && (x.gone == nil || !x.gone()) {
		// Given up in its queue for a sibling's failure: the request
		// is lost, and its answer waits for no step of this branch.
		return sub.Output, errSibling
	}
	if err != nil && !client {
		err = unfit(err)
	}
	x.ran.Store(true)
	x.copied.Add(sub.Copied)
	*steps = append(*steps, call.StepTiming{Step: st.label, Index: st.index, Version: sub.Version, Start: sub.Start, Timing: sub.Timing,
		BatchSize: sub.BatchSize, Device: sub.Device, Begin: begin})
	if errdefs.KindOf(err) != errdefs.KindGone {
		// A client that left while the step waited is the pipeline's
		// request's end (its 499, counted under its name), as one that
		// leaves between steps (before) is: no step failed.
		x.r.met.observe(x.pl.name, st.index, st.label, sub.Timing.Total, err)
	}
	if err != nil {
		return sub.Output, x.fail(stepError(x.pl.name, st.index, st.label, err))
	}
	return sub.Output, nil
}

// parallel runs a parallel stage: every branch reads in; the first runs
// here, the others on goroutines of their own. Outputs are concatenated
// in the listed order (the one copy a parallel step costs), and so are
// their timings.
func (x *run) parallel(ctx context.Context, st *stage, in, dst []byte, steps *[]call.StepTiming, client bool) ([]byte, error) {
	n := len(st.par)
	if x.own == nil { // before any branch's goroutine: read unlocked (invoke)
		x.own = map[engine.Pin]*inFlight{}
	}
	outs := make([]*[]byte, n)
	errs := make([]error, n)
	timings := make([][]call.StepTiming, n)
	// A branch that fails stops its siblings before their next steps (run
	// .failed); a step they already started runs (cancelling it would
	// count a healthy function's failure and could lose a cold load in
	// flight), and one still queued gives its wait up (stepGone), counted
	// as its function's 499.
	//
	// A panic in a branch (a bug, its run's) is recovered in the branch,
	// the first's too, fails the request as a step's failure does, and is
	// raised again once every branch has ended, for the request's
	// transport to recover (errdefs.Panic): in another branch's goroutine
	// it would end the process, and unwinding the request's goroutine
	// while siblings run would hand their input (seq's pooled buffer) and
	// the request's pooled call to other requests under them.
	panics := make([]*errdefs.Panic, n)
	branch := func(j int) {
		defer func() {
			if panics[j] = errdefs.Recovered(recover()); panics[j] != nil {
				x.failed.Store(true)
			}
		}()
		br := st.par[j]
		*outs[j], errs[j] = x.seq(ctx, br, in, fitting(outs[j], br[len(br)-1].out), &timings[j], client)
	}
	var wg sync.WaitGroup
	for j := 1; j < n; j++ {
		outs[j] = x.r.getBuf()
		wg.Add(1)
		go func(j int) {
			defer wg.Done()
			branch(j)
		}(j)
	}
	outs[0] = x.r.getBuf()
	branch(0)
	wg.Wait()
	for _, p := range panics {
		if p != nil {
			panic(p)
		}
	}
	err := firstFailure(errs)
	if c := x.cause.Load(); err != nil && c != nil {
		// The request's first failure: one of this step's branches' (a
		// step before it that failed ended the walk before this stage),
		// or of a parallel step nested in one of them, which answered the
		// same cause to its branch.
		err = *c
	}
	if err == nil {
		// Grown once to the whole: appended a branch at a time, a wide
		// step's concatenation allocated several times its size (a
		// review measured 2.7 GiB for a 256 MiB answer of 16 x 16).
		total := 0
		for j := range outs {
			total += len(*outs[j])
		}
		dst = slices.Grow(dst, total)
	}
	for j := 0; j < n; j++ {
		*steps = append(*steps, timings[j]...)
		if err == nil {
			dst, err = x.appendCut(dst, *outs[j], st, j)
		}
		x.r.putBuf(outs[j])
	}
	return dst, err
}

// firstFailure is the first branch's error in the listed order that is
// its own failure, not its stop for a sibling's: the answer where no
// step failed (run.cause), but a branch stopped before its next step for
// the request's deadline or its client.
func firstFailure(errs []error) error {
	var stopped error
	for _, err := range errs {
		switch {
		case err == nil:
		case errors.Is(err, errSibling):
			stopped = err
		default:
			return err
		}
	}
	return stopped
}

// appendCut appends branch j's output to dst, cut to what its declared
// outputs take where the stage's outputs are the pipeline's (stage.cut).
func (x *run) appendCut(dst, out []byte, st *stage, j int) ([]byte, error) {
	n := int64(len(out))
	if st.cut != nil && st.cut[j] >= 0 {
		if n < st.cut[j] {
			// Named by the branch's own step, the function that wrote
			// it, as a step's failure is: the parallel step's label names
			// every branch's function, one a caller told this failure
			// may not use (Hidden), and as a metrics label no function's
			// Forget would clear it.
			br := st.par[j][len(st.par[j])-1].label
			err := atStep(x.pl.name, st.index, br, &apierr.Error{Status: apierr.BadOutput, Msg: fmt.Sprintf("pipeline %s: step %d (%s): branch %d wrote %d bytes, its declared outputs take %d",
				x.pl.name, st.index, br, j, len(out), st.cut[j])})
			// The step's failure, though each branch ran: counted so,
			// or the request failed with no step's error counted.
			x.r.met.observe(x.pl.name, st.index, br, 0, err)
			return dst, x.fail(err)
		}
		n = st.cut[j]
	}
	x.copied.Add(n)
	return append(dst, out[:n]...), nil
}

// unfit is err as the answer to a request whose step refused an input the
// step before it made: the pipeline's steps do not fit each other, which no
// other request of the client's would mend, so the client is not told it
// sent a bad request (4xx) but that the pipeline failed (500 bad_output).
func unfit(err error) error {
	// Not KindInvalid: a step's library the device refuses is that, and
	// says so itself.
	switch errdefs.KindOf(err) {
	case errdefs.KindTooLarge, errdefs.KindBadRequest, errdefs.KindRejected: // the last: plover_reject
		return &apierr.Error{Status: apierr.BadOutput, Msg: "its input is the output of the step before it, which it refused: " + errMsg(err)}
	}
	return err
}

func errMsg(err error) string {
	var ee *errdefs.Error
	if errors.As(err, &ee) {
		return ee.Msg
	}
	return err.Error()
}

// fitting is *b emptied to be written again, or nil, *b dropped, where it
// is too small for n bytes (the step writing there makes its own, and the
// old one goes now rather than beside it: Pin.Holds counts one) or much
// larger (a 64 MiB array holding a 256-byte output is the next step's
// input, kept whole beside that step's output).
func fitting(b *[]byte, n int64) []byte {
	if c := int64(cap(*b)); c < n || c > max(n, keptBuf) {
		*b = nil
	}
	return (*b)[:0]
}

// keptBuf bounds the intermediate buffers the pool keeps, as the HTTP
// front end bounds the bodies it keeps.
const keptBuf = 1 << 20

func (r *Runner) getBuf() *[]byte { return r.bufs.Get().(*[]byte) }

func (r *Runner) putBuf(b *[]byte) {
	if cap(*b) > keptBuf {
		*b = nil
	}
	r.bufs.Put(b)
}
