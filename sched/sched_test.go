package sched

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"
)

type result struct {
	t    Ticket
	wait time.Duration
	err  error
}

func admitAsync(f *Flow, ctx context.Context, deadline time.Time, gone func() bool) <-chan result {
	c := make(chan result, 1)
	go func() {
		t, w, err := f.Admit(ctx, deadline, gone)
		c <- result{t, w, err}
	}()
	return c
}

// serial runs clients (one goroutine per entry, each asking again as soon
// as it is admitted) through a one-slot scheduler on clk: once every
// client has queued, n runs in turn each hold the device for cost of its
// flow. It returns the runs per flow.
func serial(t *testing.T, clk *fakeClock, n int, cost func(*Flow) time.Duration, clients ...*Flow) map[*Flow]int {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type adm struct {
		f *Flow
		t Ticket
	}
	admitted := make(chan adm)
	flows := map[*Flow]bool{}
	for _, f := range clients {
		flows[f] = true
		go func() {
			for {
				tk, _, err := f.Admit(ctx, time.Time{}, nil)
				if err != nil {
					return
				}
				select {
				case admitted <- adm{f, tk}:
				case <-ctx.Done():
					tk.Done()
					return
				}
			}
		}()
	}
	runs := map[*Flow]int{}
	for i := 0; i < n; i++ {
		r := <-admitted
		// Every client waits again before the next admission, the one
		// just admitted included: a client slow to ask again (a loaded
		// machine) would otherwise miss turns and skew the split.
		waitFor(t, "every client queued", func() bool {
			q := 0
			for f := range flows {
				q += f.queued()
			}
			return q == len(clients) // the admitted client has asked again
		})
		runs[r.f]++
		clk.Advance(cost(r.f))
		r.t.Done()
	}
	return runs
}

// queued is how many runs of f wait.
func (f *Flow) queued() int { return f.Waiting() }

func (s *Scheduler) running_() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.running)
}

// waitFor waits until cond holds, as observed (bounded: a broken scheduler
// fails the test instead of hanging it).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Microsecond)
	}
}

func got(t *testing.T, c <-chan result, what string) result {
	t.Helper()
	select {
	case r := <-c:
		return r
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: not admitted", what)
	}
	return result{}
}

// nextOf waits for the queued run of a or b (chans holds each one's) that
// is admitted next, and queues that flow's next run before it returns it:
// both stay backlogged.
func nextOf(t *testing.T, chans map[*Flow]<-chan result, a, b *Flow) (*Flow, result) {
	t.Helper()
	var f *Flow
	var r result
	select {
	case r = <-chans[a]:
		f = a
	case r = <-chans[b]:
		f = b
	case <-time.After(5 * time.Second):
		t.Fatal("nothing admitted")
	}
	chans[f] = admitAsync(f, context.Background(), time.Time{}, nil)
	waitFor(t, "requeued", func() bool { return f.queued() == 1 })
	return f, r
}

func pending(c <-chan result) bool {
	select {
	case r := <-c:
		panic(r)
	default:
		return true
	}
}

// Backlogged flows split device time by weight, whatever their runs cost.
func TestWeightsSplitDeviceTime(t *testing.T) {
	tests := []struct {
		name         string
		wa, wb       float64
		costA, costB time.Duration
		wantA        float64
	}{
		{"3:1, equal runs", 3, 1, time.Millisecond, time.Millisecond, 0.75},
		{"3:1, b's runs 3x longer", 3, 1, time.Millisecond, 3 * time.Millisecond, 0.75},
		{"1:1, a's runs 5x longer", 1, 1, 5 * time.Millisecond, time.Millisecond, 0.5},
		{"1:4", 1, 4, 2 * time.Millisecond, time.Millisecond, 0.2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := newFakeClock()
			s := New(Config{MaxRuns: 1, Clock: clk})
			a, b := s.Flow("a"), s.Flow("b")
			a.Set(tt.wa, Default)
			b.Set(tt.wb, Default)
			cost := map[*Flow]time.Duration{a: tt.costA, b: tt.costB}
			serial(t, clk, 600, func(f *Flow) time.Duration { return cost[f] }, a, a, a, b, b, b)
			fa := float64(a.DeviceTime()) / float64(a.DeviceTime()+b.DeviceTime())
			if math.Abs(fa-tt.wantA) > 0.03 {
				t.Fatalf("a had %.3f of device time, want %.2f", fa, tt.wantA)
			}
			if mine, all := a.Recent(); math.Abs(mine/all-tt.wantA) > 0.05 {
				t.Fatalf("a's recent fraction %.3f, want about %.2f", mine/all, tt.wantA)
			}
		})
	}
}

