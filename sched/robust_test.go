package sched

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"
)

// The Scheduler's books under random sequences of events, and the edges
// of its contract: deadlines, cancellation, MaxWait, long uptimes.

// bookedFlows is every flow a test made, forgotten ones included.
type bookedFlows struct {
	s     *Scheduler
	all   []*Flow
	names []string
}

func (h *bookedFlows) flow(name string) *Flow {
	f := h.s.Flow(name)
	for _, g := range h.all {
		if g == f {
			return f
		}
	}
	h.all = append(h.all, f)
	return f
}

// check verifies the Scheduler's books: at most MaxRuns running, every
// running run counted once by its flow, every waiting flow listed once
// with a run queued, and device time never negative.
func (h *bookedFlows) check(t *testing.T, step int) {
	t.Helper()
	s := h.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.running) > s.cfg.MaxRuns {
		t.Fatalf("step %d: %d runs on a device of %d slots", step, len(s.running), s.cfg.MaxRuns)
	}
	inFlight := 0
	for _, f := range h.all {
		if f.inFlight < 0 {
			t.Fatalf("step %d: a flow has %d runs in flight", step, f.inFlight)
		}
		inFlight += f.inFlight
		if f.deviceNs.Load() < 0 {
			t.Fatalf("step %d: negative device time %v", step, time.Duration(f.deviceNs.Load()))
		}
	}
	if inFlight != len(s.running) {
		t.Fatalf("step %d: flows count %d runs in flight, the device %d", step, inFlight, len(s.running))
	}
	seen := map[*Flow]bool{}
	for _, f := range s.waiting {
		if seen[f] || len(f.queue) == 0 {
			t.Fatalf("step %d: waiting list broken (dup %v, queue %d)", step, seen[f], len(f.queue))
		}
		seen[f] = true
	}
	for _, f := range h.all {
		if len(f.queue) > 0 && !seen[f] {
			t.Fatalf("step %d: a flow with %d queued runs is not in the waiting list", step, len(f.queue))
		}
	}
}

func (h *bookedFlows) queuedAll() int {
	n := 0
	for _, f := range h.all {
		n += f.Waiting()
	}
	return n
}

// Random admits, ends (twice, late), cancels, client departures,
// deadlines, expiries, touches, forgets and class changes on a fake clock
// (fixed seed) never leak or double-free a slot: the books always agree,
// and once everything ended every slot is free again.
func TestRandomSequencesKeepSlots(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { randomSequence(t, seed) })
	}
}

