package sched

import (
	"context"
	"testing"
	"time"
)

// A batch flood whose backlog is deeper than MaxWait: every batch head is
// past MaxWait, and a starved lower class went first at every pick, so
// the latency run (queued first, the oldest run of all) never went. A
// class held back past MaxWait now has a turn, and its next only after
// that run ended and it was held back as long again (WFQ.Pick); here
// the batch class held the slot (x) until the latency run's pick.
func TestBatchFloodDoesNotStarveOlderLatency(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 1, Clock: clk, MaxWait: 100 * time.Millisecond})
	l, b, x := s.Flow("l"), s.Flow("b"), s.Flow("x")
	l.Set(1, Latency)
	b.Set(1, Batch)
	x.Set(1, Batch)
	hold, _, _ := x.Admit(context.Background(), time.Time{}, nil)
	cl := admitAsync(l, context.Background(), time.Time{}, nil)
	waitFor(t, "l queued", func() bool { return l.queued() == 1 })
	clk.Advance(time.Millisecond)
	var q []<-chan result
	for i := 0; i < 20; i++ {
		q = append(q, admitAsync(b, context.Background(), time.Time{}, nil))
		waitFor(t, "b queued", func() bool { return b.queued() == i+1 })
	}
	clk.Advance(150 * time.Millisecond)
	cur := hold
	start := clk.Now()
	for i := 0; i < 100; i++ {
		clk.Advance(10 * time.Millisecond)
		cur.Done()
		select {
		case r := <-cl:
			t.Logf("latency admitted after %d batch runs, waited %v", i, r.wait)
			r.t.Done()
			return
		case r := <-q[0]:
			q = q[1:]
			cur = r.t
			// the flood goes on: one more batch run arrives per run served
			q = append(q, admitAsync(b, context.Background(), time.Time{}, nil))
			waitFor(t, "b requeued", func() bool { return b.queued() == 20 })
		case <-time.After(5 * time.Second):
			t.Fatal("nothing admitted")
		}
	}
	t.Fatalf("the latency run (queued first) waited %v behind 100 batch runs of a flood (MaxWait 100ms)", clk.Now().Sub(start)+151*time.Millisecond)
}

// The lazy move of tags moves a backlogged lower class's lagging tags too:
// a and b (batch, share 1000) stay queued while a share-0.01 latency flow
// runs a year. Their tags lag the clock by ~3e18; moved back with it they
// landed at about -3e18, where a float64 steps by 512 ns, so a's 100 ns
// charges no longer moved its tag. A moved tag is now kept within a
// quantum of the clock.
func TestLaggingBacklogKeepsPrecisionWhenMoved(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 1, Clock: clk, MaxWait: time.Hour * 24 * 1000})
	old, a, b := s.Flow("old"), s.Flow("a"), s.Flow("b")
	old.Set(0.01, Latency)
	a.Set(1000, Batch)
	b.Set(1000, Batch)
	tk, _, _ := old.Admit(context.Background(), time.Time{}, nil)
	ca := admitAsync(a, context.Background(), time.Time{}, nil)
	waitFor(t, "a queued", func() bool { return a.queued() == 1 })
	cb := admitAsync(b, context.Background(), time.Time{}, nil)
	waitFor(t, "b queued", func() bool { return b.queued() == 1 })
	clk.Advance(365 * 24 * time.Hour)
	co := admitAsync(old, context.Background(), time.Time{}, nil) // queued: latency goes first
	waitFor(t, "old queued", func() bool { return old.queued() == 1 })
	tk.Done()
	r := got(t, co, "old")
	clk.Advance(time.Millisecond)
	r.t.Done() // the clock moved to old's tag (~3e18) and back by k*2^40
	chans := map[*Flow]<-chan result{a: ca, b: cb}
	runs := map[*Flow]int{}
	for i := 0; i < 500; i++ {
		f, res := nextOf(t, chans, a, b)
		runs[f]++
		if f == a {
			clk.Advance(100 * time.Microsecond)
		} else {
			clk.Advance(400 * time.Microsecond)
		}
		res.t.Done()
	}
	w := s.pol.(*WFQ)
	t.Logf("a %d runs, b %d runs; a's tag %g, b's %g, clock %g", runs[a], runs[b], w.state(a).tag, w.state(b).tag, w.vnow[Default])
	if runs[b] < 50 {
		t.Errorf("b (share 1000, 400us runs) had %d of 500 runs against a's %d (same share, 100us runs): want about 100", runs[b], runs[a])
	}
}
