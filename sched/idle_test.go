package sched

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
)

func init() { workloadCheck = checkIdle }

// checkIdle checks the idle list against what it stands for: ordered by
// lastIdle, each flow on it listed with nothing running and gone idle
// light, and lightAbout's answer the one a walk over every listed flow
// gives (the walk every admission made before the list was kept).
func checkIdle(s *Scheduler, now time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	// Every listed flow, by the walk: named ones, forgotten ones still
	// running, forgotten ones idle since (on the list).
	seen := map[*Flow]bool{}
	var all []*Flow
	add := func(g *Flow) {
		if g != nil && !seen[g] {
			seen[g] = true
			all = append(all, g)
		}
	}
	for _, g := range s.flows {
		add(g)
	}
	for _, r := range s.running {
		add(r.f)
	}
	n := 0
	for g := s.idle.head; g != nil; g = g.idleNext {
		add(g)
		n++
		switch {
		case !g.linked || !g.listed:
			return fmt.Errorf("a flow on the list has linked %v, listed %v", g.linked, g.listed)
		case g.inFlight > 0:
			return fmt.Errorf("a flow with %d runs on the device is on the idle list", g.inFlight)
		case !s.light(g, g.lastIdle):
			return errors.New("a flow that went idle a flood is on the idle list")
		case g.idleNext != nil && g.idleNext.lastIdle.Before(g.lastIdle):
			return errors.New("the idle list is out of lastIdle's order")
		case g.idleNext == nil && s.idle.tail != g:
			return errors.New("the idle list's tail is not its last flow")
		}
	}
	if n != idleLen(s) {
		return fmt.Errorf("the idle list holds %d flows forwards, %d backwards", n, idleLen(s))
	}
	for _, g := range all {
		if g.linked != (g.listed && g.inFlight == 0) {
			return fmt.Errorf("a flow listed %v with %d runs is linked %v", g.listed, g.inFlight, g.linked)
		}
	}
	// At the step's time, and at times a caller's clock read before the
	// lock could give, behind it (the earliest first: lightAbout prunes).
	for _, at := range []time.Time{now.Add(-50 * time.Millisecond), now.Add(-time.Microsecond), now} {
		wantAbout, wantRuns := false, 0
		var idleAbout []*Flow
		for _, g := range all {
			if !g.listed {
				continue
			}
			running := g.inFlight > 0 && s.light(g, at)
			idle := g.inFlight == 0 && s.light(g, g.lastIdle) && at.Sub(g.lastIdle) < s.cfg.Recent && s.light(g, at)
			if running || idle {
				wantAbout, wantRuns = true, wantRuns+g.inFlight
			}
			if idle {
				idleAbout = append(idleAbout, g)
			}
		}
		// Alone's question, for a few flows: another idle one about.
		for _, g := range all[:min(len(all), 4)] {
			want := len(idleAbout) > 1 || len(idleAbout) == 1 && idleAbout[0] != g
			if got := s.idleAbout(at, g); got != want {
				return fmt.Errorf("at %v: idleAbout besides a flow %v; a walk over every listed flow: %v", at.Sub(now), got, want)
			}
		}
		if about, runs := s.lightAbout(at); about != wantAbout || runs != wantRuns {
			return fmt.Errorf("at %v: lightAbout: about %v, %d light runs; a walk over every listed flow: %v, %d", at.Sub(now), about, runs, wantAbout, wantRuns)
		}
	}
	return nil
}

