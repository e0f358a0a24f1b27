package grpcapi

import (
	"context"
	"errors"
	"time"

	"github.com/plover-run/plover/apierr"
	"github.com/plover-run/plover/errdefs"
)

// Budget bounds the request bytes the server holds in memory at once
// (--max-body-memory, netguard.Budget): HTTP's bodies and ModelInfer's
// messages count in the same one.
type Budget interface {
	TryAcquire(n int64) bool
	Acquire(ctx context.Context, n int64) error
	Release(n int64)
	// InUse is the bytes held now, Max the budget's size (0: unlimited).
	InUse() int64
	Max() int64
}

// A ModelInfer call's message holds its size in the budget from once it
// is read until its handler returns. gRPC-Go reads a message whole when
// the handler asks for it, and says its length only then: so before a
// call asks, it waits until the budget has room for messageTicket (an
// HTTP body's first read window), holding none of it, so that no more
// messages are asked for while the budget is full; once read, the call
// takes its message's size, waiting for it if it must. A call holds
// nothing while its message has not come (a client that sends headers
// alone holds no room), nor while it waits (two large messages do not
// each hold part of what the other needs). Not counted: what gRPC-Go
// takes in of a stream before its handler asks (up to streamWindow), and
// a message's bytes while it is read (up to --max-body + 64 KiB a call,
// twice that where a client sends a second message, which gRPC-Go reads
// whole before it refuses the call), which --max-conns-per-client and 32
// streams a connection bound. Every wait ends within budgetWait in all
// (503), or at the call's deadline (504) or the read timeout (408), as an
// HTTP body's does.
const messageTicket = 64 << 10

// streamWindow is each stream's HTTP/2 flow-control window: what a
// client may send of a call before its handler asks for the message.
// gRPC-Go ignores a window under 65,535 bytes.
const streamWindow = 64 << 10

// budgetWait is how long a call waits for room in the budget in all, as
// an HTTP body does.
const budgetWait = 5 * time.Second

// room is a call's part of the budget.
type room struct {
	b      Budget
	held   int64
	waited time.Duration
}

// await waits until b has room for a message's first bytes, taking none.
func (r *room) await(ctx context.Context, b Budget) error {
	if b == nil {
		return nil
	}
	r.b = b
	// The usual case: room, seen without a lock (the wait is only to
	// ask for no message while the budget is full).
	const n = messageTicket // clamped to Max by the budget, taken and given back alike
	if m := b.Max(); m <= 0 || b.InUse()+min(n, m) <= m {
		return nil
	}
	if err := r.wait(ctx, n); err != nil {
		return err
	}
	b.Release(n)
	return nil
}

// resize makes r, which waited for room in its budget (or in none), hold
// n bytes of it (clamped to its size: a message larger than the budget
// takes all of it), waiting for them where it must.
func (r *room) resize(ctx context.Context, n int64) error {
	b := r.b
	if b == nil {
		return nil
	}
	if m := b.Max(); m > 0 {
		n = min(n, m)
	}
	if n <= r.held {
		b.Release(r.held - n)
		r.held = n
		return nil
	}
	more := n - r.held
	if b.TryAcquire(more) {
		r.held = n
		return nil
	}
	// Waiting, hold nothing: another call's wait may need it.
	b.Release(r.held)
	r.held = 0
	if err := r.wait(ctx, n); err != nil {
		return err
	}
	r.held = n
	return nil
}

// wait takes n bytes of r's budget, waiting up to what is left of
// budgetWait over r's waits, no later than ctx ends.
func (r *room) wait(ctx context.Context, n int64) error {
	t0 := time.Now()
	wctx, cancel := context.WithTimeout(ctx, budgetWait-r.waited)
	err := r.b.Acquire(wctx, n)
	cancel()
	r.waited += time.Since(t0)
	if err != nil {
		return roomRefused(ctx)
	}
	return nil
}

// release gives r's bytes back.
func (r *room) release() {
	if r.held > 0 {
		r.b.Release(r.held)
		r.held = 0
	}
}

// roomRefused is the error of a wait for room that ended: the read
// timeout's (408) where the message had not come within it, the call's
// deadline's (504: a client whose deadline passes resets its stream a
// little before the server's copy of it ends), its client's leaving
// (499), else the budget's (503).
func roomRefused(ctx context.Context) error {
	const what = "room among the request bytes the server holds in memory (plover serve --max-body-memory)"
	err := ctx.Err()
	d, hasDeadline := ctx.Deadline()
	switch {
	case errors.Is(context.Cause(ctx), errNoMessage):
		return &apierr.Error{Status: apierr.RequestTimeout,
			Msg: "the call's message did not come within the server's read timeout, its wait for " + what + " included"}
	case errors.Is(err, context.DeadlineExceeded), err != nil && hasDeadline && time.Until(d) <= goneMargin:
		return errdefs.New(errdefs.KindTimeout, nil, "the call's deadline passed while its message waited for %s", what)
	case err != nil:
		return errdefs.New(errdefs.KindGone, nil, "the client went away while its message waited for %s", what)
	}
	return apierr.MemoryFull()
}
