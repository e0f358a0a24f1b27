package sched

import (
	"testing"
	"time"
)

// drv drives a Scheduler synchronously on a fake clock, every run 1 ms:
// no goroutines, no sleeps.
type drv struct {
	t       *testing.T
	clk     *fakeClock
	s       *Scheduler
	waiters []struct {
		f *Flow
		w *waiter
	}
	running []struct {
		f *Flow
		t Ticket
	}
	runs map[*Flow]int
}

func (d *drv) collect() {
	for i := 0; i < len(d.waiters); {
		select {
		case <-d.waiters[i].w.ready:
			if d.waiters[i].w.err != nil {
				d.t.Fatal(d.waiters[i].w.err)
			}
			d.running = append(d.running, struct {
				f *Flow
				t Ticket
			}{d.waiters[i].f, d.waiters[i].w.t})
			d.runs[d.waiters[i].f]++
			d.waiters = append(d.waiters[:i], d.waiters[i+1:]...)
		default:
			i++
		}
	}
}

func (d *drv) admit(f *Flow) {
	now := d.clk.Now()
	tk, w, _ := d.s.join(f, now, time.Time{}, 0)
	if w == nil {
		d.running = append(d.running, struct {
			f *Flow
			t Ticket
		}{f, tk})
		d.runs[f]++
		return
	}
	d.waiters = append(d.waiters, struct {
		f *Flow
		w *waiter
	}{f, w})
	d.s.kick(now)
	d.collect()
}

func (d *drv) queued(f *Flow) int {
	n := 0
	for _, w := range d.waiters {
		if w.f == f {
			n++
		}
	}
	return n
}

// tick: every run in flight lasts 1 ms and ends.
func (d *drv) tick() {
	d.clk.Advance(time.Millisecond)
	r := d.running
	d.running = nil
	for _, x := range r {
		x.t.Done()
		d.collect()
	}
}

// A flow that always has a run in flight (its next queued before the last
// ends: never idle) but asks for 1 of 4 slots beside a backlogged flood of
// the same weight banked what it did not ask for: the class's clock was
// held at its tag (the floor counted its running run), the flood's ran
// ahead, and once it flooded too it took every slot, for 10 s after 20 s
// (a review's probe). Time a flow does not ask for goes to the busy ones
// and is not banked: a run that arrives at an empty queue starts at the
// clock (start-time fair queuing), and runs in flight hold the clock back
// only against a light function's run in its kept slot.
func TestAFlowThatAskedLessBanksNothing(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 4, Clock: clk})
	d := &drv{t: t, clk: clk, s: s, runs: map[*Flow]int{}}
	a, b := s.Flow("a"), s.Flow("b")
	const phase1 = 20000 // 20 s of 1 ms runs
	for i := 0; i < phase1; i++ {
		for d.queued(b) < 8 {
			d.admit(b)
		}
		if d.queued(a) == 0 {
			d.admit(a) // one more of a: queued beside the one running
		}
		d.tick()
	}
	t.Logf("phase 1 (a: 1 run at a time, never idle): a %d runs, b %d runs", d.runs[a], d.runs[b])
	d.floodBoth(20000, b, a, "after a flow that was never idle began to flood")
}

// floodBoth keeps 8 runs of b and of other queued for n ms, and fails
// the test unless b had about half the runs and started some every ms
// (but for 100).
func (d *drv) floodBoth(n int, b, other *Flow, what string) {
	d.runs = map[*Flow]int{}
	starved := 0
	for range n {
		for d.queued(b) < 8 {
			d.admit(b)
		}
		for d.queued(other) < 8 {
			d.admit(other)
		}
		before := d.runs[b]
		d.tick()
		if d.runs[b] == before {
			starved++
		}
	}
	d.t.Logf("both backlogged, equal weights: the other %d runs, b %d runs; ms where b started nothing: %d", d.runs[other], d.runs[b], starved)
	if starved > 100 || d.runs[b]*100 < 45*(d.runs[other]+d.runs[b]) {
		d.t.Errorf("b starved %d ms and had %d of %d runs %s, want about half and none starved", starved, d.runs[b], d.runs[other]+d.runs[b], what)
	}
}

// The same with one long run of a (20 s, a second of a's queued behind it
// so that a never goes idle): a flow c that woke meanwhile started at the
// clock a's run held and took every slot from b, backlogged all along.
func TestALongRunHoldsNoClockAgainstAFlood(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 4, Clock: clk})
	d := &drv{t: t, clk: clk, s: s, runs: map[*Flow]int{}}
	a, b, c := s.Flow("a"), s.Flow("b"), s.Flow("c")
	for d.queued(b) < 8 {
		d.admit(b)
	}
	// b holds the 4 slots; a's long run takes the next free one.
	d.admit(a)
	var long Ticket
	for long.r == nil {
		for d.queued(b) < 8 {
			d.admit(b)
		}
		d.tick()
		for i, x := range d.running {
			if x.f == a {
				long = x.t
				d.running = append(d.running[:i], d.running[i+1:]...)
				break
			}
		}
	}
	d.admit(a) // queued behind b's runs, picked when a's long run ends... keeps a active
	for i := 0; i < 20000; i++ {
		for d.queued(b) < 8 {
			d.admit(b)
		}
		d.tick()
	}
	d.floodBoth(10000, b, c, "beside a flow that woke during a's long run")
	long.Done()
}
