package pipeline

// A request's parallel branches and the functions they share: a step
// holds its place among its siblings, not in its function's queue.

import (
	"context"
	"fmt"
	"time"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
)

// inFlight is a request's own steps of one pinned version: how many are
// in flight, how many ended, and a channel closed at the next end.
type inFlight struct {
	n, ends int
	ended   chan struct{}
}

// invoke runs a step's request. The request's own parallel branches
// hold at most what the step's pinned version takes at once (Pin.Room:
// max_instances running and max_queue waiting): a step past it waits for
// one of them to end, and one refused (429) while they hold runs of it
// waits so and asks again (others' requests took the room meanwhile): a
// parallel step
// fanning out to one function past what it takes at once filled its
// queue itself and failed on an idle server (with defaults, 16 branches
// of 16 nested ones every time), with a 429 that no retry would mend (a
// review found it). A refusal while none of them is in flight, or
// ended, is the request's: the function is busy with other requests. A
// version not loaded yet runs one of the request's steps first, then the
// rest: until then its queue is not known. A refused try asked again is
// not counted in the function's requests (Pin.Retried); the last one, the
// request's answer, is.
//
// The step's timing (sub's) counts from start: its waits for its
// siblings, and a refused try's time, are queue time beside its
// function's queue.
func (x *run) invoke(ctx context.Context, pin engine.Pin, sub *call.Request, start time.Time) error {
	if x.own == nil { // no parallel step: nothing of its own to wait for
		return pin.Invoke(ctx, sub)
	}
	defer func() {
		if d := time.Since(start) - sub.Timing.Total; d > 0 {
			sub.Timing.Queue += d
			sub.Timing.Total += d
		}
	}()
	x.mu.Lock()
	f := x.own[pin]
	if f == nil {
		f = &inFlight{ended: make(chan struct{})}
		x.own[pin] = f
	}
	// Not loaded yet, what it takes is not known (Room 0): the first
	// goes alone.
	if err := x.waitUntil(ctx, pin, f, func() bool { return f.n == 0 || f.n < pin.Room() }); err != nil {
		return err
	}
	f.n++
	seen := f.ends
	x.mu.Unlock()
	if hookInvoking != nil {
		hookInvoking()
	}
	first := *sub
	err := pin.Invoke(ctx, sub)
	x.mu.Lock()
	for errdefs.KindOf(err) == errdefs.KindBusy && (f.n > 1 || f.ends != seen) {
		// Refused while its siblings held runs of it, or one ended
		// meanwhile: others' requests took the room. Asked again at the
		// next end, or at once where none is left in flight (the room
		// an end made is there now; refused again, the 429 is the
		// request's).
		pin.Retried() // not the request's answer: no client's 429
		f.n--
		f.wake()
		at := f.ends
		if err := x.waitUntil(ctx, pin, f, func() bool { return f.n == 0 || f.ends != at }); err != nil {
			return err
		}
		f.n++
		seen = f.ends
		x.mu.Unlock()
		*sub = first
		err = pin.Invoke(ctx, sub)
		x.mu.Lock()
	}
	f.n--
	f.ends++
	f.wake()
	x.mu.Unlock()
	return err
}

// hookInvoking, when set (tests), runs as a parallel branch's step has
// been counted and is about to ask its function.
var hookInvoking func()

// wake tells the request's steps waiting on f that its count changed.
func (f *inFlight) wake() {
	close(f.ended)
	f.ended = make(chan struct{})
}

// waitUntil waits, with x.mu held and given up meanwhile, until done
// (read under x.mu) holds of f's counts, and returns with x.mu held
// again; or, with it not held, the error of a request lost meanwhile (a
// sibling failed, the client left, its deadline passed, its context
// ended) or refused by the end of a drain's grace (pin's, the step's
// function's: its request had not started).
func (x *run) waitUntil(ctx context.Context, pin engine.Pin, f *inFlight, done func() bool) error {
	if done() {
		return nil
	}
	var expired <-chan time.Time
	if !x.deadline.IsZero() {
		t := time.NewTimer(time.Until(x.deadline))
		defer t.Stop()
		expired = t.C
	}
	// Checked as a step queued in its function is: a sibling that failed
	// or a client that left, seen within 20 ms, not at the next end.
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	shut, awaited := pin.Await()
	defer awaited()
	for !done() {
		changed := f.ended
		x.mu.Unlock()
		var err error
		select {
		case <-changed:
		case <-poll.C:
		case <-shut:
			err = pin.ShutDown("waited for its parallel siblings' runs of it in pipeline " + x.pl.name)
		case <-ctx.Done():
			err = &errdefs.Error{Kind: errdefs.KindUnavailable, Err: ctx.Err(), Msg: fmt.Sprintf("pipeline %s: the request was cancelled while a step waited for its parallel siblings", x.pl.name)}
		case <-expired:
			err = &errdefs.Error{Kind: errdefs.KindTimeout, Msg: fmt.Sprintf("pipeline %s: the request's deadline passed while a step waited for its parallel siblings, %v after it started",
				x.pl.name, time.Since(x.t0).Round(time.Microsecond))}
		}
		if err == nil && x.stepGone() {
			// As a step given up in its function's queue is (stage).
			err = &errdefs.Error{Kind: errdefs.KindGone, Msg: fmt.Sprintf("pipeline %s: the request was lost (its client left, or a branch failed) while a step waited for its parallel siblings", x.pl.name)}
		}
		if err != nil {
			return err
		}
		x.mu.Lock()
	}
	return nil
}