// A function alone takes every slot at once, whatever other flows exist;
// a flow that was idle does not bank the time it did not use.
func TestWorkConserving(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 3, Reserve: 1, Clock: clk})
	a, b := s.Flow("a"), s.Flow("b")
	b.Set(1, Default)
	var ts []Ticket
	for i := 0; i < 3; i++ {
		tk, wait, err := a.Admit(context.Background(), time.Time{}, nil)
		if err != nil || wait != 0 {
			t.Fatalf("run %d alone: wait %v, %v", i, wait, err)
		}
		ts = append(ts, tk)
	}
	if s.running_() != 3 {
		t.Fatalf("%d runs on the device, want 3", s.running_())
	}
	// a runs alone for a long while; then b wakes. b must not be owed
	// a's whole history: after b's first run both alternate.
	for _, tk := range ts {
		clk.Advance(time.Second)
		tk.Done()
	}
	order := ""
	cs := []<-chan result{}
	hold, _, _ := a.Admit(context.Background(), time.Time{}, nil)
	hold2, _, _ := a.Admit(context.Background(), time.Time{}, nil)
	hold3, _, _ := a.Admit(context.Background(), time.Time{}, nil)
	for i := 0; i < 3; i++ {
		cs = append(cs, admitAsync(a, context.Background(), time.Time{}, nil))
		waitFor(t, "a queued", func() bool { return a.queued() == i+1 })
	}
	cb := admitAsync(b, context.Background(), time.Time{}, nil)
	waitFor(t, "b queued", func() bool { return b.queued() == 1 })
	clk.Advance(time.Millisecond)
	hold.Done()
	// b, just woken, goes first (it is at the current virtual time, a is
	// ahead), then a's runs: b does not get three in a row.
	select {
	case r := <-cb:
		order += "b"
		clk.Advance(time.Millisecond)
		r.t.Done()
	case <-time.After(5 * time.Second):
		t.Fatal("b not admitted")
	}
	hold2.Done()
	hold3.Done()
	for _, c := range cs {
		r := got(t, c, "a")
		order += "a"
		r.t.Done()
	}
	if order != "baaa" {
		t.Fatalf("admission order %q", order)
	}
}

// A queued latency run goes before queued default and batch runs; a batch
// run is not starved: past MaxWait it goes first.
func TestPriorities(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 1, MaxWait: 100 * time.Millisecond, Clock: clk})
	bulk, mid, fast := s.Flow("bulk"), s.Flow("mid"), s.Flow("fast")
	bulk.Set(10, Batch) // a weight does not lift a class
	mid.Set(1, Default)
	fast.Set(1, Latency)
	hold, _, _ := bulk.Admit(context.Background(), time.Time{}, nil)
	cb := admitAsync(bulk, context.Background(), time.Time{}, nil)
	waitFor(t, "bulk queued", func() bool { return bulk.queued() == 1 })
	cm := admitAsync(mid, context.Background(), time.Time{}, nil)
	waitFor(t, "mid queued", func() bool { return mid.queued() == 1 })
	cf := admitAsync(fast, context.Background(), time.Time{}, nil)
	waitFor(t, "fast queued", func() bool { return fast.queued() == 1 })
	hold.Done()
	r := got(t, cf, "latency")
	if !pending(cm) || !pending(cb) {
		t.Fatal("lower classes admitted with a latency run queued")
	}
	r.t.Done()
	r = got(t, cm, "default")
	r.t.Done()
	got(t, cb, "batch").t.Done()

	// Starvation: fast floods (a queued run at every moment); one bulk
	// run waits. It must start within MaxWait plus one run.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hold, _, _ = fast.Admit(ctx, time.Time{}, nil)
	flood := []<-chan result{admitAsync(fast, ctx, time.Time{}, nil), admitAsync(fast, ctx, time.Time{}, nil)}
	waitFor(t, "flood queued", func() bool { return fast.queued() == 2 })
	cb = admitAsync(bulk, ctx, time.Time{}, nil)
	waitFor(t, "bulk queued", func() bool { return bulk.queued() == 1 })
	start := clk.Now()
	cur := hold
	for {
		clk.Advance(30 * time.Millisecond)
		cur.Done()
		var next result
		select {
		case r := <-cb:
			if w := clk.Now().Sub(start); w > 130*time.Millisecond {
				t.Fatalf("the batch run waited %v behind the flood, want <= MaxWait + one run", w)
			}
			r.t.Done()
			return
		case next = <-flood[0]:
			flood[0] = admitAsync(fast, ctx, time.Time{}, nil)
		case next = <-flood[1]:
			flood[1] = admitAsync(fast, ctx, time.Time{}, nil)
		case <-time.After(5 * time.Second):
			t.Fatal("nothing admitted")
		}
		waitFor(t, "flood requeued", func() bool { return fast.queued() == 2 })
		cur = next.t
		if clk.Now().Sub(start) > time.Second {
			t.Fatal("the batch run starved")
		}
	}
}

