package netguard

import (
	"container/list"
	"context"
	"sync"
	"sync/atomic"
)

// Budget bounds bytes held at once: request bodies in memory (plover
// serve --max-body-memory), pipelines' step outputs, uploads spooled.
//
// Acquire takes n bytes of the budget, waiting while they do not fit, and
// Release gives them back. A request larger than the whole budget is
// clamped to the budget: it waits until nothing else is held and then runs
// alone, rather than never. Release must be called with the same n that was
// acquired; the clamp is applied to both alike.
//
// Waiters are not served in order: each Release grants every waiter that
// then fits, and a new Acquire that fits proceeds at once even while others
// wait. A small request therefore never waits behind a large one, while a
// large one can wait for as long as smaller ones keep the budget too full
// for it; callers bound that wait with ctx.
//
// A Budget made by NewOrderedBudget serves waiters in order instead: an
// Acquire waits behind every waiter before it, even one that fits, so that
// a large request (one clamped to the whole budget) is served once the
// bytes before it come back rather than never; a small one may wait behind
// it.
//
// A Budget with a max <= 0, or a nil *Budget, is unlimited: Acquire returns
// at once. A Budget is safe for concurrent use.
type Budget struct {
	max     int64
	ordered bool
	inUse   atomic.Int64 // changed under mu when max > 0

	mu      sync.Mutex
	waiters list.List // of *waiter, oldest first
	minWait int64     // lower bound of the waiters' n while there are any
}

type waiter struct {
	n     int64
	ready chan struct{} // closed once the n bytes are granted
}

// NewBudget returns a Budget of maxBytes bytes; maxBytes <= 0 means
// unlimited.
func NewBudget(maxBytes int64) *Budget {
	return &Budget{max: max(maxBytes, 0)}
}

// NewOrderedBudget returns a Budget of maxBytes bytes that serves its
// waiters in order; maxBytes <= 0 means unlimited.
func NewOrderedBudget(maxBytes int64) *Budget {
	return &Budget{max: max(maxBytes, 0), ordered: true}
}

// fits reports whether n more bytes may be taken now, ahead of every
// waiter: they fit, and an ordered Budget has no waiter. b.mu is held.
func (b *Budget) fits(n int64) bool {
	return b.inUse.Load()+n <= b.max && (!b.ordered || b.waiters.Len() == 0)
}

// TryAcquire takes n bytes if they fit now (clamped as in Acquire) and
// reports whether it did; it never waits and never allocates, for callers
// that only build a deadline when they must wait.
func (b *Budget) TryAcquire(n int64) bool {
	if b == nil || n <= 0 {
		return true
	}
	if b.max <= 0 {
		b.inUse.Add(n)
		return true
	}
	n = min(n, b.max)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fits(n) {
		b.inUse.Add(n)
		return true
	}
	return false
}

// Acquire takes n bytes of the budget (n clamped to Max), waiting until they
// fit or ctx ends. It returns nil once the bytes are held, and ctx's error,
// holding nothing, if ctx ends first. When the bytes fit at once, Acquire
// succeeds even if ctx has already ended. n <= 0 takes nothing.
func (b *Budget) Acquire(ctx context.Context, n int64) error {
	if b == nil || n <= 0 {
		return nil
	}
	if b.max <= 0 {
		b.inUse.Add(n)
		return nil
	}
	n = min(n, b.max)

	b.mu.Lock()
	if b.fits(n) {
		b.inUse.Add(n)
		b.mu.Unlock()
		return nil
	}
	w := &waiter{n: n, ready: make(chan struct{})}
	if b.waiters.Len() == 0 || n < b.minWait {
		b.minWait = n
	}
	e := b.waiters.PushBack(w)
	b.mu.Unlock()

	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
	}
	b.mu.Lock()
	select {
	case <-w.ready:
		// Granted while ctx ended: give the bytes back to the others.
		b.inUse.Add(-n)
		b.grant()
	default:
		b.waiters.Remove(e)
		if b.ordered {
			b.grant() // the waiters behind it may fit now
		}
	}
	b.mu.Unlock()
	return ctx.Err()
}

// TakePast takes n bytes whether or not they fit: InUse may pass Max.
// For a holder whose going on is what frees the budget (every byte of it
// held by waiters, itself the one chosen to go on); waiters get nothing
// until InUse is back under Max. Given back by Release, in pieces of at
// most Max (Release clamps as Acquire does).
func (b *Budget) TakePast(n int64) {
	if b == nil || n <= 0 {
		return
	}
	if b.max <= 0 {
		b.inUse.Add(n)
		return
	}
	b.mu.Lock()
	b.inUse.Add(n)
	b.mu.Unlock()
}

// ReleasePast gives back n bytes taken by TakePast (or several Acquires),
// in pieces of at most Max, as Release takes them.
func (b *Budget) ReleasePast(n int64) {
	if b == nil {
		return
	}
	for n > 0 {
		part := n
		if b.max > 0 {
			part = min(n, b.max)
		}
		b.Release(part)
		n -= part
	}
}

// Release gives back n bytes taken by Acquire, with the same n, and grants
// them to the waiters that then fit. Releasing more than is held is a bug
// in the caller and panics. n <= 0 releases nothing.
func (b *Budget) Release(n int64) {
	if b == nil || n <= 0 {
		return
	}
	if b.max <= 0 {
		if b.inUse.Add(-n) < 0 {
			b.inUse.Add(n)
			panic("netguard: Budget.Release of more than was acquired")
		}
		return
	}
	n = min(n, b.max)
	b.mu.Lock()
	if b.inUse.Add(-n) < 0 {
		b.inUse.Add(n)
		b.mu.Unlock()
		panic("netguard: Budget.Release of more than was acquired")
	}
	b.grant()
	b.mu.Unlock()
}

// grant hands the free bytes to the waiters that fit, oldest first (an
// ordered Budget: up to the first that does not). b.mu is held.
func (b *Budget) grant() {
	free := b.max - b.inUse.Load()
	if b.ordered {
		for e := b.waiters.Front(); e != nil; e = b.waiters.Front() {
			w := e.Value.(*waiter)
			if w.n > free {
				return
			}
			free -= w.n
			b.inUse.Add(w.n)
			b.waiters.Remove(e)
			close(w.ready)
		}
		return
	}
	if b.waiters.Len() == 0 || free < b.minWait {
		return
	}
	for e := b.waiters.Front(); e != nil && free >= b.minWait; {
		next := e.Next()
		if w := e.Value.(*waiter); w.n <= free {
			free -= w.n
			b.inUse.Add(w.n)
			b.waiters.Remove(e)
			close(w.ready)
		}
		e = next
	}
}

// InUse reports the bytes held now (as clamped).
func (b *Budget) InUse() int64 {
	if b == nil {
		return 0
	}
	return b.inUse.Load()
}

// Max reports the budget in bytes; 0 means unlimited.
func (b *Budget) Max() int64 {
	if b == nil {
		return 0
	}
	return b.max
}
