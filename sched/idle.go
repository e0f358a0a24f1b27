package sched

import "time"

// The flows the reserve is kept for, kept so that no admission walks them:
// a node may hold thousands of light functions each called now and then,
// and the list was walked under the Scheduler's lock at every admission
// (646 µs beside 10,000 of them; BENCHMARKS.md, "What the hold's list
// costs").
//
// A flow is listed (Flow.listed) from when it goes idle light (nothing
// queued or running, and no two runs at once within Overlap of that) or
// is touched while idle, until Recent passes with nothing running, it
// goes idle a flood, a second run of it queues while none runs, its last
// run ends with another of it still queued after two at once, or it is
// forgotten (for good: its runs still going count as a flood's). While
// listed with nothing running it is on idleList, ordered by when it went
// idle, so the list's oldest entries are the first to lapse and its newest
// say whether one is about; listed and running, it is off the list, and
// its runs count where the runs are (Scheduler.running, MaxRuns at most).

// idleList is a list of flows ordered by lastIdle, oldest first, linked
// through the flows themselves.
type idleList struct{ head, tail *Flow }

// push puts f in its place by lastIdle: at the end, unless callers' clocks
// read before the lock put a later one there first.
func (l *idleList) push(f *Flow) {
	at := l.tail
	for at != nil && at.lastIdle.After(f.lastIdle) {
		at = at.idlePrev
	}
	f.idlePrev, f.linked = at, true
	if at == nil {
		f.idleNext, l.head = l.head, f
	} else {
		f.idleNext, at.idleNext = at.idleNext, f
	}
	if f.idleNext == nil {
		l.tail = f
	} else {
		f.idleNext.idlePrev = f
	}
}

func (l *idleList) remove(f *Flow) {
	if !f.linked {
		return
	}
	if f.idlePrev == nil {
		l.head = f.idleNext
	} else {
		f.idlePrev.idleNext = f.idleNext
	}
	if f.idleNext == nil {
		l.tail = f.idlePrev
	} else {
		f.idleNext.idlePrev = f.idlePrev
	}
	f.idlePrev, f.idleNext, f.linked = nil, nil, false
}

// list lists f as idle from now (it went idle, or was touched). Called
// with s.mu held.
func (s *Scheduler) list(f *Flow, now time.Time) {
	f.lastIdle = now
	if f.forgotten {
		return
	}
	f.listed = true
	s.idle.remove(f) // to its new place
	s.place(f)
}

// place puts f on the idle list or off it after its runs or lastBusy
// changed: listed with nothing running, it is on the list while it went
// idle light, and unlisted when not (a flood that went idle counts for
// nothing, and its own next run is a flood's); running, it is off the list
// but stays listed. Called with s.mu held.
func (s *Scheduler) place(f *Flow) {
	switch {
	case !f.listed || f.inFlight > 0:
		s.idle.remove(f)
	case !s.light(f, f.lastIdle):
		s.unlist(f)
	case !f.linked:
		s.idle.push(f)
	}
}

// unlist takes f off the list and unlists it. Called with s.mu held.
func (s *Scheduler) unlist(f *Flow) {
	s.idle.remove(f)
	f.listed = false
}

// prune unlists the idle flows that went idle Recent or more before now:
// the list's oldest. Called with s.mu held.
func (s *Scheduler) prune(now time.Time) {
	for g := s.idle.head; g != nil && now.Sub(g.lastIdle) >= s.cfg.Recent; g = s.idle.head {
		s.unlist(g)
	}
}

// lightAbout says whether a light function is about (listed and idle
// within Recent, or running and light now), and how many runs the light
// functions have on the device. Called with s.mu held.
func (s *Scheduler) lightAbout(now time.Time) (about bool, lightRuns int) {
	s.prune(now)
	for _, r := range s.running {
		if r.f.listed && s.light(r.f, now) {
			lightRuns++
		}
	}
	return lightRuns > 0 || s.idleAbout(now, nil), lightRuns
}

// idleAbout says whether a flow on the idle list other than except went
// idle within Recent of now and is light at now. It walks from the newest:
// a flow on the list went idle light, so is light at any time from then
// on, and only one that went idle after now (a caller's clock, read before
// the lock, may be behind another's) needs asking. Called with s.mu held;
// it prunes nothing, so that a caller's later time does not decide for an
// earlier one's.
func (s *Scheduler) idleAbout(now time.Time, except *Flow) bool {
	for g := s.idle.tail; g != nil; g = g.idlePrev {
		switch {
		case g == except:
		case now.Sub(g.lastIdle) >= s.cfg.Recent:
			return false // and every flow before it lapsed too
		case !g.lastIdle.After(now) || s.light(g, now):
			return true
		}
	}
	return false
}

// nextLapse is when the oldest flow on the idle list lapses (zero: the
// list is empty). Called with s.mu held.
func (s *Scheduler) nextLapse(now time.Time) time.Time {
	s.prune(now)
	if s.idle.head == nil {
		return time.Time{}
	}
	return s.idle.head.lastIdle.Add(s.cfg.Recent)
}