// A run that never ends gives its slot up at its deadline; its late Done
// changes nothing.
func TestRunPastDeadlineFreesTheDevice(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 1, Clock: clk})
	a, b := s.Flow("a"), s.Flow("b")
	stuck, _, _ := a.Admit(context.Background(), clk.Now().Add(50*time.Millisecond), nil)
	cb := admitAsync(b, context.Background(), time.Time{}, nil)
	waitFor(t, "b queued", func() bool { return b.queued() == 1 })
	clk.Advance(49 * time.Millisecond)
	if !pending(cb) {
		t.Fatal("admitted before the stuck run's deadline")
	}
	clk.Advance(time.Millisecond)
	r := got(t, cb, "b after the deadline")
	stuck.Done() // late: ignored
	if n := s.running_(); n != 1 {
		t.Fatalf("%d runs on the device after the late Done, want 1 (b's)", n)
	}
	r.t.Done()
	if n := s.running_(); n != 0 || a.DeviceTime() != 50*time.Millisecond {
		t.Fatalf("runs %d, a's device time %v; want 0 and 50ms", n, a.DeviceTime())
	}
}

// A queued run leaves at its deadline, its context's end or its client's
// departure, and the queue goes on without it.
func TestWaitingRunGivesUp(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 1, Clock: clk})
	a := s.Flow("a")
	hold, _, _ := a.Admit(context.Background(), time.Time{}, nil)

	cd := admitAsync(a, context.Background(), clk.Now().Add(10*time.Millisecond), nil)
	waitFor(t, "queued", func() bool { return a.queued() == 1 })
	clk.Advance(10 * time.Millisecond)
	if r := got(t, cd, "deadline"); !errors.Is(r.err, ErrDeadline) || r.wait != 10*time.Millisecond {
		t.Fatalf("deadline: %v after %v", r.err, r.wait)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cc := admitAsync(a, ctx, time.Time{}, nil)
	waitFor(t, "queued", func() bool { return a.queued() == 1 })
	cancel()
	if r := got(t, cc, "cancel"); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancel: %v", r.err)
	}

	var left atomic.Bool
	cg := admitAsync(a, context.Background(), time.Time{}, left.Load)
	waitFor(t, "queued", func() bool { return a.queued() == 1 })
	clk.Advance(goneEvery)
	if !pending(cg) {
		t.Fatal("left while its client was there")
	}
	left.Store(true)
	clk.Advance(goneEvery)
	if r := got(t, cg, "gone"); !errors.Is(r.err, ErrGone) {
		t.Fatalf("gone: %v", r.err)
	}
	if a.queued() != 0 {
		t.Fatalf("%d runs still queued", a.queued())
	}
	hold.Done()
	if s.running_() != 0 {
		t.Fatal("a slot leaked")
	}
}

