package sched

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// Config.MaxWait counts how long a lower class has been held back by higher
// ones, not how old its runs are: a flood's runs age in its own queue, and
// counted by age every queued run of a deep enough lower-class backlog was
// "starved", so that runs went in arrival order across classes and the split
// went by client count (a review's probes, on one slot and on a GPU's
// defaults).

// loop drives closed-loop clients through a Scheduler on a fake clock,
// synchronously (join, then kick, as enter does): no goroutines, no sleeps.
type loop struct {
	t       *testing.T
	s       *Scheduler
	clk     *fakeClock
	dur     func(*Flow) time.Duration // how long a run of the flow holds its slot
	closed  map[*Flow]bool            // flows whose clients send again as a run ends
	queued  []loopRun
	running []loopRun
	runs    map[*Flow]int           // runs admitted
	used    map[*Flow]time.Duration // slot time of runs ended
	started map[*Flow]time.Duration // the longest wait of a run admitted
}

type loopRun struct {
	f        *Flow
	w        *waiter
	t        Ticket
	arrived  time.Time
	ran, end time.Time
}

func newLoop(t *testing.T, cfg Config, dur func(*Flow) time.Duration) *loop {
	clk := newFakeClock()
	cfg.Clock = clk
	return &loop{t: t, s: New(cfg), clk: clk, dur: dur, closed: map[*Flow]bool{},
		runs: map[*Flow]int{}, used: map[*Flow]time.Duration{}, started: map[*Flow]time.Duration{}}
}

// flow makes a flow of class c, share 1, with n clients sending runs in
// a closed loop (0: runs are sent one by one, with send).
func (l *loop) flow(name string, c Class, n int) *Flow {
	f := l.s.Flow(name)
	f.Set(1, c)
	if n > 0 {
		l.closed[f] = true
	}
	for range n {
		l.send(f)
	}
	return f
}

// send queues a run of f, or starts it where a slot is free.
func (l *loop) send(f *Flow) {
	now := l.clk.Now()
	tk, w := l.s.enter(f, now, time.Time{}, 0)
	r := loopRun{f: f, w: w, t: tk, arrived: now}
	if w == nil {
		l.start(r)
		return
	}
	l.queued = append(l.queued, r)
	l.collect()
}

func (l *loop) collect() {
	for i := 0; i < len(l.queued); {
		r := l.queued[i]
		select {
		case <-r.w.ready:
			if r.w.err != nil {
				l.t.Fatal(r.w.err)
			}
			r.t = r.w.t
			l.queued = slices.Delete(l.queued, i, i+1)
			l.start(r)
		default:
			i++
		}
	}
}

func (l *loop) start(r loopRun) {
	r.ran = l.clk.Now()
	r.end = r.ran.Add(l.dur(r.f))
	l.runs[r.f]++
	l.started[r.f] = max(l.started[r.f], r.ran.Sub(r.arrived))
	l.running = append(l.running, r)
}

// step ends the run in flight that ends first; its client, in a closed
// loop, sends its next run once the freed slot went to the queue.
func (l *loop) step() {
	if len(l.running) == 0 {
		l.t.Fatal("no run in flight")
	}
	i := 0
	for j, r := range l.running {
		if r.end.Before(l.running[i].end) {
			i = j
		}
	}
	r := l.running[i]
	l.running = slices.Delete(l.running, i, i+1)
	l.clk.Advance(r.end.Sub(l.clk.Now()))
	l.used[r.f] += r.end.Sub(r.ran)
	r.t.Done()
	l.collect()
	if l.closed[r.f] {
		l.send(r.f)
	}
}

// run steps for d of the clock.
func (l *loop) run(d time.Duration) {
	end := l.clk.Now().Add(d)
	for l.clk.Now().Before(end) {
		l.step()
	}
}

