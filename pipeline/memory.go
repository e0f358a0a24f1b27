package pipeline

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/apierr"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
)

// Memory is a node's budget of the bytes its pipeline requests' step
// outputs hold (netguard.NewOrderedBudget): TryAcquire takes n if they fit
// now, Acquire waiting until they fit or ctx ends, both clamped to the
// budget, so that a request needing more than all of it runs alone; an
// ordered budget serves waiters in order, so that a large request runs
// rather than never. Release gives the same n back; Max is the budget
// (0: none).
type Memory interface {
	TryAcquire(n int64) bool
	Acquire(ctx context.Context, n int64) error
	Release(n int64)
	Max() int64
}

// goneInterval is how often a request waiting for room checks for its
// client, as one in a function's queue does.
const goneInterval = 20 * time.Millisecond

var (
	errWaited     = errors.New("pipeline: waited its most for room")
	errClientGone = errors.New("pipeline: the client went away")
	errShutDown   = errors.New("pipeline: the server is shutting down")
	// errGonePanicked ends a wait whose req.Gone panicked: hold raises
	// the panic, not an error of this.
	errGonePanicked = errors.New("pipeline: the request's Gone check panicked")
)

// memoryWait is the most a pipeline request waits for room in its node's
// Memory before a 503, as a body waits for --max-body-memory.
var memoryWait = 5 * time.Second

// Bound makes every pipeline request hold its plan's Holds bytes of m
// while it runs (plover serve --max-pipeline-memory); nil: no bound. Set
// before the first request.
func (r *Runner) Bound(m Memory) { r.mem = m }

// Holds is the most bytes of step outputs the pinned pipeline's request
// holds at once, its answer included, each step's output counted at its
// function's out_bytes (a step whose out_bytes is not known yet, a record
// written before it was copied, at abi.MaxBufferBytes); 0 for a function.
func (p Pin) Holds() int64 {
	if p.plan == nil {
		return 0
	}
	return p.plan.holds
}

// seqHolds is what stages run in order hold at their peak, and the bytes
// of their output: while a stage runs the one before it holds its output
// (the stage's input: the caller's, for the first), the stage its own.
func seqHolds(stages []stage) (peak, out int64) {
	for i := range stages {
		p, o := stageHolds(&stages[i])
		stages[i].out = o
		peak = max(peak, out+p)
		out = o
	}
	return peak, out
}

// stageHolds is what one stage holds at its peak, its output included, and
// the bytes of its output: a function's out_bytes; for parallel branches,
// all of them at their peaks at once, or their outputs twice over while
// they are joined into one (the join is allocated whole before they go).
func stageHolds(st *stage) (peak, out int64) {
	if st.par == nil {
		out = st.pin.OutBytes()
		if out <= 0 {
			out = abi.MaxBufferBytes
		}
		return out, out
	}
	var peaks int64
	for _, b := range st.par {
		p, o := seqHolds(b)
		peaks += p
		out += o
	}
	return max(peaks, 2*out), out
}

