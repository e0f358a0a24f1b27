package sched

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Errors Admit returns when a run is not admitted.
var (
	ErrDeadline = errors.New("the deadline passed while the run waited for the device")
	ErrGone     = errors.New("the client went away while the run waited for the device")
)

// goneEvery is how often a queued run asks whether its client is gone.
const goneEvery = 20 * time.Millisecond

// Scheduler admits the runs of one device.
type Scheduler struct {
	cfg   Config
	clock Clock
	pol   Policy

	// mu is always released by a defer: a transport recovers a panic in
	// the code it guards (the Policy's, the Clock's), and a mutex left
	// locked would hang every later request to the device while /healthz
	// still answers.
	mu      sync.Mutex
	flows   map[string]*Flow
	waiting []*Flow // flows with a run queued
	running []*run  // admitted and not ended: the runs on the device
	spare   []*run  // ended runs, reused
	// idle lists the flows that went idle light within Config.Recent
	// and have nothing running, for Reserve (idle.go); pruned as it is
	// read.
	idle idleList
	busy decayed // every flow's recent device time
	// shared is the device time one run in flight has had since the
	// Scheduler began, were the device split evenly among the runs in
	// flight at each moment (Config.Capacity), in nanoseconds; sharedAt
	// is when it was last brought up to date. A run's part of the device
	// is the difference between its end's and its start's.
	shared   float64
	sharedAt time.Time
	expiry   Timer // armed for the earliest running deadline while runs wait
	expAt    time.Time
	scratch  []*Flow
	refused  error // Refuse's: every run's answer from then on
}

// DefaultRecent is Config.Recent's default. It was 100 ms: a function
// called every 125 ms or less often then found, at each request, its
// reserve lapsed and the floods in every slot, and beside 8 clients of 4 MB
// vecadd its p99 was 23-34 ms against 3-6 ms when called every 62 ms
// (BENCHMARKS.md, "The reserve hold"). A second covers a caller that sends
// a request a second; a flood pays the reserve for a second after a light
// function's last request.
const DefaultRecent = time.Second

// DefaultOverlap is Config.Overlap's default: lightness is lost for this
// long after two runs at once, not for the hold, so that a light function
// whose requests now and then overlap (random arrivals) stays light nearly
// all the time.
const DefaultOverlap = 100 * time.Millisecond

// New returns a Scheduler for one device.
func New(cfg Config) *Scheduler {
	if cfg.MaxRuns < 1 {
		cfg.MaxRuns = 1
	}
	cfg.Reserve = min(max(cfg.Reserve, 0), cfg.MaxRuns-1)
	if cfg.SharedRuns <= 0 || cfg.SharedRuns > cfg.MaxRuns {
		cfg.SharedRuns = cfg.MaxRuns
	}
	if cfg.Recent <= 0 {
		cfg.Recent = DefaultRecent
	}
	if cfg.Overlap <= 0 {
		cfg.Overlap = DefaultOverlap
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = 200 * time.Millisecond
	}
	if cfg.Decay <= 0 {
		cfg.Decay = 10 * time.Second
	}
	if cfg.Clock == nil {
		cfg.Clock = wallClock{}
	}
	if cfg.Policy == nil {
		pol, err := NewPolicy(cfg.PolicyName, cfg.MaxWait)
		if err != nil { // callers check the name first (NewPolicy): not a user's error here
			panic("sched.New: " + err.Error())
		}
		cfg.Policy = pol
	}
	return &Scheduler{cfg: cfg, clock: cfg.Clock, pol: cfg.Policy, flows: map[string]*Flow{}}
}

// Flow is a function's share of the device: its runs queue here. Weight
// and class are the function's; accounting is read without the lock.
type Flow struct {
	s *Scheduler

	// Under s.mu.
	weight    float64
	class     Class
	queue     []*waiter // oldest first
	inFlight  int
	active    bool      // a run queued or running since the policy was told (Woke)
	lastIdle  time.Time // when it last went idle
	lastBusy  time.Time // when it last had two or more runs queued or running (see light)
	listed    bool      // see idle.go: on s.idle, or running since
	forgotten bool      // its name's Forget: never listed again
	linked    bool      // on s.idle, between idlePrev and idleNext
	idlePrev  *Flow
	idleNext  *Flow
	recent    decayed

	// PolicyData belongs to the Scheduler's Policy (set and read in its
	// calls, under the Scheduler's lock).
	PolicyData any

	deviceNs atomic.Int64 // device time of ended runs
	overran  atomic.Int32 // runs expired whose holders have not said Done (Overran)
}

