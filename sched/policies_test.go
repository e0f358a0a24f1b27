package sched

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// Policies register themselves and are made by name; FIFO ignores
// weights: with three clients each, 3:1 weights split device time by the
// clients, half and half, where WFQ splits it 3:1.
func TestPoliciesByName(t *testing.T) {
	if got := Policies(); !slices.Contains(got, "wfq") || !slices.Contains(got, "fifo") {
		t.Fatalf("Policies() = %v, want wfq and fifo among them", got)
	}
	if _, err := NewPolicy("lottery", 0); err == nil {
		t.Fatal("NewPolicy of an unknown name: no error")
	}
	for _, tc := range []struct {
		policy string
		wantA  float64
	}{{"", 0.75}, {"wfq", 0.75}, {"fifo", 0.5}} {
		t.Run(tc.policy, func(t *testing.T) {
			clk := newFakeClock()
			s := New(Config{MaxRuns: 1, Clock: clk, PolicyName: tc.policy})
			a, b := s.Flow("a"), s.Flow("b")
			a.Set(3, Default)
			b.Set(1, Default)
			serial(t, clk, 400, func(*Flow) time.Duration { return time.Millisecond }, a, a, a, b, b, b)
			fa := float64(a.DeviceTime()) / float64(a.DeviceTime()+b.DeviceTime())
			if math.Abs(fa-tc.wantA) > 0.03 {
				t.Fatalf("a had %.3f of device time, want %.2f", fa, tc.wantA)
			}
		})
	}
}

// A run is charged the device time it used, when its device says: not the
// time it held its slot (which includes waiting for the device when runs
// outnumber it), but at least its slot time over the device's slots, and
// more than its slot time where its measure is its own (CPU time on
// several threads; it was cut to its slot time, so a chain on 4 threads
// got 4 times its share), up to every slot's.
func TestChargeIsTheDeviceTimeUsed(t *testing.T) {
	for _, tc := range []struct {
		name       string
		held, used time.Duration
		want       time.Duration
	}{
		{"unknown: the slot time", 8 * time.Millisecond, 0, 8 * time.Millisecond},
		{"used less than held (waited for a CPU)", 8 * time.Millisecond, 3 * time.Millisecond, 3 * time.Millisecond},
		{"a sleeping run: the slot's share", 8 * time.Millisecond, time.Microsecond, 2 * time.Millisecond},
		{"more than held (a chain on several threads): what it used", 8 * time.Millisecond, 20 * time.Millisecond, 20 * time.Millisecond},
		{"more than every slot's time (no measure): every slot's time", 8 * time.Millisecond, time.Hour, 32 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newFakeClock()
			s := New(Config{MaxRuns: 4, Clock: clk})
			f := s.Flow("f")
			tk, _, err := f.Admit(t.Context(), time.Time{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			clk.Advance(tc.held)
			tk.DoneUsed(clk.Now(), tc.used)
			if got := f.DeviceTime(); got != tc.want {
				t.Fatalf("charged %v, want %v", got, tc.want)
			}
		})
	}
}

// Where a run's own measure of its device time is a span other runs' work
// falls in (Capacity: a GPU's events), runs in flight together split the
// device's time: what all of them are charged never passes the time the
// device was in use, and a run alone is charged what it measured.
func TestChargeSplitsOverlappingRuns(t *testing.T) {
	ms := time.Millisecond
	type span struct {
		start, end time.Duration // from the test's start
		used       time.Duration // what the device measured
	}
	for _, tc := range []struct {
		name     string
		capacity float64
		runs     []span
		want     []time.Duration
	}{
		{"alone: what it measured", 1, []span{{0, 8 * ms, 5 * ms}}, []time.Duration{5 * ms}},
		{"four at once, each span the whole: a quarter each", 1,
			[]span{{0, 8 * ms, 8 * ms}, {0, 8 * ms, 8 * ms}, {0, 8 * ms, 8 * ms}, {0, 8 * ms, 8 * ms}},
			[]time.Duration{2 * ms, 2 * ms, 2 * ms, 2 * ms}},
		{"staggered: alone, then halves", 1, []span{{0, 4 * ms, 4 * ms}, {2 * ms, 6 * ms, 4 * ms}},
			[]time.Duration{3 * ms, 3 * ms}},
		{"measured less than its part: what it measured", 1, []span{{0, 8 * ms, 8 * ms}, {0, 8 * ms, ms}},
			[]time.Duration{4 * ms, 2 * ms}}, // the second's floor is its slot time over 4 slots
		{"capacity 2: two at once run at full speed", 2,
			[]span{{0, 8 * ms, 8 * ms}, {0, 8 * ms, 8 * ms}, {0, 8 * ms, 8 * ms}, {0, 8 * ms, 8 * ms}},
			[]time.Duration{4 * ms, 4 * ms, 4 * ms, 4 * ms}},
		{"capacity 0: nothing split", 0, []span{{0, 8 * ms, 8 * ms}, {0, 8 * ms, 8 * ms}},
			[]time.Duration{8 * ms, 8 * ms}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newFakeClock()
			s := New(Config{MaxRuns: 4, Clock: clk, Capacity: tc.capacity})
			t0 := clk.Now()
			flows := make([]*Flow, len(tc.runs))
			tickets := make([]Ticket, len(tc.runs))
			// Events in time order: starts before ends at the same moment.
			type event struct {
				at  time.Duration
				i   int
				end bool
			}
			var evs []event
			for i, r := range tc.runs {
				evs = append(evs, event{r.start, i, false}, event{r.end, i, true})
			}
			slices.SortStableFunc(evs, func(a, b event) int {
				if a.at != b.at {
					return int(a.at - b.at)
				}
				if a.end == b.end {
					return 0
				}
				if b.end {
					return -1
				}
				return 1
			})
			for _, ev := range evs {
				clk.Advance(t0.Add(ev.at).Sub(clk.Now()))
				if !ev.end {
					flows[ev.i] = s.Flow(string(rune('a' + ev.i)))
					tk, _, err := flows[ev.i].Admit(t.Context(), time.Time{}, nil)
					if err != nil {
						t.Fatal(err)
					}
					tickets[ev.i] = tk
					continue
				}
				tickets[ev.i].DoneUsed(clk.Now(), tc.runs[ev.i].used)
			}
			for i, f := range flows {
				if got := f.DeviceTime(); got != tc.want[i] {
					t.Errorf("run %d charged %v, want %v", i, got, tc.want[i])
				}
			}
		})
	}
}