// waited is the longest wait of a run of f, admitted or still queued.
func (l *loop) waited(f *Flow) time.Duration {
	w := l.started[f]
	for _, r := range l.queued {
		if r.f == f {
			w = max(w, l.clk.Now().Sub(r.arrived))
		}
	}
	return w
}

// part is f's part of the slot time of the runs ended of f and g.
func (l *loop) part(f, g *Flow) float64 {
	return float64(l.used[f]) / float64(l.used[f]+l.used[g])
}

func every(d time.Duration) func(*Flow) time.Duration {
	return func(*Flow) time.Duration { return d }
}

// A batch backlog of depth runs (one slot, 100 ms runs): each of its runs
// waits depth*100 ms in its own queue. A latency run that arrives goes
// next, after the run in flight; counted by their age, the batch runs
// queued were all past MaxWait at depth 5 and went first, in arrival
// order: the latency run waited 500 ms behind five of them.
func TestALowerClassBacklogDoesNotGoBeforeANewHigherRun(t *testing.T) {
	for _, depth := range []int{1, 2, 5, 20} {
		l := newLoop(t, Config{MaxRuns: 1, MaxWait: 200 * time.Millisecond}, every(100*time.Millisecond))
		b := l.flow("b", Batch, depth+1)
		x := l.flow("x", Latency, 0)
		l.run(5 * time.Second)
		l.send(x)
		for l.runs[x] == 0 {
			l.step()
		}
		if l.waited(x) > 100*time.Millisecond {
			t.Errorf("batch backlog %d deep: the latency run waited %v, want at most the run in flight (100ms)", depth, l.waited(x))
		}
		if l.waited(b) < time.Duration(depth)*100*time.Millisecond {
			t.Fatalf("batch backlog %d deep: its runs waited at most %v, not its depth", depth, l.waited(b))
		}
	}
}

// Two flows of share 1, one with fewer clients: what the one with fewer
// has of the device. In one class the shares split it evenly; across
// classes the lower one has a run when it has been held back past MaxWait
// since its last one ended (200 ms: 5 of every 6 runs of 50 ms are the
// higher class's). By age the lower class's backlog was always past
// MaxWait and the split went by client count: 0.20 and, on a GPU's
// defaults (4 slots, 1 kept, runs of 50 to 150 ms), 0.39.
func TestClassesSplitByPriorityNotClientCount(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	spread := func(*Flow) time.Duration {
		return 50*time.Millisecond + time.Duration(rng.Int64N(int64(100*time.Millisecond)))
	}
	for _, tc := range []struct {
		name        string
		cfg         Config
		dur         func(*Flow) time.Duration
		hi, lo      Class
		his, los    int // clients
		least, most float64
	}{
		{"one class", Config{MaxRuns: 1}, every(50 * time.Millisecond), Default, Default, 2, 8, 0.45, 0.55},
		{"latency over default", Config{MaxRuns: 1}, every(50 * time.Millisecond), Latency, Default, 2, 8, 0.82, 0.85},
		{"default over batch", Config{MaxRuns: 1}, every(50 * time.Millisecond), Default, Batch, 2, 8, 0.82, 0.85},
		{"gpu, one class", Config{MaxRuns: 4, Reserve: 1}, spread, Default, Default, 4, 8, 0.45, 0.55},
		{"gpu, default over batch", Config{MaxRuns: 4, Reserve: 1}, spread, Default, Batch, 4, 8, 0.75, 0.85},
		{"gpu, latency over batch", Config{MaxRuns: 4, Reserve: 1}, spread, Latency, Batch, 4, 8, 0.75, 0.85},
	} {
		l := newLoop(t, tc.cfg, tc.dur)
		lo := l.flow("lo", tc.lo, tc.los)
		hi := l.flow("hi", tc.hi, tc.his)
		l.run(5 * time.Minute)
		got := l.part(hi, lo)
		t.Logf("%s: %d clients of %v against %d of %v: %.3f of the device", tc.name, tc.his, tc.hi, tc.los, tc.lo, got)
		if got < tc.least || got > tc.most {
			t.Errorf("%s: %d clients of %v against %d of %v had %.3f of the device, want %.2f to %.2f", tc.name, tc.his, tc.hi, tc.los, tc.lo, got, tc.least, tc.most)
		}
	}
}