// floodBesideLight runs a light function's one run on s (two slots, one
// kept), then a flood's: one running (f1), the next queued behind the kept
// slot (c2).
func floodBesideLight(t *testing.T, s *Scheduler, clk *fakeClock) (victim *Flow, f1 Ticket, c2 <-chan result) {
	t.Helper()
	victim, flood := s.Flow("victim"), s.Flow("flood")
	v, _, _ := victim.Admit(context.Background(), time.Time{}, nil)
	clk.Advance(time.Millisecond)
	v.Done()
	f1, wait, _ := flood.Admit(context.Background(), time.Time{}, nil)
	if wait != 0 {
		t.Fatal("the flood's first run waited")
	}
	c2 = admitAsync(flood, context.Background(), time.Time{}, nil)
	waitFor(t, "flood queued", func() bool { return flood.queued() == 1 })
	return victim, f1, c2
}

// With Reserve, a function that ran recently finds a slot free however
// long its neighbour's runs are; once it has been idle for Recent, the
// neighbour gets the slot back (by a timer: nothing else happens).
func TestReserveKeepsASlotForARecentFunction(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 2, Reserve: 1, Recent: 100 * time.Millisecond, Clock: clk})
	victim, f1, c2 := floodBesideLight(t, s, clk)
	v, wait, _ := victim.Admit(context.Background(), time.Time{}, nil)
	if wait != 0 || !pending(c2) {
		t.Fatalf("victim waited %v; the flood's second run was admitted: %v", wait, !pending(c2))
	}
	clk.Advance(time.Millisecond)
	v.Done()
	if !pending(c2) {
		t.Fatal("the kept slot went to the flood while the victim is recent")
	}
	clk.Advance(100 * time.Millisecond)
	got(t, c2, "flood after the victim went quiet").t.Done()
	f1.Done()
}

// By default a light function stays about for a second: one called twice
// a second keeps its reserve between requests (with the 100 ms of before,
// one called every 125 ms found the floods in every slot at each request),
// and a second after its last run the floods get every slot.
func TestDefaultRecentKeepsTheReserveBetweenSparseRequests(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 2, Reserve: 1, Clock: clk})
	_, f1, c2 := floodBesideLight(t, s, clk)
	var quiet time.Duration
	for _, to := range []time.Duration{125 * time.Millisecond, 500 * time.Millisecond, 990 * time.Millisecond} {
		clk.Advance(to - quiet)
		quiet = to
		if s.running_() != 1 || !pending(c2) {
			t.Fatalf("the kept slot went to the flood %v after the light function's run", quiet)
		}
	}
	clk.Advance(DefaultRecent - quiet)
	got(t, c2, "flood once the light function was quiet for DefaultRecent").t.Done()
	f1.Done()
}

// A flood that stops keeps no reserve for itself: two of its runs at once
// make it a flood for as long as it counts as about, so another flood
// gets every slot at once.
func TestAStoppedFloodIsNotLight(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 2, Reserve: 1, Clock: clk})
	a, b := s.Flow("a"), s.Flow("b")
	r1, _, _ := a.Admit(context.Background(), time.Time{}, nil)
	r2, _, _ := a.Admit(context.Background(), time.Time{}, nil)
	clk.Advance(time.Millisecond)
	r1.Done()
	r2.Done()
	var since time.Duration
	for _, after := range []time.Duration{0, 200 * time.Millisecond, 900 * time.Millisecond} {
		clk.Advance(after - since)
		since = after
		b1, _, _ := b.Admit(context.Background(), time.Time{}, nil)
		c2 := admitAsync(b, context.Background(), time.Time{}, nil)
		waitFor(t, "b's second run admitted or queued", func() bool { return s.running_() == 2 || b.queued() == 1 })
		if s.running_() != 2 {
			t.Fatalf("%v after a stopped: b's second run waits for a slot kept for a", after)
		}
		b1.Done()
		got(t, c2, "b's second run").t.Done()
	}
}