func randomSequence(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 42))
	clk := newFakeClock()
	const maxRuns = 3
	s := New(Config{MaxRuns: maxRuns, Reserve: 1, Clock: clk, Capacity: 1, Recent: 20 * time.Millisecond})
	h := &bookedFlows{s: s, names: []string{"a", "b", "c", "d", "e"}}
	type pend struct {
		c      <-chan result
		cancel context.CancelFunc
		gone   *atomic.Bool
	}
	var pending []*pend
	var held []Ticket
	// settle waits until every admission asked for is queued or answered
	// (all answered, once the last ones are cancelled).
	settle := func(step int) {
		waitFor(t, fmt.Sprintf("step %d settles", step), func() bool {
			left := pending[:0]
			for _, p := range pending {
				select {
				case r := <-p.c:
					p.cancel()
					if r.err == nil {
						held = append(held, r.t)
					} else if r.t.r != nil {
						t.Fatalf("step %d: a refused run came with a ticket", step)
					}
				default:
					left = append(left, p)
				}
			}
			pending = left
			if step < 0 {
				return len(pending) == 0
			}
			return h.queuedAll() == len(pending)
		})
		h.check(t, step)
	}
	for step := 0; step < 1500; step++ {
		switch op := rng.IntN(10); op {
		case 0, 1, 2:
			f := h.flow(h.names[rng.IntN(len(h.names))])
			var dl time.Time
			if rng.IntN(2) == 0 {
				dl = clk.Now().Add(time.Duration(rng.IntN(40)) * time.Millisecond)
			}
			ctx, cancel := context.WithCancel(context.Background())
			gone := new(atomic.Bool)
			var g func() bool
			if rng.IntN(3) == 0 {
				g = gone.Load
			}
			pending = append(pending, &pend{admitAsync(f, ctx, dl, g), cancel, gone})
		case 3, 4:
			if len(held) > 0 {
				i := rng.IntN(len(held))
				tk := held[i]
				clk.Advance(time.Duration(rng.IntN(3)) * time.Millisecond)
				tk.DoneUsed(clk.Now(), time.Duration(rng.IntN(2))*time.Millisecond)
				if rng.IntN(4) == 0 {
					tk.Done() // twice
				} else {
					held = append(held[:i], held[i+1:]...)
				}
			}
		case 5:
			if len(pending) > 0 {
				pending[rng.IntN(len(pending))].cancel()
			}
		case 6:
			clk.Advance(time.Duration(rng.IntN(30)) * time.Millisecond)
		case 7:
			h.flow(h.names[rng.IntN(len(h.names))]).Touch()
		case 8:
			name := h.names[rng.IntN(len(h.names))]
			if rng.IntN(4) == 0 {
				s.Forget(name)
			} else {
				h.flow(name).Set(float64(1+rng.IntN(5)), Class(rng.IntN(int(numClasses))))
			}
		case 9:
			if len(pending) > 0 {
				pending[rng.IntN(len(pending))].gone.Store(true)
				clk.Advance(goneEvery)
			}
		}
		settle(step)
	}
	for _, p := range pending {
		p.cancel()
	}
	settle(-1)
	for _, tk := range held {
		tk.Done()
	}
	held = nil
	t0 := clk.Now()
	clk.Advance(time.Second)
	settle(-2)
	if n := s.running_(); n != 0 {
		t.Fatalf("%d runs on the device after every run ended", n)
	}
	f := h.flow("fresh")
	for i := 0; i < maxRuns; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		tk, wait, err := f.Admit(ctx, time.Time{}, nil)
		cancel()
		if err != nil || wait != 0 {
			s.mu.Lock()
			var idle []string
			for g := s.idle.head; g != nil; g = g.idleNext {
				idle = append(idle, fmt.Sprintf("{inFlight %d, idle at %v, busy at %v, active %v queue %d light %v}", g.inFlight, g.lastIdle.Sub(t0), g.lastBusy.Sub(t0), g.active, len(g.queue), s.light(g, clk.Now())))
			}
			s.mu.Unlock()
			t.Fatalf("slot %d of %d not free after every run ended and a second passed: %v %v; listed idle: %v", i+1, maxRuns, wait, err, idle)
		}
		defer tk.Done()
	}
}

