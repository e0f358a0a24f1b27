package engine

import (
	"errors"
	"time"

	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/sched"
)

// mayRunAgain reports a run that may go once more on a fresh program: its
// program was lost before the run reached it, or lost with a tenant's
// shared worker by another program's fault (Collateral: the function did
// nothing wrong and, being pure, may run again). A function of its own so
// the errors.As target escapes only on the error path: the hot path
// allocates nothing.
func mayRunAgain(err error) bool {
	l, ok := device.AsLoss(err)
	return ok && (l.RanNowhere() || l.Collateral())
}

// collateral reports a loss of a tenant's shared worker by another
// program's fault.
func collateral(err error) bool {
	l, ok := device.AsLoss(err)
	return ok && l.Collateral()
}

// stoppedByServer reports a loss the server caused.
func stoppedByServer(err error) bool {
	l, ok := device.AsLoss(err)
	return ok && l.ByServer()
}

// lossOf is err's Loss (err is known to hold one).
func lossOf(err error) device.Loss {
	l, _ := device.AsLoss(err)
	return l
}

// programLost reports a run that ended with its program (its worker).
func programLost(err error) bool {
	_, ok := device.AsLoss(err)
	return ok
}

// runFailed turns a failure to create an instance or to run into the
// client's error, and reacts to what it says: a dead worker's program is
// abandoned and its crash counted towards back-off. p is nil when no
// instance was taken.
func (v *version) runFailed(p *placement, err error) error {
	f := v.fn
	var ke *device.KernelError
	var ee *errdefs.Error
	loss, lost := device.AsLoss(err)
	switch {
	case errors.As(err, &ee): // already classified, with its own message
		return err
	case errors.As(err, &ke) && lost && !loss.Collateral():
		// The chain faulted its worker's device context: the request failed
		// like any kernel failure; the worker, and only it, is gone. Not
		// where the loss is collateral: in a tenant's worker another
		// function's chain faulted the context this run shared, and the run
		// met the sticky error as if it were its own. It is the loss of the
		// worker (below), not this function's kernel failure, and the
		// error, another function's, is not its client's to read.
		v.workerDied(p, loss)
		return errorf(errdefs.KindKernel, err, "function %s: %s (its worker was stopped)", f.name, ke.Error())
	case errors.Is(err, device.ErrDeadline):
		return errorf(errdefs.KindTimeout, err, "function %s: the request's deadline passed while its chain was running", f.name)
	case lost:
		return v.workerDied(p, loss)
	case errors.As(err, &ke) && ke.Rejected:
		return errorf(errdefs.KindRejected, err, "function %s refused its input: %s", f.name, ke.Msg)
	case errors.As(err, &ke):
		if errors.Is(err, device.ErrUnhealthy) {
			v.lg.Error("device fault: device is now unhealthy", "function", f.name, "version", v.rec.ID, "error", ke.Msg)
		}
		return errorf(errdefs.KindKernel, err, "function %s: %s", f.name, err.Error())
	case errors.Is(err, device.ErrUnhealthy): // the device faulted earlier: fail fast, do not hang
		return unavailable(err, "function %s: device is unhealthy", f.name)
	}
	return errorf(errdefs.KindInternal, err, "function %s: run failed", f.name)
}

// workerDied abandons the program of a worker that died (p is nil when it
// died loading) and counts the death once, whatever number of requests
// saw it. It returns the error for the request that saw it. A collateral
// loss (its tenant's shared worker ended by another program) is logged but
// not counted: back-off is for a function that crashes its own workers,
// and must not fail the siblings of one that does.
func (v *version) workerDied(p *placement, l device.Loss) error {
	// The crash is counted as the program is abandoned, under the pool's
	// lock (abandonThen): whichever of the two that saw it returns second
	// returns after the count, so a client's next request sees its back-off.
	var backoff bool
	first := true
	if p == nil { // died loading: no placement, no exit watcher to race
		backoff = !l.Collateral() && v.pool.crashed(time.Now())
	} else {
		first = v.pool.abandonThen(p, func() { backoff = !l.Collateral() && v.pool.crashedLocked(time.Now()) })
	}
	if first {
		attrs := append([]any{"function", v.fn.name, "version", v.rec.ID}, l.LogAttrs()...)
		if l.Collateral() {
			v.lg.Warn("lost with its tenant's worker", append(attrs, "tenant", v.pool.e.tenantOf(v))...)
		} else {
			v.lg.Error("worker died", append(attrs, "backoff", backoff)...)
		}
	}
	return errorf(errdefs.KindWorkerCrashed, l, "function %s: %s", v.fn.name, l.Error())
}

// exitWatcher is a program living in a process (a worker) whose end can
// be waited for.
type exitWatcher interface {
	// Exited is closed once the program is gone: its process, or the
	// program unloaded from a process others keep (a tenant's worker), so
	// that watchExit ends with it.
	Exited() <-chan struct{}
	// Death is how it ended, nil when the server ended it by design (the
	// program closed, the server stopping).
	Death() device.Loss
}

// watchExit notices the death of p's process when it happens, not when the
// next request finds it: it is logged then and p abandoned at once (its
// instances gone from the pool, so a listing shows no instance of a dead
// worker, and the next request loads a fresh one). A request that saw the
// death too reports it to its client; it is logged and counted once. An
// unload ends it too (Death is nil then), counting nothing.
func (v *version) watchExit(p *placement, w exitWatcher) {
	<-w.Exited()
	if l := w.Death(); l != nil {
		v.workerDied(p, l)
	}
}

// hookFailed counts a failing plover_load or plover_instance_init towards
// back-off like a worker crash: each retry reloads the bundle (in a fresh
// worker), so one that fails every time must not be retried by every request.
func (v *version) hookFailed(err error) {
	backoff := v.pool.crashed(time.Now())
	v.lg.Error("bundle hook failed", "function", v.fn.name, "version", v.rec.ID, "error", err.Error(), "backoff", backoff)
}

// notAdmitted is the client's error for a run the device's scheduler did
// not admit.
func notAdmitted(f *function, dev device.Device, err error) *errdefs.Error {
	switch {
	case errors.Is(err, sched.ErrDeadline):
		return errorf(errdefs.KindTimeout, err, "function %s: the request's deadline passed while it waited for its share of %s", f.name, dev.Name())
	case errors.Is(err, sched.ErrGone):
		return errorf(errdefs.KindGone, err, "function %s: the client went away while the request waited for %s", f.name, dev.Name())
	case errors.Is(err, errShutDown): // RefuseQueued's, through the scheduler
		return shutDown(f.name, "waited for its turn on "+dev.Name())
	}
	return errorf(errdefs.KindUnavailable, err, "function %s: the request was cancelled while it waited for %s", f.name, dev.Name())
}