// Flow returns name's flow, creating it with weight 1 and class Default.
func (s *Scheduler) Flow(name string) *Flow {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.flows[name]
	if f == nil {
		f = s.newFlow()
		s.flows[strings.Clone(name)] = f // a key kept: not a caller's borrowed bytes
	}
	return f
}

// Detached returns a new flow of weight 1 and class Default that is no
// name's (Lookup never finds it): for the last runs of a function
// forgotten meanwhile, whose name's next flow must start afresh. Like a
// forgotten flow it keeps no slots (Config.Reserve) as it goes idle.
func (s *Scheduler) Detached() *Flow {
	f := s.newFlow()
	f.forgotten = true
	return f
}

func (s *Scheduler) newFlow() *Flow { return &Flow{s: s, weight: 1, class: Default} }

// Lookup returns name's flow, or nil.
func (s *Scheduler) Lookup(name string) *Flow {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.flows[name]
}

// Forget drops name's flow (a deleted function); runs it has queued or
// running go on.
func (s *Scheduler) Forget(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.flows[name]
	if f == nil {
		return
	}
	delete(s.flows, name)
	// A deleted function keeps no slots, nor another flow from being
	// Alone: not for the rest of its hold, nor once runs it still has
	// end (they count as a flood's meanwhile).
	f.forgotten = true
	if f.listed {
		s.unlist(f)
		now := s.clock.Now()
		s.dispatch(now) // the slots it kept are the floods' now
		s.armExpiry(now)
	}
}

// Ticket is an admitted run; Done ends it. The zero Ticket is no run.
type Ticket struct {
	r   *run
	gen uint64
}

type run struct {
	s        *Scheduler // for a Done after end cleared f
	f        *Flow
	start    time.Time
	deadline time.Time     // zero: none
	charged  float64       // what the policy charged when it started
	shared   float64       // Scheduler.shared at its start
	hold     time.Duration // AdmitHold's (0: none): what it reports used is all it is charged, at most this at its expiry
	gen      uint64
	// overran is the flow of a run expire ended, until its Ticket's Done
	// (Flow.Overran): the run is not reused meanwhile, so that Done knows
	// it.
	overran *Flow
	// expiredRan is what expire charged it: its own measure, given at
	// Done, may say it used more (a host chain on several threads).
	expiredRan time.Duration
}

type waiter struct {
	arrived  time.Time
	deadline time.Time
	hold     time.Duration // AdmitHold's
	ready    chan struct{} // answered: t is set, or err
	t        Ticket
	err      error // refused by dispatch (ErrDeadline)
}

// Admit waits until a run of f may start on the device: at once when a
// slot is free and no run waits, otherwise when the policy picks it. It
// fails when ctx ends (its error), when deadline passes (ErrDeadline) or
// when gone reports the client gone (ErrGone); deadline and gone may be
// zero and nil. A ctx already ended or a deadline already passed fails at
// once, free slot or not; gone is asked only while the run waits (every
// goneEvery: it may cost a system call), never on the way to a free slot.
// A run still running at its deadline gives its slot up then, so a run
// that never ends does not hold the device. It returns how long the run
// waited.
func (f *Flow) Admit(ctx context.Context, deadline time.Time, gone func() bool) (Ticket, time.Duration, error) {
	return f.AdmitAt(ctx, f.s.clock.Now(), deadline, gone)
}

// AdmitAt is Admit for a caller that has just read the Scheduler's clock
// (the wall clock): now. A hot path reads the clock once per phase.
func (f *Flow) AdmitAt(ctx context.Context, now, deadline time.Time, gone func() bool) (Ticket, time.Duration, error) {
	return f.admit(ctx, now, deadline, 0, gone)
}

// AdmitHold is Admit for a short turn that must not block others whatever
// happens to it (the server's I/O pieces: package ioshare): once admitted
// it holds its slot at most hold, as if its deadline were then: past it,
// while runs wait, the slot goes to the next, and the run is charged what
// it held, at most hold (expire): a turn that blocked on with nobody
// waiting took nothing from anyone.
func (f *Flow) AdmitHold(ctx context.Context, deadline time.Time, hold time.Duration, gone func() bool) (Ticket, time.Duration, error) {
	return f.admit(ctx, f.s.clock.Now(), deadline, hold, gone)
}