// Admit's contract: it fails when ctx ends or the deadline passes, free
// slot or not. Admitted, a run whose deadline has already passed would
// take a slot it gives up at the next expiry (while others wait: a run on
// the device that holds none), and a cancelled request's chain would run
// for nobody.
func TestAdmitRefusesPassedDeadlineOrCancel(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 2, Clock: clk})
	a := s.Flow("a")
	past := clk.Now().Add(-time.Millisecond)
	if tk, _, err := a.Admit(context.Background(), past, nil); !errors.Is(err, ErrDeadline) {
		tk.Done()
		t.Errorf("a run whose deadline passed 1ms ago: %v, want ErrDeadline", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if tk, _, err := a.Admit(ctx, time.Time{}, nil); !errors.Is(err, context.Canceled) {
		tk.Done()
		t.Errorf("a run whose context was cancelled: %v, want context.Canceled", err)
	}
	if n := s.running_(); n != 0 {
		t.Errorf("%d runs on the device after two refusals", n)
	}
}

// A queued run whose deadline passed before a slot freed (its timer not
// yet run: a loaded machine's timers run late) is refused with ErrDeadline
// when the slot frees, as its timer would have refused it. Admitted, it
// would give the slot up at the next expiry while its chain went on: two
// runs on a one-slot device, the late one billed nothing.
func TestQueuedRunPastItsDeadlineNotAdmitted(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 1, Clock: clk})
	a, b, c := s.Flow("a"), s.Flow("b"), s.Flow("c")
	hold, _, _ := a.Admit(context.Background(), time.Time{}, nil)
	cb := admitAsync(b, context.Background(), clk.Now().Add(10*time.Millisecond), nil)
	waitFor(t, "b queued", func() bool { return b.queued() == 1 })
	// The clock passes b's deadline; its timer has not run yet.
	clk.mu.Lock()
	clk.now = clk.now.Add(20 * time.Millisecond)
	clk.mu.Unlock()
	hold.Done()
	r := got(t, cb, "b")
	if r.err == nil {
		r.t.Done()
		t.Fatalf("b was admitted 10ms after its deadline passed")
	}
	if !errors.Is(r.err, ErrDeadline) {
		t.Fatalf("b refused with %v, want ErrDeadline (what its own timer gives)", r.err)
	}
	// The slot b was refused is free: c starts at once, the device's only run.
	tc, wait, err := c.Admit(context.Background(), time.Time{}, nil)
	if err != nil || wait != 0 {
		t.Fatalf("c waited %v (%v) on a free device after b was refused", wait, err)
	}
	defer tc.Done()
	if n := s.running_(); n != 1 || b.queued() != 0 {
		t.Fatalf("%d runs on the device, %d of b's queued: want c's alone", n, b.queued())
	}
}

// The default policy's promise (README, Config.MaxWait): a class held back
// by higher ones longer than MaxWait has its next run go first. It held
// only when the oldest starved run was of another class than the one
// served: here the oldest is a latency run, and the younger latency l2
// went before the batch run, queued 301 ms behind l1 (x, of the default
// class, held the slot meanwhile).
func TestStarvedBatchGoesBeforeYoungerLatency(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 1, Clock: clk, MaxWait: 200 * time.Millisecond})
	l1, l2, b, x := s.Flow("l1"), s.Flow("l2"), s.Flow("b"), s.Flow("x")
	l1.Set(1, Latency)
	l2.Set(1, Latency)
	b.Set(1, Batch)
	// l1 used the device before: its virtual time is ahead of l2's.
	for i := 0; i < 5; i++ {
		tk, _, _ := l1.Admit(context.Background(), time.Time{}, nil)
		clk.Advance(10 * time.Millisecond)
		tk.Done()
	}
	hold, _, _ := x.Admit(context.Background(), time.Time{}, nil)
	c1 := admitAsync(l1, context.Background(), time.Time{}, nil)
	waitFor(t, "l1 queued", func() bool { return l1.queued() == 1 })
	clk.Advance(time.Millisecond)
	cb := admitAsync(b, context.Background(), time.Time{}, nil)
	waitFor(t, "b queued", func() bool { return b.queued() == 1 })
	clk.Advance(time.Millisecond)
	c2 := admitAsync(l2, context.Background(), time.Time{}, nil)
	waitFor(t, "l2 queued", func() bool { return l2.queued() == 1 })
	clk.Advance(300 * time.Millisecond) // all three starved: l1 oldest, then b, then l2
	hold.Done()
	var first string
	select {
	case r := <-c1:
		first = "l1"
		r.t.Done()
	case r := <-cb:
		first = "b"
		r.t.Done()
	case r := <-c2:
		first = "l2"
		r.t.Done()
	case <-time.After(5 * time.Second):
		t.Fatal("nothing admitted")
	}
	if first == "l2" {
		t.Errorf("l2's run (waited 300ms) went before b's batch run (waited 301ms, past MaxWait 200ms): a class held back past MaxWait goes first")
	}
}

