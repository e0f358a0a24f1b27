package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/netguard"
)

// An upload holds the bytes it has written to the spool, taken as they
// arrive, until its deploy ends and its file is removed: without a bound,
// a deploy token sending many uploads of --max-body at once filled the
// node's disk, and every other function's cold starts and deploys failed
// meanwhile, the unpacks' turns (unpack.go) bounding only what comes
// after the spool. Taken as written, not from an announced length, a
// client trickling its upload holds no more than it sent; but it may
// hold that as long as it keeps sending (a byte a read timeout), so a
// tenant (a token) takes at most the budget less one bundle (at least one
// bundle): whatever one tenant holds, another tenant's uploads, and the
// model repository's, have room for a bundle of --max-body where the
// budget is at least two. Several tenants together, or uploads without a
// token, can still hold all of it for as long as they keep sending: an
// upload's hold is bounded by its pace only through the read timeout,
// not by a rate (README's known limits). An upload that finds
// no room waits, holding what it wrote, up to its deadline or, where it
// has none (an HTTP deploy's), the engine's timeout over the whole
// upload; then 503 (504 at its deadline).

// spools is the node's spool budget and its tenants' parts of it.
type spools struct {
	all    *netguard.Budget // nil: no bound
	share  int64            // what one tenant may hold
	mu     sync.Mutex
	tenant map[string]*tenantSpool
}

// tenantSpool is a tenant's part while uploads of it are in flight:
// forgotten with its last, so that a node whose tokens come and go (a
// SIGHUP's) keeps no part for a tenant long gone.
type tenantSpool struct {
	b     *netguard.Budget
	users int
}

func newSpools(total, bundle int64) *spools {
	if total <= 0 {
		return &spools{}
	}
	// A budget under one bundle would refuse the largest for room it can
	// never have ("try again"), and one under a chunk of io.Copy's would
	// take less than it counts (the budget clamps each take to its size).
	total = max(total, bundle, 32<<10)
	share := min(total, max(total-bundle, bundle))
	return &spools{all: netguard.NewBudget(total), share: share, tenant: map[string]*tenantSpool{}}
}

// of is tenant's part ("": none, the deploys of a node without tokens
// and the model repository's, held by the whole budget alone), for one
// upload, which gives it back with done.
func (s *spools) of(tenant string) *netguard.Budget {
	if tenant == "" || s.all == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tenant[tenant]
	if t == nil {
		t = &tenantSpool{b: netguard.NewBudget(s.share)}
		s.tenant[tenant] = t
	}
	t.users++
	return t.b
}

// done ends one upload's use of tenant's part, taken with of: the part
// is forgotten with its last upload, which has released what it held.
func (s *spools) done(tenant string) {
	if tenant == "" || s.all == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := s.tenant[tenant]; t != nil {
		if t.users--; t.users <= 0 {
			delete(s.tenant, tenant)
		}
	}
}

// tenants is how many tenants' parts are kept: those with uploads in
// flight.
func (s *spools) tenants() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.tenant)
}

// spoolRoom is one upload's part of the budget: an io.Writer in front of
// its spool file.
type spoolRoom struct {
	e       *Engine
	ctx     context.Context
	w       io.Writer
	tenant  string
	own     *netguard.Budget // the tenant's part (nil: none)
	limit   int64            // the bundle bound: a byte past it is refused (413), not charged
	held    int64            // of both the node's budget and own
	until   time.Time        // the end of its waits, from the first (zero: not yet)
	ownFull bool             // the wait that failed was for the tenant's part
}

// errSpoolFull ends a spool's copy whose upload waited its most for room.
var errSpoolFull = errors.New("no room among the uploads this node spools at once")

func (r *spoolRoom) Write(p []byte) (int, error) {
	if n := min(int64(len(p)), r.limit-r.held); n > 0 {
		if err := r.take(n); err != nil {
			return 0, err
		}
	}
	return r.w.Write(p)
}

// take takes n more bytes of the tenant's part and of the node's budget,
// waiting for them where it must.
func (r *spoolRoom) take(n int64) error {
	all := r.e.spools.all
	if !r.acquire(r.own, n) {
		r.ownFull = true
		return errSpoolFull
	}
	if !r.acquire(all, n) {
		r.own.ReleasePast(n)
		return errSpoolFull
	}
	r.held += n
	return nil
}

// acquire takes n bytes of b (nil: nothing to take), waiting until the
// upload's waits end.
func (r *spoolRoom) acquire(b *netguard.Budget, n int64) bool {
	if b.TryAcquire(n) {
		return true
	}
	ctx, cancel := r.waitCtx()
	defer cancel()
	return b.Acquire(ctx, n) == nil
}

// waitCtx is the context of the upload's waits: its deadline, or the
// engine's timeout from its first wait.
func (r *spoolRoom) waitCtx() (context.Context, context.CancelFunc) {
	if _, ok := r.ctx.Deadline(); ok || r.e.cfg.Timeout <= 0 {
		return r.ctx, func() {}
	}
	if r.until.IsZero() {
		r.until = time.Now().Add(r.e.cfg.Timeout)
	}
	return context.WithDeadline(r.ctx, r.until)
}

// release gives back what the upload held, and its use of its tenant's
// part: once its file is removed.
func (r *spoolRoom) release() {
	r.own.ReleasePast(r.held)
	r.e.spools.all.ReleasePast(r.held)
	r.held = 0
	r.e.spools.done(r.tenant)
}

// spoolFull is the error of an upload that waited its most for room, n
// bytes in: 504 if the request's deadline passed, else 503 with a
// Retry-After, which a client may retry.
func (e *Engine) spoolFull(r *spoolRoom, name string, n int64) error {
	busy := fmt.Sprintf("the uploads this node spools at once hold its %d MiB (plover serve --max-spool)", e.spools.all.Max()>>20)
	if r.ownFull {
		busy = fmt.Sprintf("the uploads of tenant %s hold its part of the node's spool (%d MiB of plover serve --max-spool)", r.tenant, e.spools.share>>20)
	}
	switch ctx := r.ctx; {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return errorf(errdefs.KindTimeout, ctx.Err(), "deploy %s: the request's deadline passed while its upload waited for room, %d bytes in: %s", name, n, busy)
	case ctx.Err() != nil:
		return errorf(errdefs.KindUnavailable, ctx.Err(), "deploy %s: cancelled while its upload waited for room (the server is shutting down, or the client went away)", name)
	}
	err := errorf(errdefs.KindUnavailable, nil, "deploy %s: its upload waited %v for room, %d bytes in: %s; try again", name, e.cfg.Timeout, n, busy)
	err.RetryAt = time.Now().Add(time.Second)
	return err
}