func (f *Flow) admit(ctx context.Context, now, deadline time.Time, hold time.Duration, gone func() bool) (Ticket, time.Duration, error) {
	// Before the free slot's path too: a run admitted past its deadline
	// gives its slot up at the next expiry while its chain runs on, and a
	// cancelled request's chain would run for nobody.
	if err := ctx.Err(); err != nil {
		return Ticket{}, 0, err
	}
	if !deadline.IsZero() && !now.Before(deadline) {
		return Ticket{}, 0, ErrDeadline
	}
	s := f.s
	t, w, err := s.join(f, now, deadline, hold)
	if w == nil {
		return t, 0, err
	}
	// From here until it returns, a panic (the gone callback's, the
	// policy's in a dispatch, the Clock's) must not leave w queued, or its
	// run started and not handed back: nobody waits on w any more, and a
	// dispatch would start a run nobody owns, its slot held until its
	// deadline, or for good without one. Installed before w's first
	// dispatch (kick), so a panic there is covered too.
	defer func() {
		if v := recover(); v != nil {
			defer panic(v) // the first panic goes on up, even if giving w back panics too
			s.abandon(f, w)
		}
	}()
	s.kick(now) // a slot may be free for it (Reserve kept it from others)

	var timeout chan struct{}
	if !deadline.IsZero() {
		timeout = make(chan struct{})
		t := s.clock.AfterFunc(deadline.Sub(now), func() { close(timeout) })
		defer t.Stop()
	}
	var poll chan struct{} // closed every goneEvery while gone is set
	var pt Timer
	arm := func() {
		c := make(chan struct{})
		poll, pt = c, s.clock.AfterFunc(goneEvery, func() { close(c) })
	}
	if gone != nil {
		arm()
		defer func() { pt.Stop() }()
	}
	for {
		var why error
		select {
		case <-w.ready:
			if w.err == nil && ctx.Err() != nil {
				// Granted and cancelled both before this select, which
				// picks one at random: the request is gone, and its
				// chain must not run for nobody. The run is handed back
				// having used nothing, as one answered while it gave
				// up is below.
				w.t.Done()
				return Ticket{}, s.clock.Now().Sub(w.arrived), ctx.Err()
			}
			return w.t, s.clock.Now().Sub(w.arrived), w.err
		case <-ctx.Done():
			why = ctx.Err()
		case <-timeout:
			why = ErrDeadline
		case <-poll:
			if !gone() {
				arm()
				continue
			}
			why = ErrGone
		}
		if s.leave(f, w) {
			return Ticket{}, s.clock.Now().Sub(w.arrived), why
		}
		// Answered as it gave up: a run started is handed back (a
		// refusal's Ticket is the zero one).
		<-w.ready
		w.t.Done()
		return Ticket{}, s.clock.Now().Sub(w.arrived), why
	}
}

// join starts a run of f where a slot is free (no waiter), or queues it;
// the caller then dispatches (kick), once it is ready to take w back out
// should that panic (admit). After Refuse it does neither: its error.
func (s *Scheduler) join(f *Flow, now, deadline time.Time, hold time.Duration) (Ticket, *waiter, error) {
	s.mu.Lock()
	defer s.mu.Unlock() // see mu
	if s.refused != nil {
		return Ticket{}, nil, s.refused
	}
	if f.inFlight+len(f.queue) >= 1 {
		f.lastBusy = now // this run makes two or more
		s.place(f)       // went idle light, now a flood's: unlisted
	}
	if f.active && len(f.queue) == 0 {
		// A run arriving at an empty queue is placed as one that wakes
		// (start-time fair queuing): a flow that kept a run in flight
		// but asked for fewer slots than its share banks at most the
		// policy's bound of the rest (WFQ's wakeLag), to take from the
		// others later.
		s.pol.Woke(f, now)
	}
	if len(s.waiting) == 0 && len(s.running) < s.limit(f, now) {
		return s.start(f, deadline, hold, now), nil, nil
	}
	w := &waiter{arrived: now, deadline: deadline, hold: hold, ready: make(chan struct{}, 1)}
	if !f.active {
		f.active = true
		s.pol.Woke(f, now)
	}
	if len(f.queue) == 0 {
		s.waiting = append(s.waiting, f)
	}
	f.queue = append(f.queue, w)
	return Ticket{}, w, nil
}