// However runs overlap, what a device of capacity 1 charges them in all is
// at most the time some run was in flight, and a run past its deadline,
// ended by the Scheduler, is charged its part too.
func TestSplitChargesNeverPassTheDevicesTime(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 4, Clock: clk, Capacity: 1})
	rng := rand.New(rand.NewPCG(1, 2))
	var open []Ticket
	var flows []*Flow
	inUse := time.Duration(0)
	for step := 0; step < 2000; step++ {
		d := time.Duration(rng.IntN(500)+1) * time.Microsecond
		if len(open) > 0 {
			inUse += d
		}
		clk.Advance(d)
		if len(open) < 4 && (len(open) == 0 || rng.IntN(2) == 0) {
			f := s.Flow(string(rune('a' + rng.IntN(6))))
			deadline := time.Time{}
			if rng.IntN(10) == 0 {
				deadline = clk.Now().Add(time.Millisecond) // expires unless it ends first
			}
			tk, _, err := f.Admit(t.Context(), deadline, nil)
			if err != nil {
				t.Fatal(err)
			}
			open, flows = append(open, tk), append(flows, f)
			continue
		}
		i := rng.IntN(len(open))
		// The device measured the whole span: the worst case for a sum.
		open[i].DoneUsed(clk.Now(), clk.Now().Sub(open[i].r.start)+time.Hour)
		open = slices.Delete(open, i, i+1)
		// A run the Scheduler ended at its deadline left running: drop it
		// from open once its ticket is stale, as its slot is free.
		open = slices.DeleteFunc(open, func(tk Ticket) bool { return tk.r.gen != tk.gen })
	}
	for _, tk := range open {
		tk.DoneUsed(clk.Now(), time.Hour)
	}
	var sum time.Duration
	seen := map[*Flow]bool{}
	for _, f := range flows {
		if !seen[f] {
			seen[f] = true
			sum += f.DeviceTime()
		}
	}
	if sum > inUse || sum < inUse*9/10 {
		t.Fatalf("charged %v in all while runs were in flight for %v: want at most that, and most of it", sum, inUse)
	}
}