// A light function whose requests overlapped once is light again Overlap
// later, not a whole hold later: one with random arrivals now and then
// sends two at once and must not lose its slots for a second each time.
func TestLightAgainSoonAfterAnOverlap(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 2, Reserve: 1, Clock: clk})
	victim, flood := s.Flow("victim"), s.Flow("flood")
	r1, _, _ := victim.Admit(context.Background(), time.Time{}, nil)
	r2 := admitAsync(victim, context.Background(), time.Time{}, nil)
	waitFor(t, "the victim's second run", func() bool { return s.running_() == 2 || victim.queued() == 1 })
	clk.Advance(time.Millisecond)
	r1.Done()
	got(t, r2, "the victim's second run").t.Done()
	clk.Advance(DefaultOverlap + 50*time.Millisecond)
	v, _, _ := victim.Admit(context.Background(), time.Time{}, nil) // one at a time again
	clk.Advance(time.Millisecond)
	v.Done()
	f1, _, _ := flood.Admit(context.Background(), time.Time{}, nil)
	c2 := admitAsync(flood, context.Background(), time.Time{}, nil)
	waitFor(t, "flood queued", func() bool { return flood.queued() == 1 || s.running_() == 2 })
	clk.Advance(500 * time.Millisecond)
	if s.running_() != 1 {
		t.Fatal("the flood took the kept slot: the victim's one overlap made it a flood for the hold")
	}
	clk.Advance(DefaultRecent)
	got(t, c2, "flood once the victim was quiet for the hold").t.Done()
	f1.Done()
}

// A deleted light function keeps no slots for the rest of its hold.
func TestForgetReleasesTheReserve(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 2, Reserve: 1, Clock: clk})
	_, f1, c2 := floodBesideLight(t, s, clk)
	if s.running_() != 1 {
		t.Fatal("the flood took the kept slot")
	}
	s.Forget("victim")
	got(t, c2, "flood once the light function was deleted").t.Done()
	f1.Done()
}

// A reserve of two of four: a flood gets two slots while a light function
// is about, and the light function's own run takes a reserved slot, not
// one of the flood's: the flood cannot fill the device behind it (on the
// host device, the run would share its CPU with the flood's).
func TestReserveHoldsWhileTheLightFunctionRuns(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 4, Reserve: 2, Recent: 100 * time.Millisecond, Clock: clk})
	victim, flood := s.Flow("victim"), s.Flow("flood")
	v, _, _ := victim.Admit(context.Background(), time.Time{}, nil)
	clk.Advance(time.Millisecond)
	v.Done()
	var runs []Ticket
	for range 2 {
		tk, wait, _ := flood.Admit(context.Background(), time.Time{}, nil)
		if wait != 0 {
			t.Fatal("the flood waited for its first two slots")
		}
		runs = append(runs, tk)
	}
	c3 := admitAsync(flood, context.Background(), time.Time{}, nil)
	waitFor(t, "flood queued", func() bool { return flood.queued() == 1 })
	v, wait, _ := victim.Admit(context.Background(), time.Time{}, nil)
	if wait != 0 {
		t.Fatalf("the victim waited %v with two slots reserved", wait)
	}
	if !pending(c3) || s.running_() != 3 {
		t.Fatalf("with the victim running, the flood took a reserved slot (%d running)", s.running_())
	}
	clk.Advance(150 * time.Millisecond) // a run longer than Recent holds the reserve throughout
	if !pending(c3) || s.running_() != 3 {
		t.Fatalf("150 ms into the victim's run, the flood took a reserved slot (%d running)", s.running_())
	}
	v.Done()
	if !pending(c3) {
		t.Fatal("the reserve lapsed as the victim's run ended; it holds for Recent after")
	}
	clk.Advance(100 * time.Millisecond) // the victim quiet for Recent: every slot is the flood's
	runs = append(runs, got(t, c3, "flood after the victim went quiet").t)
	if _, wait, _ := flood.Admit(context.Background(), time.Time{}, nil); wait != 0 {
		t.Fatal("the flood's fourth run waited with nobody about")
	}
	for _, tk := range runs {
		tk.Done()
	}
}

