package sched

import (
	"math"
	"slices"
	"time"
)

func init() {
	RegisterPolicy(DefaultPolicy, func(maxWait time.Duration) Policy { return NewWFQ(maxWait) })
}

// WFQ is the default Policy: weighted fair queuing on device time, within
// strict priority classes, with a bound on waiting.
//
// Each flow has a virtual time, the device time it was charged divided by
// its weight; the waiting flow of the highest class with the smallest
// virtual time goes next, so backlogged flows get device time in
// proportion to their weights whatever their runs cost. A run is charged an
// estimate of its cost when it starts (the flow's recent mean; so a flow
// cannot take every slot before its first run is charged) and the
// difference when it ends. Each class has its clock, the largest tag a
// run of the class started at, or where that run went out of fair order
// (a light function's run in its kept slot) the least tag of its class's
// flows with runs waiting; a flow that wakes from idle
// starts at most wakeLag of device time behind its class's clock: time a
// flow did not use goes to the busy ones (work conservation), banked only
// up to that. One clock for
// every class, moved by every run started, left a flow backlogged below a
// busier class (or beside a low-share light function's runs) behind it, and
// a flow that woke beside that one had nothing until it caught up. A
// class held back by higher ones longer than maxWait since its last run
// ended and its last turn started has a turn: its next run in fair order,
// of its flows without a turn's run on the device, goes first, while
// fewer than maxTurns turns' runs are on the device (Pick): priorities
// order runs but starve none.
type WFQ struct {
	maxWait time.Duration
	vnow    [numClasses]float64 // each class's virtual time (Started)
	// base counts the vQuantum taken off the clock and every tag so far
	// (Started): tags are brought to it as they are read (state).
	base int64
	// Starvation (Pick), per class. behind[c] is since when class c has
	// been held back by higher ones (zero: it is not): from the first
	// pick that passed its runs over for a higher class's, backdated to
	// when they queued behind one, but not past the last end of a run of
	// c (ended: until then c held a slot) nor the last start of its turn
	// (lastTurn). It holds while every pick finds c's runs queued below a
	// higher class's, and ends with c's turn: a run of c that Pick sends
	// out of priority order. Per pick, not per moment: between a
	// closed-loop flood's runs its queue is empty for microseconds, and
	// counted so a flood of two clients would hold every lower class back
	// for good.
	behind   [numClasses]time.Time
	ended    [numClasses]time.Time
	lastTurn [numClasses]time.Time
	// turns are the turns' runs on the device. A flow with one has no
	// other turn until it ends: counted from the turn's start, a backlog
	// of runs longer than maxWait was held back again as each ended, and
	// took every turn from a latency flood. Its class's other flows do:
	// while one flow's 25 s run held its class's only turn, another's
	// 10 ms runs waited 25 s beside a flood turning the other slots over.
	// At most maxTurns of them at once, every class's together: per
	// class, two lower classes' backlogs of long runs took every slot.
	turns []turn
	given *Flow // the flow Pick last sent out of priority order, for Started
}

// turn is a run that a class's turn started: its flow, class and start.
type turn struct {
	f  *Flow
	c  Class
	at time.Time
}

// vQuantum is what the clock and the tags are moved back by at a time,
// once the clock reaches twice it. Virtual time is device ns over the
// weight, a float64: a year of a share-0.01 function's runs makes it 3e18,
// where a float64 steps by 512 ns and a share-1000 function's 100 us runs
// (100 ns each) would no longer move its tag, winning every pick. Kept
// under 2^41 it steps by under a thousandth of a ns. A power of two, so
// that every subtraction near the clock is exact: order and differences
// stay as they were.
const vQuantum = 1 << 40

// NewWFQ returns the default policy; maxWait bounds how long a run of a
// lower class waits behind higher classes.
func NewWFQ(maxWait time.Duration) *WFQ { return &WFQ{maxWait: maxWait} }

