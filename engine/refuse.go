package engine

import (
	"cmp"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/plover-run/plover/errdefs"
)

// The end of a drain's grace (plover serve --grace). The process exits
// about a second later, cutting every request still in it: one that had
// not started to run is answered first, a 503 that says so, which a
// client (or a proxy, which turns a bare close into a 502) can tell from
// a request cut as it ran, and may send to another node as it is.

// refusal is the engine's state for RefuseQueued.
type refusal struct {
	shut chan struct{} // closed by RefuseQueued
	once sync.Once
	// busy: requests were in the engine when RefuseQueued closed shut
	// (set in once, read after it).
	busy bool
	// inFlight counts the requests in invoke now; refused those that
	// ended refused; waiting the waits outside the engine now (Pin.Await).
	inFlight, refused, waiting atomic.Int64
}

// errShutDown is the cause of every refusal, and what the device
// schedulers answer their queued runs with (sched.Scheduler.Refuse).
var errShutDown = errors.New("the server is shutting down")

// RefuseQueued fails, at once, every request that has not started to run:
// those waiting for one of their function's instances, for their batch,
// for their turn on a device, for another request's fetch of their
// bundle or load of their program (and, through Pin.Await, a pipeline's
// request waiting for room in --max-pipeline-memory or a parallel step
// for its siblings); and from now on any request that would
// begin to (a pipeline's next step, a body that was still arriving). Each
// gets a 503 saying that the server is shutting down, to retry on another
// node. Runs in progress go on, for the process's exit to cut. It reports
// whether any request was in the engine, refused or running, so that the
// transports give their answers a moment to be written before they close
// the connections (none: there is nothing to wait for); called again, it
// reports the same. plover serve calls it when --grace ends.
func (e *Engine) RefuseQueued() bool {
	r := &e.stop
	r.once.Do(func() {
		// Counted before the waits are woken, too: each refused one
		// leaves its count at once, and read after them alone a drain
		// with only refused requests was told none was there, and cut
		// their answers.
		r.busy = r.inFlight.Load() > 0 || r.waiting.Load() > 0
		close(r.shut)
		for _, s := range e.scheds {
			s.Refuse(errShutDown)
		}
		r.busy = r.busy || r.inFlight.Load() > 0 || r.waiting.Load() > 0
	})
	return r.busy
}

// Unfinished is how many requests are in the engine now (running, or
// loading an instance to run on; a pipeline's steps each) and how many
// ended refused by RefuseQueued (a pipeline's steps each too, and a
// pipeline's request refused as it waited for room): what a drain cut
// short by its grace leaves to the process's exit, and what it answered.
func (e *Engine) Unfinished() (inFlight, refused int64) {
	return e.stop.inFlight.Load(), e.stop.refused.Load()
}

// shutting is closed once RefuseQueued was called; nil (never closed) for
// a pool with no engine (a benchmark's).
func (e *Engine) shutting() <-chan struct{} {
	if e == nil {
		return nil
	}
	return e.stop.shut
}

// shutDown is the 503 of function name's request refused by RefuseQueued,
// which had not started: where says where it was ("waited for its
// batch").
func shutDown(name, where string) *errdefs.Error { return refusedAs("function "+name, where) }

// refusedAs is shutDown for what ("function f", "pipeline p"). Its
// Retry-After is 1 s: the same request may go to another node at once.
func refusedAs(what, where string) *errdefs.Error {
	err := errorf(errdefs.KindUnavailable, errShutDown, "%s: the server is shutting down; the request had not started (it %s): retry on another node", what, where)
	err.RetryAt = time.Now().Add(time.Second)
	return err
}

// Await begins a wait of a request of the pinned function or pipeline
// outside the engine, a pipeline's (for room in --max-pipeline-memory, a
// parallel step for its siblings), which done ends: shut closes once
// RefuseQueued is called, for the wait to end there with ShutDown as the
// engine's own do, and RefuseQueued counts the request as one in the
// engine, so that the transports give its refusal a moment to be written
// before they close its connection.
func (p Pin) Await() (shut <-chan struct{}, done func()) {
	r := &p.e.stop
	r.waiting.Add(1)
	return r.shut, func() { r.waiting.Add(-1) }
}

// ShutDown is the refusal of a request of the pinned function or pipeline
// that RefuseQueued ended as it waited outside the engine (where: "waited
// for ..."), counted in Unfinished's refused here: no invoke of the
// engine's saw it end, and the drain's log would not count it.
func (p Pin) ShutDown(where string) error {
	p.e.stop.refused.Add(1)
	return refusedAs(cmp.Or(p.v.rec.Kind, "function")+" "+p.f.name, where)
}

// takeTurn takes tok, the token of one fetch or one program load of a
// version at a time, and returns nil; or, once RefuseQueued was called,
// function name's refusal instead: one that waited for another request's
// turn (whose: "fetch of its bundle ...") waits no longer, and none begins
// its own (about: what it was about to do), which the process's exit
// would cut with no answer. A wait that ctx ended returns ctx's error, for
// the caller to tell.
func (e *Engine) takeTurn(ctx context.Context, tok chan struct{}, name, whose, about string) error {
	shut := e.shutting()
	select {
	case <-shut: // before the token: a select would take a free one half the time
		return shutDown(name, "was about to "+about)
	default:
	}
	select {
	case tok <- struct{}{}:
		return nil
	case <-shut:
		return shutDown(name, "waited for another request's "+whose)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ended counts a request leaving invoke with err.
func (r *refusal) ended(err error) {
	r.inFlight.Add(-1)
	if err != nil && errors.Is(err, errShutDown) {
		r.refused.Add(1)
	}
}
