package httpapi

import (
	"context"
	"sync"
	"time"

	"github.com/plover-run/plover/apierr"
)

// A body holds budget for every byte it has read, and for the window it
// reads next: the budget bounds the bodies' memory. A body that finds no
// room for its next window waits for it, holding what it read. Bodies
// that each fit the budget but together do not could then wait for each
// other until one's 503 after 5 s (a review's probe: two 250 KiB bodies
// under 256 KiB), and a body larger than the budget never had room. So
// when every byte in use is held by bodies waiting for more (nothing held
// will be given back but by a waiter), the body that began to wait first
// takes its window past the budget and goes on, and the others have
// room once it is done: the server's body memory is at most the budget
// plus one body (--max-body), and only one body at a time is past it.

// bodyWaits are the bodies waiting for room, by when they first waited.
type bodyWaits struct {
	mu   sync.Mutex
	list []*bodyWait
	held int64 // what they hold, together
}

type bodyWait struct {
	since time.Time // the body's first wait: its place, kept across its windows
	held  int64
	// first is closed once the body is the first waiter, the one that
	// looks whether the waiters are stuck; the others wait without
	// looking (a review measured 1.3 cores for 5,000 waiters that each
	// looked every 20 ms).
	first  chan struct{}
	isHead bool
}

// enter counts w, a body holding w.held, among the waiters.
func (ws *bodyWaits) enter(w *bodyWait) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	i := len(ws.list)
	for i > 0 && ws.list[i-1].since.After(w.since) {
		i--
	}
	ws.list = append(ws.list, nil)
	copy(ws.list[i+1:], ws.list[i:])
	ws.list[i] = w
	ws.held += w.held
	ws.crown()
}

// leave ends w's wait.
func (ws *bodyWaits) leave(w *bodyWait) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for i, x := range ws.list {
		if x == w {
			ws.list = append(ws.list[:i], ws.list[i+1:]...)
			ws.held -= w.held
			ws.crown()
			return
		}
	}
}

// crown tells the first waiter it is first. ws.mu is held.
func (ws *bodyWaits) crown() {
	if len(ws.list) > 0 && !ws.list[0].isHead {
		ws.list[0].isHead = true
		close(ws.list[0].first)
	}
}

// stuck reports whether w is the first waiter and every byte the budget
// counts is held by waiters, so that no room would come but from a
// waiter. The count is read under ws.mu: read before, a waiter that went
// past since (and left) would be missed, and a second body go past too.
func (ws *bodyWaits) stuck(w *bodyWait, budget BodyBudget) bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return len(ws.list) > 0 && ws.list[0] == w && budget.InUse() <= ws.held
}

// stuckPoll is how often the first waiting body looks whether the
// waiters are stuck: they become so by others' waits and releases.
const stuckPoll = 20 * time.Millisecond

// hold makes the body's hold of the budget n bytes (its bytes so far and
// the window it reads next, at most Max more than it holds: readAll's
// windows are bounded so), waiting for room where it must: up to
// budgetWait in all over the body's windows, so that no request waits for
// ever (nor, a window at a time, up to the read timeout) behind clients
// that hold the budget, and no later than the request's deadline or the
// read timeout, whichever comes first (its turns' deadline): a request
// that asked for 100 ms is answered then, as its deadline's, not as the
// budget's at 5 s.
func (b *bodyReader) hold(n int64) error {
	budget := b.s.opts.BodyBudget
	more := n - b.held
	if more <= 0 {
		return nil
	}
	if budget.TryAcquire(more) { // the usual case: no deadline to build
		b.held = n
		return nil
	}
	t0 := time.Now()
	if b.since.IsZero() {
		b.since = t0
	}
	wait, dl := budgetWait-b.waited, b.t.deadline
	byDeadline := !dl.IsZero() && dl.Sub(t0) < wait
	if byDeadline {
		wait = dl.Sub(t0)
	}
	end := t0.Add(wait)
	w := &bodyWait{since: b.since, held: b.held, first: make(chan struct{})}
	b.s.waits.enter(w)
	defer b.s.waits.leave(w)
	defer func() { b.waited += time.Since(t0) }()
	for {
		if b.s.waits.stuck(w, budget) {
			budget.TakePast(more)
			b.held = n
			return nil
		}
		left := time.Until(end)
		if left <= 0 {
			break
		}
		var err error
		select {
		case <-w.first: // the first looks again in a while
			ctx, cancel := context.WithTimeout(context.Background(), min(left, stuckPoll))
			err = budget.Acquire(ctx, more)
			cancel()
		default: // the others wait until they have room or are first
			ctx, cancel := context.WithTimeout(context.Background(), left)
			go func() { // ends with the wait: cancel ends ctx
				select {
				case <-w.first:
					cancel()
				case <-ctx.Done():
				}
			}()
			err = budget.Acquire(ctx, more)
			cancel()
		}
		if err == nil {
			b.held = n
			return nil
		}
	}
	if byDeadline {
		return b.t.late("room among the request bytes the server holds in memory (plover serve --max-body-memory)")
	}
	return apierr.MemoryFull()
}

// holdOnly gives back what the body holds beyond n bytes (what arrived
// of a window).
func (b *bodyReader) holdOnly(n int64) {
	if b.held > n {
		b.s.opts.BodyBudget.Release(b.held - n)
		b.held = n
	}
}

// releaseBody gives back n bytes a body held: in pieces of at most the
// budget's size, as Release takes them (a body past the budget holds
// more).
func (s *Server) releaseBody(n int64) {
	if budget := s.opts.BodyBudget; budget != nil {
		budget.ReleasePast(n)
	}
}