type wfqFlow struct {
	tag  float64 // virtual time: device ns charged / weight
	est  float64 // the flow's recent mean run, ns
	base int64   // WFQ.base the tag is measured from
}

// state is f's, its tag brought to the clock's base: a flow's tag is
// moved back only when it is next read, so that moving the clock back
// need not visit every flow.
func (w *WFQ) state(f *Flow) *wfqFlow {
	st, _ := f.PolicyData.(*wfqFlow)
	if st == nil {
		// A new flow starts at its class's clock, as one that wakes: at
		// 0, after the clock had moved back below it (Started), it sat
		// up to a quantum behind its class's backlogged flows, and
		// Reweighed took that for a lead and scaled it.
		st = &wfqFlow{base: w.base, tag: w.vnow[f.Class()]}
		f.PolicyData = st
	}
	if st.base != w.base {
		st.tag -= float64(w.base-st.base) * vQuantum
		st.base = w.base
		// A tag that lagged the clock by more than a quantum (a flow
		// backlogged below a busier class) would land where float64
		// steps by hundreds of ns: all such flows tie, oldest first.
		st.tag = math.Max(st.tag, -vQuantum)
	}
	return st
}

// Woke implements Policy: a flow that wakes keeps at most wakeLag of
// device time of what it lagged its class's clock by.
func (w *WFQ) Woke(f *Flow, now time.Time) {
	st := w.state(f)
	st.tag = math.Max(st.tag, w.kept(f))
}

// kept is the least tag a flow that wakes keeps: wakeLag of device time
// behind its class's clock.
func (w *WFQ) kept(f *Flow) float64 {
	return w.vnow[f.Class()] - float64(wakeLag)/f.Weight()
}

// wakeLag is the most device time a flow keeps of its lag behind its
// class's clock as it wakes or a run of it arrives at an empty queue (its
// weight's worth of virtual time); the rest went to the flows that were
// busy (work conservation). Kept whole, a flow that asked for one slot of
// four beside a flood banked 20 s of lag in 20 s and then took every slot
// from the flood for 10 s. Kept at none, a flow of closed-loop clients
// asking for about its share (a body's pieces, between which its socket
// fills) found its queue empty at many arrivals while its other runs were
// in flight, the clock moved on by the other flow's starts meanwhile, and
// lost its turns with its lag: a 4 MB flood at share 3 lost 0.68 s of
// virtual time in about 2,000 wakes and such arrivals in 5 s of the
// server's I/O (docs/host-runs/2026-12-06-wfq-lag-lost-instrumented.txt;
// given back, the split of the server's I/O moved no further than its runs'
// spread: BENCHMARKS.md).
// Bounded in device time, not virtual: 10 ms of virtual time at share
// 1000 was 10 s of every slot, the others' runs waiting meanwhile (as
// EEVDF bounds a sleeper's lag in real time whatever its weight).
const wakeLag = 10 * time.Millisecond

// Started implements Policy. The run is charged the flow's estimate now,
// so that a flow cannot take every free slot before its first run ends;
// a flow with no run ended yet is charged initialEst. Virtual time moves
// to the flow's tag as its run starts (start-time fair queuing): a flow
// that ran alone for an hour does not leave the clock behind, to be
// starved by whoever wakes next.
func (w *WFQ) Started(f *Flow, now time.Time) float64 {
	st := w.state(f)
	c := f.Class()
	// Honoured only for the pick's own run, started while it is still
	// queued (dispatch): a pick whose run dispatch refused (its deadline
	// passed) leaves given set, and the flow's next run, started on a
	// free slot with nothing queued (join), was taken for a turn.
	if f == w.given && len(f.queue) > 0 {
		w.turns = append(w.turns, turn{f, c, now})
		w.behind[c], w.lastTurn[c] = time.Time{}, now
	}
	w.given = nil
	w.vnow[c] = math.Max(w.vnow[c], math.Min(st.tag, w.floor(f, now)))
	if w.vnow[c] >= 2*vQuantum {
		// Every clock and tag moves back alike (one base); a clock left
		// more than a quantum behind is where such tags are (state).
		k := math.Floor(w.vnow[c] / vQuantum)
		for i := range w.vnow {
			w.vnow[i] = math.Max(w.vnow[i]-k*vQuantum, -vQuantum)
		}
		w.base += int64(k)
		st = w.state(f)
	}
	est := st.est
	if est == 0 {
		est = initialEst
	}
	// What it returns is the virtual time charged, not the estimate:
	// the run's end takes back what its start added, at the weight it
	// was added at, though the weight changed meanwhile (Flow.Set).
	charged := est / f.Weight()
	st.tag += charged
	return charged
}