// A lower class's run waits at most about MaxWait (100 ms) plus a run
// (30 ms) behind a latency flood, however deep the flood's backlog (by
// age, a starved run went only before higher runs younger than itself,
// and waited as long as the backlog was deep: up to 300 ms), and with
// two lower classes held back together, each waits at most a run more.
func TestAFloodDoesNotPostponeALowerClassPastMaxWait(t *testing.T) {
	const run, maxWait = 30 * time.Millisecond, 100 * time.Millisecond
	for _, tc := range []struct {
		slots, flood int // the latency flood's clients
		lower        []Class
		most         time.Duration
	}{
		{1, 2, []Class{Batch}, maxWait + run},
		{1, 9, []Class{Batch}, maxWait + run},
		{4, 40, []Class{Batch}, maxWait + run},
		{1, 9, []Class{Default, Batch}, maxWait + 2*run},
		{4, 40, []Class{Default, Batch}, maxWait + run},
	} {
		l := newLoop(t, Config{MaxRuns: tc.slots, MaxWait: maxWait}, every(run))
		var lower []*Flow
		for _, c := range tc.lower {
			lower = append(lower, l.flow(c.String(), c, 1))
		}
		f := l.flow("flood", Latency, tc.flood)
		l.run(time.Minute)
		for _, g := range lower {
			if l.waited(g) > tc.most || l.runs[g] < int(time.Minute/(tc.most+run)) {
				t.Errorf("%d slots, %d latency clients beside %v: a %v run waited up to %v (%d runs in a minute), want at most %v",
					tc.slots, tc.flood, tc.lower, g.Class(), l.waited(g), l.runs[g], tc.most)
			}
		}
		if l.waited(f) < run {
			t.Fatalf("%d slots, %d latency clients: the flood's runs waited at most %v, no backlog", tc.slots, tc.flood, l.waited(f))
		}
	}
}

// The turns a class held back past MaxWait takes go to its flows in fair
// order: a one-client batch flow beside an eight-client one of the same
// share has half of them, not the turns its runs' age gives it (an
// eighth: the deep backlog's head was always older).
func TestTurnsPastMaxWaitGoInFairOrder(t *testing.T) {
	l := newLoop(t, Config{MaxRuns: 1, MaxWait: 200 * time.Millisecond}, every(50*time.Millisecond))
	deep := l.flow("deep", Batch, 8)
	one := l.flow("one", Batch, 1)
	l.flow("flood", Latency, 2)
	l.run(5 * time.Minute)
	if got := l.part(one, deep); got < 0.45 || got > 0.55 {
		t.Errorf("a one-client batch flow had %.3f of its class's turns beside an eight-client one of the same share, want about half", got)
	}
}

// A lower class's turn is not held back while its run is on the device:
// counted from the turn's start, a batch backlog of 1 s runs beside a
// latency flood of 10 ms ones was held back past MaxWait again as each
// ended, and had every run after the first (by age too: 0.003 of the
// device was the flood's). Nor does a run of its own count that held the
// slot before the flood came: counted, it made the flood wait 2 s.
func TestLongLowerRunsDoNotStarveAHigherClass(t *testing.T) {
	const long, short = time.Second, 10 * time.Millisecond
	for _, tc := range []struct {
		slots int
		least float64 // the flood's part of the device
	}{{1, 0.15}, {4, 0.7}} {
		l := newLoop(t, Config{MaxRuns: tc.slots, MaxWait: 200 * time.Millisecond}, func(f *Flow) time.Duration {
			if f.Class() == Batch {
				return long
			}
			return short
		})
		b := l.flow("b", Batch, 8)
		x := l.flow("x", Latency, 2*tc.slots)
		l.run(time.Minute)
		if got := l.part(x, b); got < tc.least || l.waited(x) > long+2*short {
			t.Errorf("%d slots: a latency flood had %.3f of the device beside a batch backlog of 1 s runs and waited up to %v, want %.2f or more and a batch run at most", tc.slots, got, l.waited(x), tc.least)
		}
	}
}