// hold takes the request's bytes of the node's Memory, waiting at most
// memoryWait or until the request's deadline, or the end of a drain's
// grace (top's Await: then top's refusal); release gives them back,
// and waited is how long it waited for them (0: not at all). A request
// that needs the whole of it waits out of line (wholeWait).
func (x *run) hold(ctx context.Context, top engine.Pin) (release func(), waited time.Duration, err error) {
	m, n := x.r.mem, x.pl.holds
	if m == nil || n <= 0 {
		return func() {}, 0, nil
	}
	release = func() { m.Release(n) }
	if m.TryAcquire(n) {
		return release, 0, nil
	}
	acquire, most := m.Acquire, m.Max()
	whole := most > 0 && n >= most
	if whole {
		acquire = wholeWait(m)
	}
	start := time.Now()
	until := start.Add(memoryWait)
	byDeadline := !x.deadline.IsZero() && x.deadline.Before(until)
	if byDeadline {
		until = x.deadline
	}
	wctx, cancel := context.WithDeadlineCause(ctx, until, errWaited)
	defer cancel()
	// Refused at the grace's end as a request waiting in the engine is,
	// where the process's exit a second later cut it with no answer.
	shut, awaited := top.Await()
	defer awaited()
	wctx, unwatch := cancelOn(wctx, shut, errShutDown)
	defer unwatch()
	stop := func() *errdefs.Panic { return nil }
	if x.gone != nil {
		// A client that leaves gives its place up, as in the engine's
		// queues: not a 503 5 s later, nor room taken for no one.
		wctx, stop = x.pollGone(wctx)
		// Ended before hold returns: req.Gone reads the request's
		// connection, which serves another request once it is answered.
		defer stop()
	}
	err = acquire(wctx, n)
	if p := stop(); p != nil {
		if err == nil { // room granted as Gone panicked: not kept
			m.Release(n)
		}
		panic(p)
	}
	waited = time.Since(start)
	switch cause := context.Cause(wctx); {
	case err == nil:
		return release, waited, nil
	case errors.Is(cause, errShutDown):
		return nil, waited, top.ShutDown("waited for room for its steps' outputs in --max-pipeline-memory")
	case errors.Is(cause, errClientGone):
		return nil, waited, &errdefs.Error{Kind: errdefs.KindGone, Msg: fmt.Sprintf("pipeline %s: the client went away while the request waited for room for its steps' outputs", x.pl.name)}
	case ctx.Err() != nil:
		// As the engine's waits: a client that left is told by
		// req.Gone, not ctx, whose end is the server's.
		return nil, waited, &errdefs.Error{Kind: errdefs.KindUnavailable, Msg: fmt.Sprintf("pipeline %s: the request was cancelled while it waited for room for its steps' outputs", x.pl.name), Err: ctx.Err()}
	case byDeadline && errors.Is(err, context.DeadlineExceeded):
		return nil, waited, &errdefs.Error{Kind: errdefs.KindTimeout, Msg: fmt.Sprintf("pipeline %s: the request's deadline passed while it waited for room for its steps' outputs (%s at most at once) among what the server's pipelines hold (plover serve --max-pipeline-memory)", x.pl.name, mib(n))}
	}
	if whole {
		return nil, waited, &apierr.Error{Status: apierr.Unavailable, Msg: fmt.Sprintf("pipeline %s: no room for its steps' outputs (%s at most at once) within %v: it needs the whole of plover serve --max-pipeline-memory (%s), so it runs only while no other pipeline request holds any; retry shortly", x.pl.name, mib(n), memoryWait, mib(most))}
	}
	return nil, waited, &apierr.Error{Status: apierr.Unavailable, Msg: fmt.Sprintf("pipeline %s: no room for its steps' outputs (%s at most at once) among what the server's pipelines hold (plover serve --max-pipeline-memory) within %v; retry shortly", x.pl.name, mib(n), memoryWait)}
}

// pollGone is ctx, cancelled (errClientGone) once x.gone says the
// request's client left, asked every goneInterval on a goroutine of its
// own; stop ends that goroutine, and returns a panic x.gone raised there
// (a bug in the transport's check), which cancelled ctx too, for hold to
// raise on the request's goroutine, whose transport recovers it: here it
// ended the process, every tenant's requests with it. stop may be called
// again.
func (x *run) pollGone(ctx context.Context) (gctx context.Context, stop func() *errdefs.Panic) {
	gctx, gcancel := context.WithCancelCause(ctx)
	polled := make(chan struct{})
	var panicked *errdefs.Panic // written before polled closes
	go func() {
		defer close(polled)
		defer func() {
			if panicked = errdefs.Recovered(recover()); panicked != nil {
				gcancel(errGonePanicked)
			}
		}()
		tk := time.NewTicker(goneInterval)
		defer tk.Stop()
		for {
			select {
			case <-gctx.Done():
				return
			case <-tk.C:
				if gctx.Err() == nil && x.gone() {
					gcancel(errClientGone)
					return
				}
			}
		}
	}()
	return gctx, func() *errdefs.Panic {
		gcancel(nil)
		<-polled
		return panicked
	}
}

// cancelOn is ctx, cancelled with cause once ch closes (nil: never); stop
// ends the watch, a goroutine of its own.
func cancelOn(ctx context.Context, ch <-chan struct{}, cause error) (cctx context.Context, stop func()) {
	if ch == nil {
		return ctx, func() {}
	}
	cctx, cancel := context.WithCancelCause(ctx)
	go func() {
		select {
		case <-ch:
			cancel(cause)
		case <-cctx.Done():
		}
	}()
	return cctx, func() { cancel(nil) }
}

// wholeWait is Acquire for a request that needs the whole budget (or more,
// clamped to it), which fits only once every byte held comes back: it
// tries every wholeInterval, out of the budget's line, where waiting in
// it held up every request behind it, those that fit too, for up to
// memoryWait. Such requests (a pipeline whose step records predate
// out_bytes counts 1 GiB, the default budget) still run one after
// another, each as the one before it ends.
func wholeWait(m Memory) func(ctx context.Context, n int64) error {
	return func(ctx context.Context, n int64) error {
		tk := time.NewTicker(wholeInterval)
		defer tk.Stop()
		for {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-tk.C:
				if m.TryAcquire(n) {
					return nil
				}
			}
		}
	}
}

// wholeInterval is how often a request needing the whole budget tries for
// it.
const wholeInterval = 5 * time.Millisecond

// mib is n bytes in MiB, for messages.
func mib(n int64) string {
	if n < 1<<20 {
		return fmt.Sprintf("%d bytes", n)
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}