// Virtual time is a float64 of nanoseconds over the weight: after a long
// stretch at a small share (a year of a share-0.01 flow's device time
// makes it 3e18, whose float64 step is 512ns) a share-1000 flow's short
// runs (est/weight under half a step) would no longer move its tag, and it
// would win every pick, starving its peers of the same share, but for the
// clock being moved back (vQuantum).
func TestVirtualTimeKeepsPrecisionAfterLongUptime(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 1, Clock: clk})
	old, a, b := s.Flow("old"), s.Flow("a"), s.Flow("b")
	old.Set(0.01, Default)
	a.Set(1000, Default)
	b.Set(1000, Default)
	tk, _, _ := old.Admit(context.Background(), time.Time{}, nil)
	clk.Advance(365 * 24 * time.Hour)
	tk.Done()
	tk, _, _ = old.Admit(context.Background(), time.Time{}, nil) // moves the clock to its tag
	clk.Advance(time.Millisecond)
	tk.Done()
	// a's runs take 100us, b's 400us: equal shares, so b should get
	// about a fifth of the runs (equal device time).
	runs := serial(t, clk, 500, func(f *Flow) time.Duration {
		if f == a {
			return 100 * time.Microsecond
		}
		return 400 * time.Microsecond
	}, a, b)
	if runs[b] < 50 {
		t.Errorf("after a year's uptime b (share 1000, 400us runs) had %d of 500 runs against a's %d (same share, 100us runs): want about 100", runs[b], runs[a])
	}
}

// MaxWait is for priorities, not for fair order within a class: a flood's
// backlog is all past MaxWait, and served oldest first it would go before
// another function's new run of its class. Here f (ahead in virtual time:
// it used the device before) has runs queued 300ms, past MaxWait; g's run,
// new and of the same class, goes first.
func TestStarvedRunsKeepFairOrderWithinTheirClass(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 1, Clock: clk, MaxWait: 200 * time.Millisecond})
	f, g, x := s.Flow("f"), s.Flow("g"), s.Flow("x")
	for i := 0; i < 5; i++ {
		tk, _, _ := f.Admit(context.Background(), time.Time{}, nil)
		clk.Advance(10 * time.Millisecond)
		tk.Done()
	}
	hold, _, _ := x.Admit(context.Background(), time.Time{}, nil)
	var cf []<-chan result
	for i := 0; i < 3; i++ {
		cf = append(cf, admitAsync(f, context.Background(), time.Time{}, nil))
		waitFor(t, "f queued", func() bool { return f.queued() == i+1 })
	}
	clk.Advance(300 * time.Millisecond)
	cg := admitAsync(g, context.Background(), time.Time{}, nil)
	waitFor(t, "g queued", func() bool { return g.queued() == 1 })
	hold.Done()
	select {
	case r := <-cg:
		r.t.Done()
	case <-cf[0]:
		t.Fatal("f's run (waited 300ms, behind in fair order) went before g's new run of the same class")
	case <-time.After(5 * time.Second):
		t.Fatal("nothing admitted")
	}
	for _, c := range cf {
		got(t, c, "f").t.Done()
	}
}

// Moving the clock back keeps every tag's place exactly: the clock lands
// under vQuantum, and tags near it keep their differences to the bit.
func TestVirtualTimeMovedBackKeepsDifferences(t *testing.T) {
	s := New(Config{MaxRuns: 1, Clock: newFakeClock()})
	w := s.pol.(*WFQ)
	a, b := s.Flow("a"), s.Flow("b")
	w.vnow[Default] = 3 * vQuantum
	w.state(a).tag = 3*vQuantum + 0.25
	w.state(b).tag = 3*vQuantum + 1.75
	w.Started(a, time.Time{}) // the clock moves to a's tag: past 2*vQuantum
	if w.vnow[Default] != 0.25 || w.base != 3 {
		t.Fatalf("clock %v (base %d quanta), want 0.25 (3)", w.vnow[Default], w.base)
	}
	if got := w.state(b).tag - w.vnow[Default]; got != 1.5 {
		t.Fatalf("b's tag is %v past the clock, want 1.5 as before", got)
	}
	if got := w.state(a).tag - w.vnow[Default]; got != initialEst {
		t.Fatalf("a's tag is %v past the clock after its run started, want its estimate %v", got, initialEst)
	}
}