// A flow charged beside its runs gets fewer turns: two equal flows, one
// also charged as much again as its runs, split the device 2:1 in turns.
// A Charge (the server's CPU on its bytes) is not its device time (its
// bill); a Bill (its worker's CPU no run reported) is.
func TestChargeBesideRunsCostsTurns(t *testing.T) {
	for _, tc := range []struct {
		name   string
		charge func(*Flow, time.Duration)
		billed bool
	}{
		{"Charge", (*Flow).Charge, false},
		{"Bill", (*Flow).Bill, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newFakeClock()
			s := New(Config{MaxRuns: 1, Clock: clk})
			a, b := s.Flow("a"), s.Flow("b")
			runs := serial(t, clk, 300, func(f *Flow) time.Duration {
				if f == b {
					tc.charge(b, time.Millisecond)
				}
				return time.Millisecond
			}, a, b)
			if r := float64(runs[a]) / float64(runs[b]); r < 1.8 || r > 2.2 {
				t.Fatalf("runs a %d, b %d: want about 2:1", runs[a], runs[b])
			}
			wantB := time.Duration(runs[b]) * time.Millisecond
			if tc.billed {
				wantB *= 2
			}
			if a.DeviceTime() != time.Duration(runs[a])*time.Millisecond || b.DeviceTime() != wantB {
				t.Fatalf("device time a %v (%d runs), b %v (%d runs), want b %v", a.DeviceTime(), runs[a], b.DeviceTime(), runs[b], wantB)
			}
			// b ran half a's runs: its recent device time is a's when
			// billed as much again, about half a's when not.
			ra, _ := a.Recent()
			rb, _ := b.Recent()
			if r := rb / ra; tc.billed && r < 0.8 || !tc.billed && r > 0.7 {
				t.Fatalf("recent device time b/a %.2f (billed %v)", r, tc.billed)
			}
		})
	}
}

// A hold frees a slot its run holds too long while others wait: the slot
// goes to the next run at the hold, whatever the run's deadline.
func TestHoldFreesTheSlot(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 1, Clock: clk})
	a, b := s.Flow("a"), s.Flow("b")
	if _, _, err := a.AdmitHold(t.Context(), time.Time{}, 2*time.Millisecond, nil); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		tk, _, err := b.Admit(t.Context(), time.Time{}, nil)
		tk.Done()
		got <- err
	}()
	waitFor(t, "b queued", func() bool { return b.queued() == 1 })
	clk.Advance(time.Millisecond)
	select {
	case <-got:
		t.Fatal("admitted before the hold ended")
	default:
	}
	clk.Advance(time.Millisecond)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if d := a.DeviceTime(); d != 2*time.Millisecond {
		t.Fatalf("the run held 2 ms and was charged %v", d)
	}
}

// A charge beside runs moves a flow's virtual time on from where it
// stands: from wakeLag behind the clock for an idle flow further behind
// (what it keeps as it wakes), from its own tag for
// one with runs waiting (it may lag the clock behind a higher class), never
// back, and at most maxAhead past the clock.
func TestChargedMovesTheTagOn(t *testing.T) {
	ms := float64(time.Millisecond)
	for _, c := range []struct {
		name      string
		active    bool
		weight    float64
		tag, vnow float64
		charge    time.Duration
		want      float64
	}{
		{"idle, far behind the clock: from wakeLag behind it", false, 1, 0, 30 * ms, time.Millisecond, 21 * ms},
		{"idle, less than wakeLag behind: from its tag", false, 1, 25 * ms, 30 * ms, time.Millisecond, 26 * ms},
		{"active, behind the clock: from its tag", true, 3, 0, 500 * ms, 300 * time.Microsecond, 0.1 * ms},
		{"ahead, under the cap: on by the charge", true, 1, 100 * ms, 0, time.Millisecond, 101 * ms},
		{"far ahead (a long run): not moved back", false, 1, 5000 * ms, 0, 100 * time.Microsecond, 5000 * ms},
		{"a long stretch of charges: capped", false, 2, 0, 10 * ms, 5 * time.Second, 10*ms + 500*ms},
		{"idle at share 1000, far behind: wakeLag of device time behind", false, 1000, 0, 30 * ms, time.Millisecond, 30*ms - 10*ms/1000 + ms/1000},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := NewWFQ(time.Second)
			s := New(Config{MaxRuns: 1, Policy: w})
			f := s.Flow("f")
			f.Set(c.weight, Default)
			w.state(f).tag, w.vnow[Default], f.active = c.tag, c.vnow, c.active
			w.Charged(f, c.charge, time.Time{})
			if got := w.state(f).tag; math.Abs(got-c.want) > 1 {
				t.Fatalf("tag %v after charging %v (weight %v, tag %v, clock %v): want %v",
					time.Duration(got), c.charge, c.weight, time.Duration(c.tag), time.Duration(c.vnow), time.Duration(c.want))
			}
		})
	}
}