// floor is the least tag of the flows of f's class with runs waiting, f
// aside (+Inf for none): where a run goes before them out of fair order,
// its class's clock moves no further, or a flow waking beside them would
// start ahead of them and wait until they caught up. For a light
// function's run in its kept slot, running ones count too: a flood with
// every run in flight and none queued is still busy, and a low-share light
// function's runs dragged the clock past it, by a second of virtual time
// per 10 ms run at share 0.01, without bound. A run in flight counts at what it has had
// so far past its charge: counted where it started, one 10-minute run
// held its class's clock for its length, and a flow that woke meanwhile
// took every run from the flows that had run beside it.
func (w *WFQ) floor(f *Flow, now time.Time) float64 {
	least := math.Inf(1)
	if f.s == nil {
		return least
	}
	for _, g := range f.s.waiting {
		if g != f && g.Class() == f.Class() {
			least = math.Min(least, w.state(g).tag)
		}
	}
	if !(f.listed && f.s.light(f, now)) {
		// Any other run is in fair order among the flows that wait: a
		// run in flight held the clock at its flow's pace, one slot's
		// worth, while a flood used the others and ran ahead of it, to
		// be starved by that flow, or one that woke, later.
		return least
	}
	for _, r := range f.s.running { // at most MaxRuns
		if g := r.f; g != nil && g != f && g.Class() == f.Class() {
			had := float64(now.Sub(r.start)) / g.Weight()
			least = math.Min(least, w.state(g).tag+math.Max(0, had-r.charged))
		}
	}
	return least
}

// initialEst is a flow's estimated run before any of its runs ended (ns).
const initialEst = float64(time.Millisecond)

// Ended implements Policy: the charge is corrected to what the run took,
// over the flow's weight now. charged (Started's) is virtual time: taken
// back whole, not (ran - charged) over the weight now, which after a
// share went from 1000 to 0.01 during a run shorter than its estimate
// moved the tag back by that estimate over 0.01.
func (w *WFQ) Ended(f *Flow, ran time.Duration, charged float64, now time.Time) {
	st := w.state(f)
	st.tag += float64(ran)/f.Weight() - charged
	if st.est == 0 {
		st.est = float64(ran)
	} else {
		st.est += (float64(ran) - st.est) / 8
	}
	w.ended[f.Class()] = now
	w.turnOver(f, now)
}

// Charged implements Policy: time used beside runs moves the flow's
// virtual time on as a run's would. An idle flow is charged from where it
// would wake (kept: wakeLag of device time behind the clock) when it is
// further behind (its tag is raised there when it wakes: a charge below
// would be lost); a flow with runs waiting or
// running from its own tag, which may lag the clock (a lower class's while
// a higher one runs) and must keep its place against its class's others.
// A charge never moves a tag back, and moves it at most maxAhead of device
// time past the clock, so that a long stretch of charges while idle is not
// a debt that keeps the flow off the device for as long.
func (w *WFQ) Charged(f *Flow, d time.Duration, now time.Time) {
	st := w.state(f)
	vnow := w.vnow[f.Class()]
	from := st.tag
	if !f.active {
		from = math.Max(from, w.kept(f))
	}
	wt := f.Weight()
	st.tag = math.Max(st.tag, math.Min(from+float64(d)/wt, vnow+float64(maxAhead)/wt))
}

