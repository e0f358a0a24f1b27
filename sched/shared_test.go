package sched

import (
	"context"
	"testing"
	"time"
)

// A function alone takes every run; while a second wants the device the
// floods have SharedRuns together, the rest queued for the policy; alone
// again, it takes every run again.
func TestSharedRunsWhileFunctionsContend(t *testing.T) {
	for _, tt := range []struct {
		shared, want int // want: runs on the device while a and b contend
	}{{0, 4}, {2, 2}, {3, 3}, {9, 4}} {
		s := New(Config{MaxRuns: 4, SharedRuns: tt.shared, Clock: newFakeClock()})
		a, b := s.Flow("a"), s.Flow("b")
		var runs []Ticket
		for range 4 {
			tk, wait, _ := a.Admit(context.Background(), time.Time{}, nil)
			if wait != 0 {
				t.Fatalf("SharedRuns %d: a alone waited for one of the 4 runs", tt.shared)
			}
			runs = append(runs, tk)
		}
		runs[0].Done() // a free slot: b finds it taken by the limit, not by a
		runs = runs[1:]
		cb := admitAsync(b, context.Background(), time.Time{}, nil)
		if tt.want == 4 {
			runs = append(runs, got(t, cb, "b's run in the free slot").t)
		} else {
			waitFor(t, "b queued", func() bool { return b.queued() == 1 })
			// b starts once a's runs are below the limit.
			for i := range 3 - tt.want + 1 {
				if b.queued() != 1 {
					t.Fatalf("SharedRuns %d: b started with %d runs on the device, want at most %d", tt.shared, 3-i+1, tt.want)
				}
				runs[0].Done()
				runs = runs[1:]
			}
			runs = append(runs, got(t, cb, "b's run").t)
		}
		if n := s.running_(); n != tt.want {
			t.Fatalf("SharedRuns %d: %d runs with b's, want %d", tt.shared, n, tt.want)
		}
		// a asks for 4 more: they fill the device to the limit, no further.
		var queued []<-chan result
		for range 4 {
			queued = append(queued, admitAsync(a, context.Background(), time.Time{}, nil))
		}
		waitFor(t, "a's runs admitted or queued", func() bool { return s.running_()+a.queued() == len(runs)+4 })
		if n := s.running_(); n != tt.want {
			t.Fatalf("SharedRuns %d: %d runs beside b's, want %d", tt.shared, n, tt.want)
		}
		// b done and gone: a alone again takes every run.
		last := len(runs) - 1
		runs[last].Done()
		runs = runs[:last]
		waitFor(t, "a alone fills the device", func() bool { return s.running_() == 4 || a.queued() == 0 })
		if n := s.running_(); n != 4 {
			t.Fatalf("SharedRuns %d: a alone again has %d runs, want 4", tt.shared, n)
		}
		for _, tk := range runs {
			tk.Done()
		}
		drain(t, queued)
	}
}

// A light function's run takes a kept slot beside the floods' SharedRuns:
// it is not counted in them.
func TestSharedRunsBesideALightFunction(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 4, Reserve: 1, SharedRuns: 2, Recent: time.Second, Clock: clk})
	victim, a, b := s.Flow("victim"), s.Flow("a"), s.Flow("b")
	v, _, _ := victim.Admit(context.Background(), time.Time{}, nil)
	clk.Advance(time.Millisecond)
	v.Done() // light, and about for a second
	v, wait, _ := victim.Admit(context.Background(), time.Time{}, nil)
	if wait != 0 {
		t.Fatal("the light function waited on an empty device")
	}
	var cs []<-chan result
	for _, f := range []*Flow{a, b, a, b} {
		cs = append(cs, admitAsync(f, context.Background(), time.Time{}, nil))
	}
	waitFor(t, "the floods' runs admitted or queued", func() bool { return s.running_()+a.queued()+b.queued() == 5 })
	if n := s.running_(); n != 3 {
		t.Fatalf("%d runs: want the light one and SharedRuns (2) of the floods' (not all but the reserve, 3)", n)
	}
	v.Done()
	clk.Advance(2 * time.Second) // the light function no longer about
	drain(t, cs)
}

// A function that gives up its queued run leaves the other alone again:
// the other's queued runs start past SharedRuns at once.
func TestSharedRunsEndWhenTheOtherGivesUp(t *testing.T) {
	s := New(Config{MaxRuns: 4, SharedRuns: 2, Clock: newFakeClock()})
	a, b := s.Flow("a"), s.Flow("b")
	var runs []Ticket
	for range 3 {
		tk, _, _ := a.Admit(context.Background(), time.Time{}, nil)
		runs = append(runs, tk)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cb := admitAsync(b, ctx, time.Time{}, nil)
	waitFor(t, "b queued", func() bool { return b.queued() == 1 })
	ca := admitAsync(a, context.Background(), time.Time{}, nil)
	waitFor(t, "a queued", func() bool { return a.queued() == 1 })
	cancel()
	if r := got(t, cb, "b's answer"); r.err == nil {
		t.Fatal("b's run started; want it given up")
	}
	runs = append(runs, got(t, ca, "a's fourth run, alone again").t)
	if n := s.running_(); n != 4 {
		t.Fatalf("%d runs, want a's 4", n)
	}
	for _, tk := range runs {
		tk.Done()
	}
}

// drain ends each of cs's runs as it is admitted, in whatever order.
func drain(t *testing.T, cs []<-chan result) {
	t.Helper()
	for len(cs) > 0 {
		waitFor(t, "a queued run admitted", func() bool {
			for _, c := range cs {
				if len(c) > 0 {
					return true
				}
			}
			return false
		})
		for i, c := range cs {
			if len(c) > 0 {
				(<-c).t.Done()
				cs = append(cs[:i:i], cs[i+1:]...)
				break
			}
		}
	}
}