// A held turn (AdmitHold) that kept its slot long with nobody waiting is
// charged what it reports, not a floor of the slot's time: a piece that
// blocked on a slow peer costs its flow at most its hold.
func TestHeldTurnChargedWhatItUsed(t *testing.T) {
	clk := newFakeClock()
	w := NewWFQ(time.Second)
	s := New(Config{MaxRuns: 2, Clock: clk, Policy: w})
	a := s.Flow("a")
	tk, _, err := a.AdmitHold(t.Context(), time.Time{}, 2*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(10 * time.Second)
	tk.DoneUsed(clk.Now(), 2*time.Millisecond)
	if d := a.DeviceTime(); d != 2*time.Millisecond {
		t.Fatalf("a turn that reported 2 ms after holding its slot 10 s was charged %v", d)
	}
	// A run admitted without a hold keeps the floor: a worker that
	// reports little but held its slot long is charged its part of it.
	tk, _, err = a.Admit(t.Context(), time.Time{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(10 * time.Second)
	tk.DoneUsed(clk.Now(), 2*time.Millisecond)
	if d := a.DeviceTime() - 2*time.Millisecond; d != 5*time.Second {
		t.Fatalf("a run that reported 2 ms after holding one of 2 slots 10 s was charged %v, want 5s", d)
	}
}

// A held turn that blocked long while nobody waited (a piece whose client
// paused its upload) gives its slot up when the next run comes, charged at
// most its hold, not all the time since it began: from then on its flow,
// backlogged beside another, gets its share of the turns at once. Charged
// the 10 s it stalled, it had none of the next 20, nor would it have for
// 10 s of the other's runs.
func TestStalledHeldTurnChargedAtMostItsHold(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 1, Clock: clk, Policy: NewWFQ(time.Second)})
	a, b := s.Flow("a"), s.Flow("b")
	const hold = 2 * time.Millisecond
	stalled, _, err := a.AdmitHold(t.Context(), time.Time{}, hold, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.DoneUsed(clk.Now(), hold) // expired by then: ignored
	clk.Advance(10 * time.Second)           // nobody waits: no expiry armed

	c := admitAsync(b, t.Context(), time.Time{}, nil)
	waitFor(t, "b queued", func() bool { return b.queued() == 1 })
	clk.Advance(0) // the expiry b's wait armed, due at once
	r := <-c
	if r.err != nil {
		t.Fatal(r.err)
	}
	if d := a.DeviceTime(); d != hold {
		t.Fatalf("a turn held %v (its hold) that stalled 10 s with nobody waiting was charged %v at its expiry", hold, d)
	}
	clk.Advance(time.Millisecond)
	r.t.Done()

	runs := serial(t, clk, 20, func(*Flow) time.Duration { return time.Millisecond }, a, b)
	if runs[a] < 8 {
		t.Fatalf("after its stalled turn, a had %d of the next 20 runs beside b at equal shares (b %d), want about half", runs[a], runs[b])
	}
}

// A run that gives its slot up at its hold or deadline (expire) counts in
// its flow's Overran until its holder ends it (Done), once: its holder,
// blocked, still has it (ioshare counts such a piece stalled, not moving).
// Its Done after the slot went on ends nobody else's run.
func TestOverranCountsExpiredRunsUntilDone(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 1, Clock: clk})
	a, b := s.Flow("a"), s.Flow("b")
	held, _, err := a.AdmitHold(t.Context(), time.Time{}, 2*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := admitAsync(b, t.Context(), time.Time{}, nil)
	waitFor(t, "b queued", func() bool { return b.queued() == 1 })
	clk.Advance(2 * time.Millisecond)
	r := <-c
	if r.err != nil {
		t.Fatal(r.err)
	}
	if a.Overran() != 1 || b.Overran() != 0 {
		t.Fatalf("after a's hold gave its slot to b: a overran %d, b %d; want 1, 0", a.Overran(), b.Overran())
	}
	held.Done()
	held.Done() // a second Done changes nothing
	if a.Overran() != 0 {
		t.Fatalf("a's expired run, ended, still counts overran %d", a.Overran())
	}
	if got := b.queued() + len(s.running); got != 1 {
		t.Fatalf("b's run, admitted, is not running alone after a's Done: %d queued or running", got)
	}
	r.t.Done()
	// A run past its deadline counts as well.
	tk, _, err := a.Admit(t.Context(), clk.Now().Add(time.Second), nil)
	if err != nil {
		t.Fatal(err)
	}
	c = admitAsync(b, t.Context(), time.Time{}, nil)
	waitFor(t, "b queued", func() bool { return b.queued() == 1 })
	clk.Advance(time.Second)
	if r = <-c; r.err != nil {
		t.Fatal(r.err)
	}
	if a.Overran() != 1 {
		t.Fatalf("a run past its deadline counts overran %d, want 1", a.Overran())
	}
	tk.Done()
	r.t.Done()
	if a.Overran() != 0 || len(s.running) != 0 {
		t.Fatalf("all ended: a overran %d, %d running", a.Overran(), len(s.running))
	}
}