// maxAhead bounds what charges beside runs put a flow ahead of the clock.
const maxAhead = time.Second

// Reweighed implements Policy. A tag is the flow's place before its runs
// in flight started, plus what they were charged ahead (inflight), each
// part converted on its own. The place, where ahead of the clock, is
// device time the flow used (its runs, its charges beside them) over its
// weight then: the lead is kept as that device time over the weight now,
// so a share raised from 0.01 to 1000 after a 10 ms run waits for the
// others to use 10 us of it, not a second, and one lowered waits longer.
// A place at or behind the clock is left: behind it is a flow's place
// among its own class's, below a busier class's clock, which scaling
// would reorder. A flow moved to another class takes the new class's
// clock (no lag kept, unlike one that wakes there), with its lead over its
// old class's clock: behind it was among its old class's flows (a batch flow lagging
// below a latency flood), and taken into the new class it would take
// every run until it caught up, owed by nobody there. The runs in flight are always converted (their charges
// ahead are device time over the old weight), so that each run's end
// takes back exactly what the tag holds of it, wherever the clock stands
// (another flow's start may have moved it into their charges).
func (w *WFQ) Reweighed(f *Flow, old float64, oldClass Class, inflight float64, now time.Time) float64 {
	if f.PolicyData == nil {
		// A flow made and set at once (a function's first placement):
		// it starts at its class's clock (state), with no lead over
		// the class it was made in to convert, nor runs in flight.
		w.state(f)
		return 1
	}
	st := w.state(f)
	k := old / f.Weight()
	base := st.tag - inflight
	if lead := base - w.vnow[oldClass]; lead > 0 {
		base = w.vnow[oldClass] + lead*k
	}
	if f.Class() != oldClass {
		// Its lead over its old class's clock it keeps over the new
		// one's; a lag (owed by its old class's flows) it does not.
		base = w.vnow[f.Class()] + math.Max(0, base-w.vnow[oldClass])
	}
	st.tag = base + inflight*k
	return k
}

// Pick implements Policy. The highest class with a run in waiting is
// served, its flows in fair order (the least virtual time, then the oldest
// run), unless a lower class has been held back by higher ones past
// maxWait (starved) and fewer than maxTurns turns' runs are on the device:
// then its flow next in fair order of those without a turn's run on the
// device goes instead, the class held back longest first. Counted from
// its runs' age, a lower class's backlog, whose runs age in its own queue,
// was always past maxWait and went first at every pick: runs went in
// arrival order across classes, and the split went by client count. A
// turn goes in its class's fair order, not to its oldest run, which is a
// deep backlog's: by age, a flow's part of its class's turns went by
// client count too.
func (w *WFQ) Pick(waiting []*Flow, now time.Time) int {
	var q queued
	for i, f := range waiting {
		c := f.Class()
		q.all[c].add(w, waiting, i)
		if len(w.turns) > 0 && !w.inTurn(f) {
			q.free[c].add(w, waiting, i)
		}
	}
	if len(w.turns) == 0 {
		q.free = q.all // the usual case: no second pass of fair order
	}
	top := Class(0)
	for q.all[top].next == 0 { // waiting is never empty
		top++
	}
	// Where some flows with runs queued are not in waiting (at their
	// limits: Config.Reserve's kept slots, SharedRuns), a class served
	// here may still be held back where they compete: a light batch
	// function in its kept slot does not serve a batch flood.
	s := waiting[0].s
	all := s == nil || len(waiting) == len(s.waiting)
	w.given = nil
	if c, ok := w.starved(&q, top, all, len(w.turns) < maxTurns(s), now); ok {
		i := q.free[c].next - 1
		w.given = waiting[i]
		return i
	}
	return q.all[top].next - 1
}

