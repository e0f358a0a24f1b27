package sched

import "time"

// How many runs a flow may start: the slots kept for light functions
// (Config.Reserve, FloodRuns) and the floods' bound while functions contend
// (Config.SharedRuns). Called with s.mu held.

// limit is how many runs may be on the device when f starts one: all of
// them, or all but Config.Reserve while a light function (one that has
// not had two runs queued or running within Overlap: it sends one request
// at a time) went idle within Recent, light, unless f is such a function
// itself; and at most Config.SharedRuns (and the light functions' runs in
// the reserve) while another function has runs queued or running.
// The light function's own runs take the reserved slots: an interactive
// function finds them free between its requests, and a flood, whatever
// its gaps, cannot fill the device while it runs.
func (s *Scheduler) limit(f *Flow, now time.Time) int {
	return s.limitOf(f, now, s.floodLimit(now))
}

// limitOf is limit given floodLimit's answer for this moment.
func (s *Scheduler) limitOf(f *Flow, now time.Time, fl floods) int {
	if f.listed && s.light(f, now) {
		return s.cfg.MaxRuns
	}
	if fl.many || fl.other != nil && fl.other != f {
		return fl.shared
	}
	return fl.alone
}

// floods is floodLimit's answer: how many runs may be on the device (every
// function's counted) when a flood starts one with no other function's
// runs queued or running, and when another's are; and whose are, where
// the two differ.
type floods struct {
	alone, shared int
	other         *Flow // a function with runs queued or running, if any
	many          bool  // two or more are
}

// floodLimit is the limit of a function that is not light and recent:
// all runs, or all but the reserve while a light function is about; and
// SharedRuns of them (and the light ones' runs in the reserve) where
// another function wants the device too.
func (s *Scheduler) floodLimit(now time.Time) floods {
	// Asked without a reserve too: lightAbout prunes the idle list, and
	// SharedRuns leaves the light runs out of its bound.
	fl := floods{alone: s.cfg.MaxRuns}
	about, lightRuns := s.lightAbout(now)
	if s.cfg.Reserve > 0 && about {
		// The light functions' own runs fill the reserved slots first:
		// one running does not open the reserve to the floods.
		lightRuns = min(lightRuns, s.cfg.Reserve)
		n := s.cfg.MaxRuns - s.cfg.Reserve
		if s.cfg.FloodRuns > 0 {
			n = min(n, s.cfg.FloodRuns)
		}
		fl.alone = n + lightRuns
	}
	fl.shared = min(fl.alone, s.cfg.SharedRuns+lightRuns)
	if fl.shared == fl.alone {
		return fl // who else wants the device changes nothing
	}
	// Who wants the device: the runs in flight and the queue, as far as
	// a second function (a bounded scan: MaxRuns, then two flows).
	note := func(g *Flow) {
		if fl.other == nil {
			fl.other = g
		} else if g != fl.other {
			fl.many = true
		}
	}
	for _, r := range s.running {
		if note(r.f); fl.many {
			return fl
		}
	}
	for _, g := range s.waiting {
		if note(g); fl.many {
			return fl
		}
	}
	return fl
}

// light reports a flow that has fewer than two runs queued or running and
// has not had two at once within Overlap. lastBusy is set as a run makes
// two or more (join) and as a run fewer ends two at once (fewer), so a
// flood of long runs, whose arrivals may be further apart than Overlap, is
// never light while it has two at once, nor for Overlap after.
func (s *Scheduler) light(f *Flow, now time.Time) bool {
	return f.inFlight+len(f.queue) < 2 && (f.lastBusy.IsZero() || now.Sub(f.lastBusy) >= s.cfg.Overlap)
}