// FloodRuns bounds the floods' runs in flight together while a light
// function is about, below MaxRuns-Reserve, and only then: with nobody
// about they take every slot again.
func TestFloodRunsWhileALightFunctionIsAbout(t *testing.T) {
	for _, tt := range []struct {
		floodRuns, want int // want: the floods' runs admitted with the victim about
	}{{0, 3}, {1, 1}, {2, 2}, {5, 3}} {
		clk := newFakeClock()
		s := New(Config{MaxRuns: 4, Reserve: 1, FloodRuns: tt.floodRuns, Recent: 100 * time.Millisecond, Clock: clk})
		victim, a, b := s.Flow("victim"), s.Flow("a"), s.Flow("b")
		v, _, _ := victim.Admit(context.Background(), time.Time{}, nil)
		clk.Advance(time.Millisecond)
		v.Done()
		var runs []Ticket
		var queued []<-chan result
		for i := range 4 { // two floods, two runs each
			f := a
			if i%2 == 1 {
				f = b
			}
			c := admitAsync(f, context.Background(), time.Time{}, nil)
			if i < tt.want {
				runs = append(runs, got(t, c, "a flood's run within its slots").t)
				continue
			}
			waitFor(t, "flood queued", func() bool { return f.queued() >= 1 })
			queued = append(queued, c)
		}
		if n := s.running_(); n != tt.want {
			t.Fatalf("FloodRuns %d: %d flood runs on the device with the victim about, want %d", tt.floodRuns, n, tt.want)
		}
		if v, wait, _ := victim.Admit(context.Background(), time.Time{}, nil); wait != 0 {
			t.Fatalf("FloodRuns %d: the victim waited %v", tt.floodRuns, wait)
		} else {
			v.Done()
		}
		clk.Advance(100 * time.Millisecond) // the victim quiet for Recent: every slot is the floods'
		for _, c := range queued {
			runs = append(runs, got(t, c, "a flood's run with nobody about").t)
		}
		if n := s.running_(); n != 4 {
			t.Fatalf("FloodRuns %d: %d runs with nobody about, want all 4", tt.floodRuns, n)
		}
		for _, tk := range runs {
			tk.Done()
		}
	}
}

// What the list of light functions about costs a flood's run: it is
// scanned at every admission (floodLimit), under the scheduler's lock, and
// with a hold of a second it holds every light function that ran in the
// last second. The fake clock stands still: all n stay about.
func BenchmarkAdmitDoneBesideLightFunctions(b *testing.B) {
	for _, n := range []int{0, 10, 100, 1000, 10000} {
		b.Run(fmt.Sprintf("light=%d", n), func(b *testing.B) {
			s := New(Config{MaxRuns: 4, Reserve: 1, Clock: newFakeClock()})
			ctx := context.Background()
			for i := range n {
				tk, _, _ := s.Flow(fmt.Sprint("light-", i)).Admit(ctx, time.Time{}, nil)
				tk.Done()
			}
			f := s.Flow("flood")
			b.ReportAllocs()
			for b.Loop() {
				tk, _, _ := f.Admit(ctx, time.Time{}, nil)
				tk.Done()
			}
		})
	}
}

// The fast path (a free slot, nobody waiting) allocates nothing.
func TestAdmitAllocatesNothing(t *testing.T) {
	s := New(Config{MaxRuns: 2, Reserve: 1})
	f := s.Flow("a")
	ctx := context.Background()
	n := testing.AllocsPerRun(1000, func() {
		tk, _, err := f.Admit(ctx, time.Time{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		tk.Done()
	})
	if n != 0 {
		t.Fatalf("%v allocations per run", n)
	}
}

func TestParseClass(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want Class
		ok   bool
	}{{"", Default, true}, {"latency", Latency, true}, {"default", Default, true}, {"batch", Batch, true}, {"high", Default, false}} {
		c, err := ParseClass(tt.in)
		if c != tt.want || (err == nil) != tt.ok {
			t.Errorf("ParseClass(%q) = %v, %v", tt.in, c, err)
		}
	}
}

func BenchmarkAdmitDone(b *testing.B) {
	s := New(Config{MaxRuns: 2, Reserve: 1})
	f := s.Flow("a")
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		tk, _, _ := f.Admit(ctx, time.Time{}, nil)
		tk.Done()
	}
}

