package sched

import (
	"math"
	"time"
)

// A flow's settings and what it tells: its weight and class, its queue, its
// charges beside runs and its device time.

// Set changes the flow's weight and class. Weights are shares, 0.01..1000
// (deploys check them); one that slipped through is kept in that range,
// and one that is no positive number (NaN, 0, negative) or is infinite is
// 1: a NaN would make the policy's clock NaN (math.Max) and every tag after
// it, a subnormal one too (a run's charge over it is +Inf), and +Inf or
// 1e300 would charge the flow nothing.
func (f *Flow) Set(weight float64, class Class) {
	if !(weight > 0) || math.IsInf(weight, 1) {
		weight = 1
	}
	weight = min(max(weight, MinWeight), MaxWeight)
	s := f.s
	s.mu.Lock()
	defer s.mu.Unlock() // see mu
	old, oldClass := f.weight, f.class
	f.weight, f.class = weight, class
	if weight != old || class != oldClass {
		inflight := 0.0
		for _, r := range s.running {
			if r.f == f {
				inflight += r.charged
			}
		}
		if k := s.pol.Reweighed(f, old, oldClass, inflight, s.clock.Now()); k != 1 {
			for _, r := range s.running {
				if r.f == f {
					r.charged *= k
				}
			}
		}
	}
}

// The weights a flow takes: a manifest's shares.
const (
	MinWeight = 0.01
	MaxWeight = 1000
)

// Weight is the flow's weight. Call it only from a Policy (under the lock).
func (f *Flow) Weight() float64 { return f.weight }

// Class is the flow's class. Call it only from a Policy.
func (f *Flow) Class() Class { return f.class }

// Oldest is when the flow's oldest queued run arrived (zero: none). Call
// it only from a Policy.
func (f *Flow) Oldest() time.Time {
	if len(f.queue) == 0 {
		return time.Time{}
	}
	return f.queue[0].arrived
}

// Waiting is how many of the flow's runs wait for the device.
func (f *Flow) Waiting() int {
	f.s.mu.Lock()
	defer f.s.mu.Unlock()
	return len(f.queue)
}

// Overran is how many of the flow's runs gave their slots up at their
// deadlines or holds (expire) while their holders, not knowing it, still
// have them: a held turn blocked on its client past its hold (ioshare's
// stalled pieces), a run past its deadline whose worker is being stopped.
// Each counts until its Ticket's Done.
func (f *Flow) Overran() int { return int(f.overran.Load()) }

// DeviceTime is the device time the flow's ended runs were charged
// (Ticket.DoneUsed), not the time they held their slots.
func (f *Flow) DeviceTime() time.Duration { return time.Duration(f.deviceNs.Load()) }

// Alone reports whether f is the only flow with runs queued or running
// or a light function's recent request about (Touch): nobody it would take
// anything from.
func (f *Flow) Alone() bool {
	s := f.s
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, g := range s.waiting {
		if g != f {
			return false
		}
	}
	for _, r := range s.running {
		if r.f != f {
			return false
		}
	}
	return !s.idleAbout(s.clock.Now(), f)
}

// Flooding reports whether f has two or more runs queued or running, or
// had within d: a flood, where a light function (the kept slots' reading,
// light) has one at a time.
func (f *Flow) Flooding(d time.Duration) bool {
	s := f.s
	s.mu.Lock()
	defer s.mu.Unlock()
	return f.inFlight+len(f.queue) >= 2 || !f.lastBusy.IsZero() && s.clock.Now().Sub(f.lastBusy) < d
}

// Touch says the flow's function is about, though it needs no slot now
// (a request whose bytes are all read): while it has nothing queued or
// running it counts, for Recent from now, as a function that went idle,
// so that a light one keeps Config.Reserve's slots free of floods (for
// its requests' other work on the same CPUs: the server's I/O shares).
func (f *Flow) Touch() {
	s := f.s
	s.mu.Lock()
	defer s.mu.Unlock() // see mu: the clock is an interface too
	if !f.active && len(f.queue) == 0 && f.inFlight == 0 {
		s.list(f, s.clock.Now())
	}
}

// Charge counts d against the flow beside its runs: what it cost of
// another resource the node shares by the same shares (the server's CPU on
// its bytes), so that a function that costs more there gets fewer turns
// here. Its device time (billing, the recent fraction) is unchanged.
func (f *Flow) Charge(d time.Duration) { f.charge(d, false) }

// Bill is device time the flow used outside its runs, found afterwards
// (a host worker's CPU that no run of it reported: threads its bundle
// left running between runs): charged as Charge is, and also counted as
// its device time, in billing and in the recent fractions, as a run's is.
func (f *Flow) Bill(d time.Duration) { f.charge(d, true) }

func (f *Flow) charge(d time.Duration, device bool) {
	if d <= 0 {
		return
	}
	s := f.s
	s.mu.Lock()
	defer s.mu.Unlock() // see mu
	f.chargeLocked(d, s.clock.Now(), device)
}

// chargeLocked is charge with s.mu held, at now.
func (f *Flow) chargeLocked(d time.Duration, now time.Time, device bool) {
	if d <= 0 {
		return
	}
	s := f.s
	if device {
		f.deviceNs.Add(int64(d))
		f.recent.add(float64(d), now, s.cfg.Decay)
		s.busy.add(float64(d), now, s.cfg.Decay)
	}
	s.pol.Charged(f, d, now)
}

// Recent is the flow's recent device time and every flow's, decayed over
// Config.Decay (seconds): the flow's fraction of the device, for a caller
// that may sum over devices first.
func (f *Flow) Recent() (mine, all float64) {
	s := f.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	f.recent.decay(now, s.cfg.Decay)
	s.busy.decay(now, s.cfg.Decay)
	return f.recent.v / 1e9, s.busy.v / 1e9
}