// A light function that went idle keeps the reserve for Recent whatever
// came after it on the list; one that ran two at once since it went idle
// keeps nothing; forgotten, it keeps nothing; a touch moves a function's
// lapse to Recent from the touch.
func TestIdleListKeepsTheReserveForWhoIsAbout(t *testing.T) {
	ctx := context.Background()
	run := func(f *Flow) {
		t.Helper()
		tk, wait, err := f.Admit(ctx, time.Time{}, nil)
		if err != nil || wait != 0 {
			t.Fatalf("%v waited %v", err, wait)
		}
		tk.Done()
	}
	for _, tt := range []struct {
		name string
		// what happens after light-a and light-b ran once each, 400 ms
		// apart; then the clock is at b's run + 700 ms
		then func(s *Scheduler, clk *fakeClock, a, b *Flow)
		// whether a light function is about, and until when from
		// light-b's run (0: still at the end)
		about bool
		until time.Duration
	}{
		{"both ran: b's Recent", func(_ *Scheduler, clk *fakeClock, _, _ *Flow) {
			clk.Advance(700 * time.Millisecond)
		}, true, time.Second},
		{"a touched after b", func(_ *Scheduler, clk *fakeClock, a, _ *Flow) {
			clk.Advance(200 * time.Millisecond)
			a.Touch()
			clk.Advance(500 * time.Millisecond)
		}, true, 1200 * time.Millisecond},
		{"b forgotten", func(s *Scheduler, clk *fakeClock, _, _ *Flow) {
			s.Forget("light-b")
			clk.Advance(700 * time.Millisecond)
		}, false, 0},
		{"b ran two at once", func(_ *Scheduler, clk *fakeClock, _, b *Flow) {
			t1, _, _ := b.Admit(ctx, time.Time{}, nil)
			t2, _, _ := b.Admit(ctx, time.Time{}, nil)
			t1.Done()
			t2.Done()
			clk.Advance(700 * time.Millisecond)
		}, false, 0},
		{"b running, a lapsed", func(_ *Scheduler, clk *fakeClock, _, b *Flow) {
			tk, _, _ := b.Admit(ctx, time.Time{}, nil)
			t.Cleanup(tk.Done)
			clk.Advance(700 * time.Millisecond)
		}, true, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clk := newFakeClock()
			s := New(Config{MaxRuns: 3, Reserve: 1, Clock: clk})
			a, b := s.Flow("light-a"), s.Flow("light-b")
			run(a)
			clk.Advance(400 * time.Millisecond)
			run(b)
			tt.then(s, clk, a, b)
			at := 700 * time.Millisecond
			for _, step := range []time.Duration{0, tt.until - at - time.Millisecond, time.Millisecond} {
				if step < 0 {
					continue
				}
				clk.Advance(step)
				at += step
				s.mu.Lock()
				about, _ := s.lightAbout(clk.Now())
				s.mu.Unlock()
				if want := tt.about && (tt.until == 0 || at < tt.until); about != want {
					t.Fatalf("%v after b's run: a light function about %v, want %v", at, about, want)
				}
			}
			if err := checkIdle(s, clk.Now()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Flows pushed with lastIdle out of order (callers read their clocks
// before the lock) take their places by it; removed from anywhere, the
// rest keep theirs.
func TestIdleListOrder(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	for _, tt := range []struct {
		name   string
		at     []int // each flow's lastIdle, ms after t0, in push order
		remove []int // then removed, by push index
		want   []int // the list, by push index
	}{
		{"in order", []int{1, 2, 3}, nil, []int{0, 1, 2}},
		{"one late", []int{1, 3, 2}, nil, []int{0, 2, 1}},
		{"oldest last", []int{2, 3, 1}, nil, []int{2, 0, 1}},
		{"ties keep push order", []int{1, 1, 1}, nil, []int{0, 1, 2}},
		{"head removed", []int{1, 2, 3}, []int{0}, []int{1, 2}},
		{"middle and tail removed", []int{1, 2, 3, 4}, []int{1, 3}, []int{0, 2}},
		{"all removed", []int{1, 2}, []int{1, 0}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var l idleList
			fs := make([]*Flow, len(tt.at))
			for i, ms := range tt.at {
				fs[i] = &Flow{lastIdle: t0.Add(time.Duration(ms) * time.Millisecond)}
				l.push(fs[i])
			}
			for _, i := range tt.remove {
				l.remove(fs[i])
				l.remove(fs[i]) // a second time: no effect
			}
			var got, back []int
			for g := l.head; g != nil; g = g.idleNext {
				got = append(got, slices.Index(fs, g))
			}
			for g := l.tail; g != nil; g = g.idlePrev {
				back = slices.Insert(back, 0, slices.Index(fs, g))
			}
			if !slices.Equal(got, tt.want) || !slices.Equal(back, tt.want) {
				t.Fatalf("list %v, backwards %v; want %v", got, back, tt.want)
			}
		})
	}
}

// A flood of long runs stays a flood while it has two at once, however
// long since the last of them arrived: it does not take the slot kept for
// a light function. Two at once ended, it stays a flood for Overlap from
// then: going idle within it, it keeps no slots.
func TestAFloodOfLongRunsStaysAFlood(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 3, Reserve: 1, Clock: clk})
	light, flood := s.Flow("light"), s.Flow("flood")
	// enter admits a run of f, the caller's way but on this goroutine:
	// a ticket, or the waiter the run queued as.
	enter := func(f *Flow) (Ticket, *waiter) { return s.enter(f, clk.Now(), time.Time{}, 0) }
	admitted := func(w *waiter) bool {
		select {
		case <-w.ready:
			return true
		default:
			return false
		}
	}
	at := func(f *Flow) Ticket {
		t.Helper()
		tk, w := enter(f)
		if w == nil {
			return tk
		}
		if !admitted(w) { // queued behind others, and picked at once
			t.Fatalf("%p queued with a slot free for it", f)
		}
		return w.t
	}
	at(light).Done()
	at(flood).Done() // listed: it went idle light, as any function's first run does
	f1, f2 := at(flood), at(flood)
	_, w3 := enter(flood)
	_, w4 := enter(flood)
	if admitted(w3) || admitted(w4) {
		t.Fatal("a flood took the slot kept for a light function")
	}
	clk.Advance(500 * time.Millisecond) // long runs: nothing arrives for Overlap
	f1.Done()
	if !admitted(w3) {
		t.Fatal("the flood's queued run did not take its ended run's slot")
	}
	if admitted(w4) {
		t.Fatal("a flood with runs still queued, its last arrival Overlap ago, took the slot kept for a light function")
	}
	at(light).Done() // the kept slot is free
	f2.Done()
	if !admitted(w4) {
		t.Fatal("the flood's last queued run did not start")
	}
	w3.t.Done()
	w4.t.Done() // two at once ended just now
	s.mu.Lock()
	listed := flood.listed
	s.mu.Unlock()
	if listed {
		t.Fatal("the flood went idle within Overlap of two runs at once and is listed: it keeps slots")
	}
}

// A caller's time read before the lock may be behind the time a flow went
// idle at: there the flow is asked whether it was light then (it was not,
// within Overlap of its two runs at once), as a walk over every flow did.
func TestIdleAboutAtAnEarlierNow(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 4, Reserve: 1, Clock: clk})
	g := s.Flow("g")
	t1, _ := s.enter(g, clk.Now(), time.Time{}, 0)
	t2, _ := s.enter(g, clk.Now(), time.Time{}, 0)
	clk.Advance(10 * time.Millisecond)
	t1.DoneAt(clk.Now()) // two at once end: a flood for Overlap from here
	clk.Advance(DefaultOverlap)
	idleAt := clk.Now()
	t2.DoneAt(idleAt) // idle light, just
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, tt := range []struct {
		now  time.Time
		want bool
	}{
		{idleAt.Add(-time.Microsecond), false},
		{idleAt, true},
		{idleAt.Add(DefaultRecent - time.Nanosecond), true},
	} {
		if got := s.idleAbout(tt.now, nil); got != tt.want {
			t.Errorf("at %v from going idle: about %v, want %v", tt.now.Sub(idleAt), got, tt.want)
		}
	}
	if !g.listed || !g.linked {
		t.Fatalf("g went idle light and is listed %v, linked %v", g.listed, g.linked)
	}
	if s.idleAbout(idleAt, g) {
		t.Error("g about besides g")
	}
}