// A light function's runs in its kept slot are not its class's turns: a
// batch flood beside a light batch function and a latency flood still
// has a run each MaxWait or so. Counted as its class served, each of the
// light function's runs held the flood back afresh: 4 runs in a minute.
func TestAKeptSlotIsNotItsClassTurn(t *testing.T) {
	l := newLoop(t, Config{MaxRuns: 4, Reserve: 1, MaxWait: 200 * time.Millisecond}, every(50*time.Millisecond))
	a := l.flow("a", Batch, 8)
	light := l.flow("light", Batch, 1)
	x := l.flow("x", Latency, 8)
	l.run(time.Minute)
	if l.runs[a] < 150 || l.runs[light] < 1000 || l.runs[x] < 3000 {
		t.Errorf("in a minute of 50 ms runs: the batch flood had %d runs (want one each MaxWait and a run: 200), the light batch function %d (1200), the latency flood %d (3400)", l.runs[a], l.runs[light], l.runs[x])
	}
}

// One batch flow's long turn does not hold back its class's other flows'
// turns: beside a batch tenant of 25 s runs, a batch tenant of two clients
// of 10 ms runs still has a turn each MaxWait or so (a run each of its
// clients every two) while a latency flood of 30 ms runs turns over the
// other slots. With one turn of a class at a time, lasting until its run
// ended, the short tenant waited 25.6 s (600 ms before turns).
func TestALongTurnDoesNotHoldBackItsClassOtherFlows(t *testing.T) {
	const maxWait, long, short, flood = 200 * time.Millisecond, 25 * time.Second, 10 * time.Millisecond, 30 * time.Millisecond
	var x, y *Flow
	l := newLoop(t, Config{MaxRuns: 4, Reserve: 1, MaxWait: maxWait}, nil)
	// x's and y's first runs take a flood run's time (they are not named
	// yet), so that x has runs queued, and turns, from the start.
	l.dur = func(f *Flow) time.Duration {
		switch f {
		case x:
			return long
		case y:
			return short
		}
		return flood
	}
	x = l.flow("x", Batch, 2)
	y = l.flow("y", Batch, 2)
	z := l.flow("z", Latency, 40)
	// Past the start, where x's first turn held y's runs queued before
	// it back again from its start.
	l.run(time.Second)
	l.started[y] = 0
	l.run(time.Minute)
	// Each of y's two runs queued waits for a turn of its own: MaxWait
	// and a flood run for a slot to come free, twice, and a run of y.
	if most := 2*(maxWait+flood) + short; l.waited(y) > most {
		t.Errorf("a 10 ms batch flow beside a 25 s one waited up to %v (%d runs in a minute), want at most %v", l.waited(y), l.runs[y], most)
	}
	if l.runs[x] < 2 || l.part(z, x) < 0.5 {
		t.Errorf("in a minute: the 25 s batch flow had %d runs (want 2 or more) and the latency flood %.3f of the device beside it (want half or more)", l.runs[x], l.part(z, x))
	}
}