// Refuse answers every run waiting for the device with err, and every
// later Admit with it too, a slot free or not: the node stops (plover
// serve's grace is over) and starts nothing more, and a run that never
// started is told so rather than cut with the process. Runs admitted go
// on. It returns how many waiting runs it answered.
func (s *Scheduler) Refuse(err error) int {
	s.mu.Lock()
	defer s.mu.Unlock() // see mu
	now := s.clock.Now()
	s.refused = err
	n := 0
	for _, f := range s.waiting {
		q := f.queue
		f.queue = nil
		for _, w := range q {
			w.err = err
			w.ready <- struct{}{}
		}
		n += len(q)
		s.fewer(f, now)
	}
	s.waiting = s.waiting[:0]
	s.armExpiry(now)
	return n
}

// kick admits what queued runs the free slots let start, and arms the
// expiry for the runs that wait.
func (s *Scheduler) kick(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock() // see mu
	s.dispatch(now)
	s.armExpiry(now)
}

// abandon gives w up for a run whose admit panicked: out of its queue, or,
// answered meanwhile, its run handed back (a refusal's and a waiter's that
// left already is the zero Ticket; a run ended already is ignored). Never
// waits on w.ready: a waiter that left is never answered, and one answered
// may have been read.
func (s *Scheduler) abandon(f *Flow, w *waiter) {
	if !s.leave(f, w) {
		// leave found w out of its queue under s.mu, where dispatch sets
		// w.t before taking it out: w.t is final.
		w.t.Done()
	}
}

// leave takes a waiter that gives up out of its queue, unless it was
// admitted meanwhile (false).
func (s *Scheduler) leave(f *Flow, w *waiter) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := slices.Index(f.queue, w)
	if i < 0 {
		return false
	}
	f.queue = slices.Delete(f.queue, i, i+1)
	now := s.clock.Now()
	if len(f.queue) == 0 {
		s.waiting = slices.DeleteFunc(s.waiting, func(g *Flow) bool { return g == f })
	}
	s.fewer(f, now)
	s.dispatch(now) // a head that left may unblock others (Reserve)
	s.armExpiry(now)
	return true
}

// Done ends the run: its slot goes to the next queued run. A ticket whose
// run gave its slot up at its deadline, or the zero Ticket, is ignored.
func (t Ticket) Done() {
	if t.r != nil {
		t.DoneAt(t.r.s.clock.Now())
	}
}

// DoneAt is Done for a caller that has just read the Scheduler's clock: now.
func (t Ticket) DoneAt(now time.Time) { t.DoneUsed(now, 0) }

// DoneUsed is DoneAt for a run whose device says how much device time it
// used (0: it does not know): the run is charged and billed that, not the
// time it held its slot, which on a device busier than its slots (the
// host device's runs outnumber its CPUs) includes the time the run waited
// for the device. Where the device's measure is a span that other runs'
// work can fall in (Config.Capacity: a GPU's events), it is charged at
// most its part of the device while it held its slot, the device split
// evenly among the runs in flight at each moment, so that what all runs
// are charged never exceeds the time the device was in use; where it is
// the run's own (the host's CPU time, which a chain on several threads
// makes more than its wall time), at most its slot time times the slots
// (a measure past that is not one). It is charged
// at least its slot time divided by the device's slots: a run that holds a
// slot while using little of the device (a sleeping kernel) still costs
// the share of the device a slot is, so that runs of that kind cannot take
// every slot for nothing.
func (t Ticket) DoneUsed(now time.Time, used time.Duration) {
	r := t.r
	if r == nil {
		return
	}
	s := r.s // r.f is nil once the run gave its slot up at its deadline
	s.mu.Lock()
	defer s.mu.Unlock() // see mu
	if f := r.overran; f != nil && r.gen == t.gen+1 {
		// Its slot went at its deadline or hold (expire): it was charged
		// then. Its holder is done with it now, and it may be reused.
		r.overran = nil
		f.overran.Add(-1)
		// What its device measured of its own (the host's CPU time, up
		// to the deadline) past what expire charged, its wall time, is
		// billed as a run's end would bill it: a chain on N threads
		// expired while others waited was billed a Nth of what it used.
		if used > 0 && r.hold == 0 && s.cfg.Capacity == 0 {
			f.chargeLocked(min(used, r.expiredRan*time.Duration(s.cfg.MaxRuns))-r.expiredRan, now, true)
		}
		s.spare = append(s.spare, r)
		return
	}
	if r.gen == t.gen {
		part := s.part(r, now)
		charge := part
		switch {
		case used > 0 && r.hold > 0:
			// A held turn kept its slot past its hold only while
			// nobody waited for it, and what it reports is what it
			// cost (ioshare: at most its hold while it blocked on its
			// peer): no floor of the slot's time.
			charge = min(used, part)
		case used > 0:
			// Where the measure is the run's own (the host's CPU time:
			// a chain on several threads uses more than its wall time),
			// it is bounded only by every slot's time.
			most := part
			if s.cfg.Capacity == 0 {
				most = part * time.Duration(s.cfg.MaxRuns)
			}
			charge = max(min(used, most), now.Sub(r.start)/time.Duration(s.cfg.MaxRuns))
		}
		// Deferred: a panic in the policy's Ended (in end), recovered by
		// a transport, must not leave the freed slot to a queued run's
		// deadline.
		defer func() {
			s.dispatch(now)
			s.armExpiry(now)
		}()
		s.end(r, charge, now, false)
	}
}

