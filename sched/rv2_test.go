package sched

import (
	"context"
	"testing"
	"time"
)

// A batch flood whose backlog is deeper than MaxWait: every batch head is
// past MaxWait, so Pick serves batch at every pick, and the latency run
// (queued first, the oldest run of all) never goes.
func TestRV2BatchFloodStarvesLatency(t *testing.T) {
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