// queued is what Pick found in waiting, per class: of all its flows, and
// of those without a turn's run on the device (free: those a turn may go
// to).
type queued struct{ all, free [numClasses]head }

// head is a class's flow next in fair order, plus 1 (0: none), and its
// oldest run in waiting.
type head struct {
	next   int
	oldest time.Time
}

// add counts waiting[i] in h.
func (h *head) add(w *WFQ, waiting []*Flow, i int) {
	f := waiting[i]
	if h.next == 0 || w.ahead(f, waiting[h.next-1]) {
		h.next = i + 1
	}
	if o := f.Oldest(); h.oldest.IsZero() || o.Before(h.oldest) {
		h.oldest = o
	}
}

// starved brings behind up to this pick (q, as Pick found waiting; top,
// the highest class there) and returns the class held back past maxWait
// the longest, if any (of two held back as long, the higher), where a
// turn may start (open: fewer than maxTurns on the device).
func (w *WFQ) starved(q *queued, top Class, all, open bool, now time.Time) (Class, bool) {
	var (
		found        bool
		which        Class
		since, above time.Time // above: the oldest run in waiting of a class above c
	)
	for c := range numClasses {
		free := q.free[c]
		switch {
		case c > top && free.next > 0:
			if w.behind[c].IsZero() {
				// Its runs were queued behind a higher class's
				// before this pick (another's run held the slot).
				w.behind[c] = later(later(free.oldest, above), later(w.ended[c], w.lastTurn[c]))
			}
			// Not before its oldest run queued: behind may be left
			// from runs that gave up since (a pick where some flows
			// were at their limits leaves it).
			if s := later(w.behind[c], free.oldest); open && now.Sub(s) > w.maxWait && (!found || s.Before(since)) {
				found, which, since = true, c, s
			}
		case all:
			// Nothing above it waits, or it has no run queued but
			// those of flows whose turn's run is on the device:
			// held back by none.
			w.behind[c] = time.Time{}
		}
		if o := q.all[c].oldest; q.all[c].next > 0 && (above.IsZero() || o.Before(above)) {
			above = o
		}
	}
	return which, found
}

// maxTurns is how many turns' runs may be on the device at once: half the
// slots a flood may have (rounded up), so that backlogs of long runs in
// lower classes leave the rest to the higher ones, and a long run's turn
// leaves a slot to its class's other flows' turns on a GPU's defaults (4
// slots, 1 kept).
func maxTurns(s *Scheduler) int {
	if s == nil {
		return 1
	}
	return max(1, (s.cfg.MaxRuns-s.cfg.Reserve+1)/2)
}

// inTurn says whether a turn's run of f, in its class now, is on the device.
func (w *WFQ) inTurn(f *Flow) bool {
	for _, t := range w.turns { // at most maxTurns
		if t.f == f && t.c == f.Class() {
			return true
		}
	}
	return false
}

// ahead says whether f goes before g in fair order.
func (w *WFQ) ahead(f, g *Flow) bool {
	ft, gt := w.state(f).tag, w.state(g).tag
	return ft < gt || ft == gt && f.Oldest().Before(g.Oldest())
}

// turnOver ends the turns whose runs were f's where those runs are off
// the device (f's run that ended, or an earlier one).
func (w *WFQ) turnOver(f *Flow, now time.Time) {
	w.turns = slices.DeleteFunc(w.turns, func(t turn) bool {
		over := t.f == f && !t.running()
		if over {
			w.ended[t.c] = now // its class, were f moved since
		}
		return over
	})
}

// running says whether the turn's run is still on the device.
func (t turn) running() bool {
	if t.f.s == nil {
		return false
	}
	for _, r := range t.f.s.running { // at most MaxRuns
		if r.f == t.f && r.start.Equal(t.at) {
			return true
		}
	}
	return false
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