// endPanics is the default policy, but its Ended panics once armed.
type endPanics struct {
	Policy
	armed *bool
}

func (p endPanics) Ended(f *Flow, ran time.Duration, charged float64, now time.Time) {
	if *p.armed {
		panic("a bug in Ended")
	}
	p.Policy.Ended(f, ran, charged, now)
}

// A run whose policy's Ended panics still leaves its flow idle and on the
// idle list, where its hold lapses: a listed flow (it went idle before)
// is not left listed off the list for good.
func TestEndedPanicStillListsTheFlow(t *testing.T) {
	clk := newFakeClock()
	pol, err := NewPolicy("", 0)
	if err != nil {
		t.Fatal(err)
	}
	armed := false
	s := New(Config{MaxRuns: 2, Reserve: 1, Clock: clk, Policy: endPanics{pol, &armed}})
	f := s.Flow("f")
	tk, _ := s.enter(f, clk.Now(), time.Time{}, 0)
	tk.Done() // listed, on the list
	tk, _ = s.enter(f, clk.Now(), time.Time{}, 0)
	if !f.listed || f.linked {
		t.Fatalf("running after it went idle: listed %v, linked %v; want listed off the list", f.listed, f.linked)
	}
	armed = true
	func() {
		defer func() { recover() }() // as a transport recovers it
		tk.Done()
	}()
	if err := checkIdle(s, clk.Now()); err != nil {
		t.Fatal(err)
	}
	if !f.linked {
		t.Fatal("f went idle light and is not on the idle list")
	}
	clk.Advance(DefaultRecent)
	s.mu.Lock()
	about, _ := s.lightAbout(clk.Now())
	s.mu.Unlock()
	if about || f.listed {
		t.Fatalf("Recent after f went idle: about %v, f listed %v", about, f.listed)
	}
}