// part is r's part of the device from its start to now: the time it held
// its slot, or less where runs in flight outnumbered Config.Capacity.
// Called with s.mu held.
func (s *Scheduler) part(r *run, now time.Time) time.Duration {
	s.share(now)
	held := now.Sub(r.start)
	if s.cfg.Capacity <= 0 {
		return held
	}
	return min(held, time.Duration(s.shared-r.shared))
}

// share brings Scheduler.shared up to now, before the runs in flight
// change. Called with s.mu held. Callers read their clocks before taking
// the lock, so now may be a little behind the last call's: that stretch
// counts once.
func (s *Scheduler) share(now time.Time) {
	if !now.After(s.sharedAt) {
		return
	}
	if n := len(s.running); n > 0 && s.cfg.Capacity > 0 {
		s.shared += float64(now.Sub(s.sharedAt)) * min(1, s.cfg.Capacity/float64(n))
	}
	s.sharedAt = now
}

// start admits a run of f. Called with s.mu held.
func (s *Scheduler) start(f *Flow, deadline time.Time, hold time.Duration, now time.Time) Ticket {
	if !f.active {
		f.active = true
		s.pol.Woke(f, now)
	}
	// The policy first: a run it panics on is not left on the device.
	charged := s.pol.Started(f, now)
	var r *run
	if n := len(s.spare); n > 0 {
		r, s.spare = s.spare[n-1], s.spare[:n-1]
	} else {
		r = &run{s: s}
	}
	s.share(now)
	if hold > 0 && (deadline.IsZero() || now.Add(hold).Before(deadline)) {
		deadline = now.Add(hold)
	}
	r.f, r.start, r.deadline, r.shared, r.hold = f, now, deadline, s.shared, max(hold, 0)
	r.charged = charged
	s.running = append(s.running, r)
	f.inFlight++
	s.idle.remove(f) // listed still: its runs count where they run
	return Ticket{r, r.gen}
}

// end ends a run that held the device for ran; expired: at its deadline
// or hold, its holder still having its Ticket (Flow.Overran). Called with
// s.mu held.
func (s *Scheduler) end(r *run, ran time.Duration, now time.Time, expired bool) {
	f := r.f
	if i := slices.Index(s.running, r); i >= 0 {
		s.running[i] = s.running[len(s.running)-1]
		s.running = s.running[:len(s.running)-1]
	}
	r.gen++
	r.f = nil
	if expired {
		r.overran = f
		f.overran.Add(1)
	} else {
		s.spare = append(s.spare, r)
	}
	f.inFlight--
	// Deferred: a panic in the policy's Ended must not leave f listed
	// off the list, where nothing would let its hold lapse.
	defer s.fewer(f, now)
	f.deviceNs.Add(int64(ran))
	f.recent.add(float64(ran), now, s.cfg.Decay)
	s.busy.add(float64(ran), now, s.cfg.Decay)
	s.pol.Ended(f, ran, r.charged, now)
}

// fewer notes that f has a run fewer queued or running (one ended, gave
// up or was refused): where that ends two at once, f stays a flood for
// Overlap from now; with none left it goes idle. Called with s.mu held.
func (s *Scheduler) fewer(f *Flow, now time.Time) {
	if f.inFlight+len(f.queue) == 1 && now.After(f.lastBusy) { // now may be a caller's, read before the lock
		f.lastBusy = now
	}
	s.maybeIdle(f, now)
	s.place(f)
}

// maybeIdle notes f going idle (nothing queued or running).
func (s *Scheduler) maybeIdle(f *Flow, now time.Time) {
	if !f.active || len(f.queue) > 0 || f.inFlight > 0 {
		return
	}
	f.active = false
	s.list(f, now)
}

