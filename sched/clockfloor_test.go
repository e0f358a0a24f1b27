package sched

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// A flow created after its class's clock moved back (Started, once a
// clock reaches two quanta) starts at that clock: it started at 0, up to
// a quantum behind its class's backlogged flows, and an equal-share
// function deployed then had no run until its neighbour had used about
// 18 minutes of device time (a review found it).
func TestAFlowCreatedAfterTheClockMovedBackStartsAtIt(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 1, Clock: clk})
	w := s.pol.(*WFQ)
	lat, old := s.Flow("lat"), s.Flow("old")
	lat.Set(1, Latency)
	tk, _, _ := old.Admit(context.Background(), time.Time{}, nil)
	clk.Advance(time.Millisecond)
	tk.Done()
	// The latency class's clock past two quanta (about 40 minutes of
	// device time at share 1): the next latency run moves every clock
	// back, the default class's below zero.
	w.vnow[Latency] = 3 * vQuantum
	w.state(lat).tag = 3 * vQuantum
	tk, _, _ = lat.Admit(context.Background(), time.Time{}, nil)
	clk.Advance(time.Millisecond)
	tk.Done()
	// old backlogged from here on, and a function deployed now beside
	// it, same share and class.
	cur, _, _ := old.Admit(context.Background(), time.Time{}, nil)
	nw := s.Flow("new")
	runs := alternate(t, clk, []Ticket{cur}, 200, old, nw)
	if runs[1] < 50 {
		t.Errorf("a function deployed after the clock moved back had %d of 200 runs beside an equal-share neighbour (%d; tags %.4g and %.4g)", runs[1], runs[0], w.state(nw).tag, w.state(old).tag)
	}
}

// A flood whose runs are all in flight, none queued, holds its class's
// clock as a queued one does: a low-share light function's runs in its
// kept slot moved the clock to their tags (the floor saw no flow
// waiting), a second of virtual time per 10 ms run at share 0.01, and a
// function that woke a minute later started that far ahead of the flood
// and had none of 600 runs (a review found it).
func TestARunningFloodHoldsTheClock(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 4, Reserve: 1, Recent: time.Hour, Clock: clk})
	f, g, l := s.Flow("f"), s.Flow("g"), s.Flow("light")
	l.Set(0.01, Default)
	bg := context.Background()
	lightRun := func() {
		tk, _, err := l.Admit(bg, time.Time{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		clk.Advance(10 * time.Millisecond)
		tk.Done()
	}
	lightRun()
	var fr []Ticket
	for i := 0; i < 3; i++ {
		tk, w, err := f.Admit(bg, time.Time{}, nil)
		if err != nil || w != 0 {
			t.Fatal("f not admitted at once", err)
		}
		fr = append(fr, tk)
	}
	// 20 s of f's closed loop (3 clients, a run ending each ms) and the
	// light function's 10 ms run about every 83 ms.
	for i := 0; i < 20000; i++ {
		clk.Advance(time.Millisecond)
		fr[0].Done()
		tk, w, err := f.Admit(bg, time.Time{}, nil)
		if err != nil || w != 0 {
			t.Fatal("f queued in phase 1", err)
		}
		fr = append(fr[1:], tk)
		if i%83 == 0 {
			lightRun()
		}
	}
	w := s.pol.(*WFQ)
	// g wakes, one client; f keeps one run queued beside it.
	runs := alternate(t, clk, fr, 600, g, f)
	if runs[0] < 150 {
		t.Errorf("g (share 1, woke beside f's flood at share 1) had %d of 600 runs (clock %.4g, f's tag %.4g)", runs[0], w.vnow[Default], w.state(f).tag)
	}
}

// A function's flow is made (weight 1, Default) and at once set to its
// manifest's share and class (engine: kept, weighFlows): it starts at its
// class's clock. Made there by state, Reweighed took the gap to the
// Default clock for a lead and put a new latency function that far ahead
// (0 of 200 runs beside a latency flood; a review of f3aa900 found it).
func TestAFlowPlacedInAnotherClassStartsAtItsClock(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 1, Clock: clk})
	w := s.pol.(*WFQ)
	lat := s.Flow("lat")
	lat.Set(1, Latency)
	w.vnow[Latency] = 1e11 // 100 s of latency device time at share 1
	w.state(lat).tag = 1e11
	nw := s.Flow("new")
	nw.Set(1, Latency)
	if got := w.state(nw).tag; got != w.vnow[Latency] {
		t.Errorf("fresh flow set to Latency: tag %.4g, clock %.4g (ahead by %.4g ns of device time)", got, w.vnow[Latency], got-w.vnow[Latency])
	}
	cur, _, _ := lat.Admit(context.Background(), time.Time{}, nil)
	runs := alternate(t, clk, []Ticket{cur}, 200, lat, nw)
	if runs[1] < 50 {
		t.Errorf("a latency function placed beside a latency flood had %d of 200 runs", runs[1])
	}
}

// One long run in flight (a 10-minute request) does not hold its class's
// clock where it started: counted at its tag alone (floor), it did, the
// flow running beside it moved ahead, and a function that woke then took
// every run until it caught up (0 of 600 for the flow; a review of
// f3aa900 found it).
func TestALongRunDoesNotHoldTheClock(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 2, Clock: clk})
	long, f, g := s.Flow("long"), s.Flow("f"), s.Flow("g")
	bg := context.Background()
	long.Admit(bg, time.Time{}, nil) // never ends in this test
	// f alone on the other slot for 60 s of 1 ms runs.
	for i := 0; i < 60000; i++ {
		tk, _, err := f.Admit(bg, time.Time{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		clk.Advance(time.Millisecond)
		tk.Done()
	}
	cur, _, _ := f.Admit(bg, time.Time{}, nil)
	runs := alternate(t, clk, []Ticket{cur}, 600, f, g)
	if runs[0] < 150 {
		t.Errorf("f (share 1, backlogged) had %d of 600 runs beside g, which woke while a long run held the clock", runs[0])
	}
}

// alternate keeps one run of each of two flows queued (the first queued
// first) while, n times, a fake millisecond passes and the oldest of
// running ends; it counts the runs each flow was admitted.
func alternate(t *testing.T, clk *fakeClock, running []Ticket, n int, flows ...*Flow) [2]int {
	t.Helper()
	queue := func(i int) <-chan result {
		c := admitAsync(flows[i], context.Background(), time.Time{}, nil)
		waitFor(t, fmt.Sprintf("flow %d queued", i), func() bool { return flows[i].queued() == 1 })
		return c
	}
	cs := [2]<-chan result{queue(0), queue(1)}
	var runs [2]int
	for range n {
		clk.Advance(time.Millisecond)
		running[0].Done()
		running = running[1:]
		var r result
		i := 0
		select {
		case r = <-cs[0]:
		case r = <-cs[1]:
			i = 1
		case <-time.After(5 * time.Second):
			t.Fatal("nothing admitted")
		}
		runs[i]++
		running = append(running, r.t)
		cs[i] = queue(i)
	}
	return runs
}
