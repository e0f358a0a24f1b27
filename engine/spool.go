package engine

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/plover-run/plover/errdefs"
)

// SpoolBudget is the node's disk for deploys' uploads while they are
// spooled (netguard.Budget): TryAcquire takes n bytes if they fit now,
// Acquire waits until they fit or ctx ends, both clamped to Max; Release
// gives back what one of them took.
type SpoolBudget interface {
	TryAcquire(n int64) bool
	Acquire(ctx context.Context, n int64) error
	Release(n int64)
	Max() int64 // 0: unlimited
}

// An upload holds the bytes it has written to the spool, taken as they
// arrive, until its deploy ends and its file is removed: without a bound,
// a deploy token sending many uploads of --max-body at once filled the
// node's disk, and every other function's cold starts and deploys failed
// meanwhile, the unpacks' turns (unpack.go) bounding only what comes
// after the spool. Taken as written, not from an announced length, a
// client trickling its upload holds no more than it sent. An upload that
// finds no room waits, holding what it wrote, no longer than its deploy
// waits for an unpack turn; then 503.

// spoolRoom is one upload's part of the budget.
type spoolRoom struct {
	e    *Engine
	ctx  context.Context
	w    io.Writer
	held int64
}

// errSpoolFull ends a spool's copy whose upload waited its most for room.
var errSpoolFull = errors.New("no room among the uploads this node spools at once")

func (r *spoolRoom) Write(p []byte) (int, error) {
	b := r.e.cfg.SpoolBudget
	n := int64(len(p))
	if m := b.Max(); m > 0 {
		n = min(n, m) // as the budget clamps it: Release takes the same
	}
	if !b.TryAcquire(n) {
		wait, cancel := r.e.waitFor(r.ctx)
		err := b.Acquire(wait, n)
		cancel()
		if err != nil {
			return 0, errSpoolFull
		}
	}
	r.held += n
	return r.w.Write(p)
}

// release gives back what the upload held: once its file is removed.
func (r *spoolRoom) release() {
	if b := r.e.cfg.SpoolBudget; b != nil {
		m := b.Max()
		for r.held > 0 {
			part := r.held
			if m > 0 {
				part = min(part, m)
			}
			b.Release(part)
			r.held -= part
		}
	}
}

// waitFor is ctx for a deploy's wait for a node's turn or room: its own
// deadline, or, where it has none (an HTTP deploy's), the engine's
// request timeout.
func (e *Engine) waitFor(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); !ok && e.cfg.Timeout > 0 {
		return context.WithTimeout(ctx, e.cfg.Timeout)
	}
	return ctx, func() {}
}

// spoolFull is the error of an upload that waited its most for room in
// the spool budget, having spooled n bytes: 504 if the request's deadline
// passed, else 503, which a client may retry.
func (e *Engine) spoolFull(ctx context.Context, name string, n int64) error {
	busy := fmt.Sprintf("the uploads this node spools at once hold its %d MiB (plover serve --max-spool)", e.cfg.SpoolBudget.Max()>>20)
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return errorf(errdefs.KindTimeout, ctx.Err(), "deploy %s: the request's deadline passed while its upload waited for room, %d bytes in: %s", name, n, busy)
	case ctx.Err() != nil:
		return errorf(errdefs.KindUnavailable, ctx.Err(), "deploy %s: cancelled while its upload waited for room (the server is shutting down, or the client went away)", name)
	}
	return errorf(errdefs.KindUnavailable, nil, "deploy %s: its upload waited %v for room, %d bytes in: %s; try again", name, e.cfg.Timeout, n, busy)
}