// dispatch admits queued runs while slots are free. Called with s.mu held.
func (s *Scheduler) dispatch(now time.Time) {
	for len(s.running) < s.cfg.MaxRuns && len(s.waiting) > 0 {
		cands := s.scratch[:0]
		flood := s.floodLimit(now) // once per admission, not per waiting flow
		for _, f := range s.waiting {
			if len(s.running) < s.limitOf(f, now, flood) {
				cands = append(cands, f)
			}
		}
		s.scratch = cands[:0]
		if len(cands) == 0 {
			return
		}
		i := s.pol.Pick(cands, now)
		if i < 0 || i >= len(cands) {
			i = 0
		}
		f := cands[i]
		w := f.queue[0]
		var t Ticket
		if w.deadline.IsZero() || now.Before(w.deadline) {
			// Started before the waiter leaves its queue: one the
			// policy panics on stays there, to give up at its deadline,
			// not to wait for an answer that never comes.
			t = s.start(f, w.deadline, w.hold, now)
		}
		f.queue = slices.Delete(f.queue, 0, 1)
		if len(f.queue) == 0 {
			s.waiting = slices.DeleteFunc(s.waiting, func(g *Flow) bool { return g == f })
		}
		if t.r == nil {
			// Its deadline passed before its timer ran (timers run late
			// on a loaded machine): started, it would give its slot up at
			// the next expiry while its chain ran on beside the next run.
			// It is refused as its timer would refuse it; the slot stays
			// free for the next pick.
			w.err = ErrDeadline
			w.ready <- struct{}{}
			s.fewer(f, now)
			continue
		}
		w.t = t
		w.ready <- struct{}{}
	}
}

// armExpiry keeps a timer, while runs wait, on the next moment the
// device's state changes by time alone: the earliest deadline of a running
// run (a run past its deadline gives its slot up then: the engine stops
// such a run's worker, and the slot must not wait for that), the end of a
// Reserve that holds a slot free, or a light function's run turning light
// (Overlap after its two at once ended). Called with s.mu held.
func (s *Scheduler) armExpiry(now time.Time) {
	var at time.Time
	earliest := func(t time.Time) {
		if !t.IsZero() && (at.IsZero() || t.Before(at)) {
			at = t
		}
	}
	if len(s.waiting) > 0 {
		for _, r := range s.running {
			earliest(r.deadline)
			// A listed function's run that turns light by time alone
			// counts in the reserve from then (lightAbout), and in the
			// floods' SharedRuns bound with a reserve or without: the
			// floods' limit may rise.
			if f := r.f; f.listed && f.inFlight+len(f.queue) < 2 && !s.light(f, now) {
				earliest(f.lastBusy.Add(s.cfg.Overlap))
			}
		}
		if len(s.running) < s.cfg.MaxRuns {
			// A running one's reserve lapses only after its run ends,
			// which dispatches anyway: no timer for it.
			earliest(s.nextLapse(now))
		}
	}
	if at.Equal(s.expAt) {
		return
	}
	if s.expiry != nil {
		s.expiry.Stop()
		s.expiry = nil
	}
	s.expAt = at
	if at.IsZero() {
		return
	}
	s.expiry = s.clock.AfterFunc(max(0, at.Sub(now)), s.expire)
}

// expire frees the slots of runs past their deadlines, and admits what
// that (or a lapsed Reserve) lets start. A run is charged its part of the
// device, but a held one (AdmitHold) at most its hold: its expiry is armed
// only while runs wait, so one that blocked past its hold with nobody
// waiting (a piece whose client paused its upload) is expired only when
// the next run comes, maybe seconds later, and charged all that time it
// would take as many seconds of turns from its flow's next pieces, for
// time the slot was nobody else's. DoneUsed charges such a run at most
// what it reports, which its transport bounds by the hold (ioshare); here
// it reports nothing, and the hold is the same bound.
func (s *Scheduler) expire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	s.expiry, s.expAt = nil, time.Time{}
	for i := 0; i < len(s.running); {
		r := s.running[i]
		if r.deadline.IsZero() || now.Before(r.deadline) {
			i++
			continue
		}
		ran := s.part(r, now)
		if r.hold > 0 {
			ran = min(ran, r.hold)
		}
		r.expiredRan = ran
		s.end(r, ran, now, true) // removes r from running
	}
	s.dispatch(now)
	s.armExpiry(now)
}