// Two runs at once ended by a queued one giving up, or refused past its
// deadline, make the flow a flood for Overlap from then, as an ended run
// does (fewer): not light again the moment one run is left.
func TestTwoAtOnceEndedByAGiveUpOrARefusal(t *testing.T) {
	for _, tt := range []struct {
		name string
		end  func(s *Scheduler, f *Flow, w *waiter, first Ticket)
	}{
		{"gave up", func(s *Scheduler, f *Flow, w *waiter, _ Ticket) {
			if !s.leave(f, w) {
				t.Fatal("the queued run was admitted, not given up")
			}
		}},
		{"refused", func(s *Scheduler, f *Flow, w *waiter, first Ticket) {
			first.Done() // three to two; the refusal makes one
			<-w.ready
			if w.err != ErrDeadline {
				t.Fatalf("the run queued past its deadline: %v, want refused", w.err)
			}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clk := newFakeClock()
			s := New(Config{MaxRuns: 1, Clock: clk})
			f := s.Flow("f")
			first, _ := s.enter(f, clk.Now(), time.Time{}, 0)
			_, w := s.enter(f, clk.Now(), clk.Now().Add(10*time.Millisecond), 0)
			if tt.name == "refused" {
				s.enter(f, clk.Now(), time.Time{}, 0) // started once the second is refused
			}
			clk.Advance(500 * time.Millisecond) // nothing arrives for Overlap
			tt.end(s, f, w, first)
			ended := clk.Now()
			s.mu.Lock()
			defer s.mu.Unlock()
			if n := f.inFlight + len(f.queue); n != 1 {
				t.Fatalf("%d runs queued or running, want 1", n)
			}
			if s.light(f, ended) || s.light(f, ended.Add(DefaultOverlap-time.Nanosecond)) {
				t.Fatal("light within Overlap of its two at once ending")
			}
			if !s.light(f, ended.Add(DefaultOverlap)) {
				t.Fatal("not light Overlap after its two at once ended, one run left")
			}
		})
	}
}

// A forgotten function keeps no slots: not for the rest of its hold, nor
// once a run it still had when forgotten ends.
func TestAForgottenFunctionKeepsNoSlots(t *testing.T) {
	for _, running := range []bool{false, true} {
		clk := newFakeClock()
		s := New(Config{MaxRuns: 3, Reserve: 1, Clock: clk})
		f := s.Flow("f")
		tk, _ := s.enter(f, clk.Now(), time.Time{}, 0)
		tk.Done() // listed: about for Recent
		if running {
			tk, _ = s.enter(f, clk.Now(), time.Time{}, 0)
		}
		s.Forget("f")
		if running {
			tk.Done()
		}
		s.mu.Lock()
		about, _ := s.lightAbout(clk.Now())
		s.mu.Unlock()
		if about || f.listed {
			t.Errorf("forgotten with a run going %v: about %v, listed %v", running, about, f.listed)
		}
	}
}

// A light function's run that turns light by time alone (Overlap after its
// two at once ended) counts in the slots kept for light functions from
// then, so a flood's queued run may start: a timer admits it then, not the
// next run's end.
func TestARunTurningLightAdmitsAQueuedFlood(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 3, Reserve: 1, Clock: clk})
	enter := func(f *Flow) (Ticket, *waiter) { return s.enter(f, clk.Now(), time.Time{}, 0) }
	other, light, flood := s.Flow("other"), s.Flow("light"), s.Flow("flood")
	tk, _ := enter(other)
	tk.Done() // about, idle: the reserve is kept for it
	tk, _ = enter(light)
	tk.Done() // listed
	l1, _ := enter(light)
	l2, _ := enter(light) // two at once: a flood for now
	clk.Advance(time.Millisecond)
	l1.Done() // a flood for Overlap from here; l2 runs on
	f1, w1 := enter(flood)
	_, w2 := enter(flood)
	if w1 != nil || w2 == nil {
		t.Fatalf("beside a light function about and a flood's run, a flood got %v slots of 3, want 1", w1 == nil)
	}
	clk.Advance(DefaultOverlap - time.Millisecond)
	select {
	case <-w2.ready:
		t.Fatal("the flood's queued run started before the light function's run turned light")
	default:
	}
	clk.Advance(time.Millisecond)
	select {
	case <-w2.ready:
		w2.t.Done()
	default:
		t.Fatal("the light function's run turned light and the flood's queued run did not start: no timer")
	}
	f1.Done()
	l2.Done()
}

// A detached flow (the last runs of a function deleted meanwhile) keeps no
// slots as it goes idle, as a forgotten one does; a named one does.
func TestADetachedFlowKeepsNoSlots(t *testing.T) {
	for _, detached := range []bool{false, true} {
		clk := newFakeClock()
		s := New(Config{MaxRuns: 3, Reserve: 1, Clock: clk})
		f := s.Flow("f")
		if detached {
			f = s.Detached()
		}
		tk, _ := s.enter(f, clk.Now(), time.Time{}, 0)
		tk.Done()
		s.mu.Lock()
		about, _ := s.lightAbout(clk.Now())
		s.mu.Unlock()
		if about != !detached {
			t.Errorf("detached %v: went idle light, about %v", detached, about)
		}
	}
}

// idleLen is how many flows s's idle list holds, counted from its tail
// (checkIdle counts them from its head).
func idleLen(s *Scheduler) int {
	n := 0
	for g := s.idle.tail; g != nil; g = g.idlePrev {
		n++
	}
	return n
}
