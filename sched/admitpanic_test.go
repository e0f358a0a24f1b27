package sched

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// A run whose gone callback panics while it waits (recovered by a
// transport) leaves its queue: before, it stayed queued with nobody waiting
// on it, and the next dispatch started it, a run nobody owned whose slot
// (no deadline) was held for good: the one-slot device served nothing more.
func TestGonePanicLeavesNoRunQueued(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 1, Clock: clk})
	a, b := s.Flow("a"), s.Flow("b")
	hold, _, err := a.Admit(context.Background(), time.Time{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan any)
	go func() {
		defer func() { done <- recover() }()
		a.Admit(context.Background(), time.Time{}, func() bool { panic("a bug in the gone check") })
	}()
	waitFor(t, "queued, its gone poll armed", func() bool { return a.Waiting() == 1 && clk.timersArmed() == 1 })
	clk.Advance(goneEvery)
	if v := <-done; v != "a bug in the gone check" {
		t.Fatalf("Admit's panic: %v, want the gone callback's", v)
	}
	if n := a.Waiting(); n != 0 {
		t.Errorf("after the panic a.Waiting() = %d, want 0", n)
	}
	hold.Done()
	if n := s.running_(); n != 0 {
		t.Fatalf("runs on the device after the only owned one ended: %d (the abandoned run took the slot)", n)
	}
	tk, _, err := b.Admit(context.Background(), clk.Now().Add(time.Second), nil)
	if err != nil {
		t.Fatal(err)
	}
	tk.Done()
}

// pickPanics is the default policy, but its Pick panics once armed (then
// disarms).
type pickPanics struct {
	Policy
	armed *atomic.Bool
}

func (p pickPanics) Pick(waiting []*Flow, now time.Time) int {
	if p.armed.CompareAndSwap(true, false) {
		panic("a bug in Pick")
	}
	return p.Policy.Pick(waiting, now)
}

// A policy panic in the dispatch a new run's own admission makes (a slot
// the reserve keeps free for a light function while a flood's run is
// queued) takes that run back out of its queue: it stayed queued before,
// and the flood's next Done started it, a run nobody owned holding a slot
// for good.
func TestEnterDispatchPanicLeavesNoRunQueued(t *testing.T) {
	clk := newFakeClock()
	pol, err := NewPolicy("", 0)
	if err != nil {
		t.Fatal(err)
	}
	var armed atomic.Bool
	s := New(Config{MaxRuns: 2, Reserve: 1, Clock: clk, Policy: pickPanics{pol, &armed}})
	l, f := s.Flow("light"), s.Flow("flood")
	bg := context.Background()
	tk, _, err := l.Admit(bg, time.Time{}, nil) // l goes idle light: about for Recent
	if err != nil {
		t.Fatal(err)
	}
	tk.Done()
	f1, _, err := f.Admit(bg, time.Time{}, nil) // the floods' one slot beside the reserve
	if err != nil {
		t.Fatal(err)
	}
	f2 := admitAsync(f, bg, time.Time{}, nil)
	waitFor(t, "the flood's second run queued", func() bool { return f.Waiting() == 1 })
	armed.Store(true)
	func() {
		defer func() {
			if v := recover(); v != "a bug in Pick" {
				t.Errorf("light's Admit: %v, want Pick's panic", v)
			}
		}()
		l.Admit(bg, time.Time{}, nil) // queued behind the flood's, dispatched at once: Pick
	}()
	if n := l.Waiting(); n != 0 {
		t.Errorf("after the panic light's queue holds %d, want 0", n)
	}
	f1.Done()
	r := got(t, f2, "the flood's second run")
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.t.Done()
	if n := s.running_(); n != 0 {
		t.Fatalf("runs on the device after every owned one ended: %d (the abandoned run took a slot)", n)
	}
}

// A run granted a slot and cancelled before Admit's select, which picks
// between the two at random, is refused (the context's error) and its run
// handed back: before, half such runs returned their Ticket and the
// engine ran the chain for a request that was gone. The gone callback,
// called by the waiting Admit itself, makes the grant and the cancel, so
// both are ready at its next select; 64 rounds make a pass without the
// check a 2^-64 chance.
func TestCancelledWhileGrantedIsRefused(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 1, Clock: clk})
	a, b := s.Flow("a"), s.Flow("b")
	for i := range 64 {
		hold, _, err := a.Admit(context.Background(), time.Time{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		calls := 0
		gone := func() bool {
			calls++
			if calls == 1 {
				hold.Done() // the slot goes to b's waiting run: w.ready
				cancel()
			}
			return false
		}
		c := admitAsync(b, ctx, time.Time{}, gone)
		waitFor(t, "b queued, its gone poll armed", func() bool { return b.Waiting() == 1 && clk.timersArmed() == 1 })
		clk.Advance(goneEvery)
		r := got(t, c, "b")
		if !errors.Is(r.err, context.Canceled) || r.t.r != nil {
			r.t.Done()
			t.Fatalf("round %d: granted and cancelled before its select: %v (ticket %v), want context.Canceled and none", i, r.err, r.t.r != nil)
		}
		if n := s.running_(); n != 0 {
			t.Fatalf("round %d: %d runs on the device after the cancelled one was refused (its grant not handed back)", i, n)
		}
	}
}