// A pick whose run dispatch refused (its deadline passed before its timer
// ran) makes no turn of its flow's next run: where no other pick followed
// (the refusal left no flow a candidate, and those waiting gave up), that
// run, started on a free slot with nothing queued (join), was taken for
// the refused pick's turn, and held its flow's turns back until it ended.
// The pick and the refusal are made here as dispatch makes them.
func TestARefusedPickMakesNoTurn(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 1, MaxWait: 100 * time.Millisecond, Clock: clk})
	w := s.pol.(*WFQ)
	h, b := s.Flow("h"), s.Flow("b")
	h.Set(1, Latency)
	b.Set(1, Batch)
	now := clk.Now()
	th, _ := s.enter(h, now, time.Time{}, 0)
	_, wb := s.enter(b, now, now.Add(50*time.Millisecond), 0)
	_, wh := s.enter(h, now, time.Time{}, 0)
	clk.Advance(200 * time.Millisecond)
	now = clk.Now()
	if i := w.Pick(s.waiting, now); s.waiting[i] != b {
		t.Fatalf("a batch run held back 200 ms (MaxWait 100 ms) was not picked: %v was", s.waiting[i].Class())
	}
	s.leave(b, wb) // refused: past its deadline
	s.leave(h, wh)
	th.Done()
	if tb, wb := s.enter(b, now, time.Time{}, 0); wb != nil || tb.r == nil {
		t.Fatal("a run on a free slot with nothing queued did not start")
	}
	if len(w.turns) != 0 {
		t.Errorf("a run started on a free slot after a refused pick was taken for a turn: %v", w.turns)
	}
}

// Turns' runs take at most half the slots a flood may have: four batch
// flows of 1 s runs, each held back past MaxWait beside a latency flood of
// 10 ms runs, have a turn's run in two of four slots at most, and the
// flood keeps the others. Without the bound each flow's turn took a slot
// and the flood waited a batch run.
func TestTurnsLeaveAHigherClassSlots(t *testing.T) {
	const long, short = time.Second, 10 * time.Millisecond
	l := newLoop(t, Config{MaxRuns: 4, MaxWait: 200 * time.Millisecond}, func(f *Flow) time.Duration {
		if f.Class() == Batch {
			return long
		}
		return short
	})
	var b []*Flow
	for _, name := range []string{"b1", "b2", "b3", "b4"} {
		b = append(b, l.flow(name, Batch, 1))
	}
	x := l.flow("x", Latency, 8)
	l.run(time.Second + long/2) // past the batch runs started before the flood
	l.started[x] = 0
	l.run(time.Minute)
	if most := 4 * short; l.waited(x) > most {
		t.Errorf("a latency flood beside four batch flows' turns of 1 s runs waited up to %v, want at most %v", l.waited(x), most)
	}
	for _, f := range b {
		// Two turns' runs of 1 s at once, among four flows.
		if l.runs[f] < 20 {
			t.Errorf("a batch flow of 1 s runs beside three others and a latency flood had %d runs in a minute, want about 30", l.runs[f])
		}
	}
}

// A class has a turn each MaxWait of holding back, however many of its
// flows wait: the next is counted from no earlier than the last turn's
// start. Backdated to their runs' queueing alone (behind a latency flood's
// backlog older than MaxWait), eight batch flows of 100 ms runs each found
// itself held back past MaxWait as soon as the one before it had its
// turn, and had 391 runs in a minute, not 300.
func TestAClassTurnsDoNotMultiplyWithItsFlows(t *testing.T) {
	const long, short, maxWait = 100 * time.Millisecond, 10 * time.Millisecond, 200 * time.Millisecond
	l := newLoop(t, Config{MaxRuns: 4, MaxWait: maxWait}, func(f *Flow) time.Duration {
		if f.Class() == Batch {
			return long
		}
		return short
	})
	var flows []*Flow
	for i := range 8 {
		flows = append(flows, l.flow(string(rune('a'+i)), Batch, 1))
	}
	x := l.flow("x", Latency, 100) // a backlog older than MaxWait
	l.run(time.Minute)
	b := 0
	for _, f := range flows {
		b += l.runs[f]
	}
	// One turn each MaxWait, and the runs started before the flood came.
	if most := int(time.Minute/maxWait) + len(flows); b > most || b < most/2 {
		t.Errorf("in a minute, eight batch flows of 100 ms runs had %d runs beside a latency flood of 10 ms ones (want one a MaxWait: %d at most, %d at least); the flood %d", b, most, most/2, l.runs[x])
	}
}