// A flood that is idle for a moment (between its runs) is not light: no
// slot is kept for it, and the other flood may take every slot.
func TestReserveIsNotForFloods(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 2, Reserve: 1, Recent: 100 * time.Millisecond, Clock: clk})
	a, b := s.Flow("a"), s.Flow("b")
	b1, _, _ := b.Admit(context.Background(), time.Time{}, nil)
	b2, _, _ := b.Admit(context.Background(), time.Time{}, nil) // b had two at once
	clk.Advance(time.Millisecond)
	b1.Done()
	b2.Done() // b idle, but a flood
	for i := 0; i < 2; i++ {
		if _, wait, err := a.Admit(context.Background(), time.Time{}, nil); err != nil || wait != 0 {
			t.Fatalf("a's run %d waited %v (%v): a slot was kept for a flood", i, wait, err)
		}
	}
}

// A Done that comes after its run gave its slot up at the deadline is
// ignored, even once the run's record was reused and ended by another run
// (it once read the record's cleared flow and crashed the server).
func TestLateDoneAfterExpiry(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 1, Clock: clk})
	a, b := s.Flow("a"), s.Flow("b")
	stuck, _, _ := a.Admit(context.Background(), clk.Now().Add(10*time.Millisecond), nil)
	cb := admitAsync(b, context.Background(), time.Time{}, nil)
	waitFor(t, "b queued", func() bool { return b.queued() == 1 })
	clk.Advance(10 * time.Millisecond) // stuck expires; b gets its slot (and its record)
	got(t, cb, "b").t.Done()           // the record ends again: spare, no flow
	stuck.Done()                       // late
	stuck.Done()                       // and twice
	if n := s.running_(); n != 0 {
		t.Fatalf("%d runs on the device, want 0", n)
	}
	if _, wait, err := a.Admit(context.Background(), time.Time{}, nil); err != nil || wait != 0 {
		t.Fatalf("the device is not free after the late Done: %v, %v", wait, err)
	}
}

// A function that used the device alone for a long time is not starved
// when another wakes: virtual time moved with its runs, so the newcomer
// starts level with it, not an hour of credit ahead.
func TestNoCreditFromAnotherFunctionsSoloTime(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 1, Clock: clk})
	a, b := s.Flow("a"), s.Flow("b")
	for i := 0; i < 1000; i++ { // a alone: admitted at once, never queued
		tk, _, _ := a.Admit(context.Background(), time.Time{}, nil)
		clk.Advance(time.Millisecond)
		tk.Done()
	}
	runs := serial(t, clk, 400, func(*Flow) time.Duration { return time.Millisecond }, a, a, b, b)
	if runs[a] < 150 || runs[b] < 150 {
		t.Fatalf("a %d, b %d of 400 runs: want about half each", runs[a], runs[b])
	}
}

// Without a reserve the list of recently idle flows is still pruned: it
// would otherwise keep every flow ever seen, which Alone walks.
func TestIdleFlowsPrunedWithoutReserve(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 1, Clock: clk})
	for i := range 500 {
		s.Flow(fmt.Sprintf("f%d", i)).Touch()
	}
	clk.Advance(time.Hour) // past Recent for all of them
	a := s.Flow("a")
	tk, _, err := a.Admit(t.Context(), time.Time{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tk.Done()
	s.mu.Lock()
	n := idleLen(s)
	s.mu.Unlock()
	if n > 1 {
		t.Fatalf("%d flows listed as recently idle an hour after they were: want at most a's", n)
	}
	if !a.Alone() {
		t.Fatal("a is not alone among flows idle for an hour")
	}
}

// enter is admit's way in without the wait: a run started where a slot is
// free, or queued and dispatched (join, then kick).
func (s *Scheduler) enter(f *Flow, now, deadline time.Time, hold time.Duration) (Ticket, *waiter) {
	t, w, _ := s.join(f, now, deadline, hold)
	if w != nil {
		s.kick(now)
	}
	return t, w
}

// timersArmed is how many of the clock's timers are armed and not yet run.
func (c *fakeClock) timersArmed() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, t := range c.timers {
		if !t.stopped {
			n++
		}
	}
	return n
}
