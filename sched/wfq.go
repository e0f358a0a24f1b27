package sched

import (
	"math"
	"time"
)

// WFQ is the default Policy: weighted fair queuing on device time, within
// strict priority classes, with a bound on waiting.
//
// Each flow has a virtual time, the device time it was charged divided by
// its weight; the waiting flow of the highest class with the smallest
// virtual time goes next, so backlogged flows get device time in
// proportion to their weights whatever their runs cost. A run is charged an
// estimate of its cost when it starts (the flow's recent mean; so a flow
// cannot take every slot before its first run is charged) and the
// difference when it ends. A flow that wakes from idle starts at the
// current virtual time, not behind it: time a flow did not use goes to the
// busy ones (work conservation) and is not banked. A run that has waited
// longer than maxWait goes before every class, oldest first: priorities
// order runs but starve none.
type WFQ struct {
	maxWait time.Duration
	vnow    float64 // virtual time: the tag of the run last picked
}

// NewWFQ returns the default policy; maxWait bounds how long a run of a
// lower class waits behind higher classes.
func NewWFQ(maxWait time.Duration) *WFQ { return &WFQ{maxWait: maxWait} }

type wfqFlow struct {
	tag float64 // virtual time: device ns charged / weight
	est float64 // the flow's recent mean run, ns
}

func (w *WFQ) state(f *Flow) *wfqFlow {
	st, _ := f.PolicyData.(*wfqFlow)
	if st == nil {
		st = &wfqFlow{}
		f.PolicyData = st
	}
	return st
}

// Woke implements Policy.
func (w *WFQ) Woke(f *Flow, now time.Time) {
	st := w.state(f)
	st.tag = math.Max(st.tag, w.vnow)
}

// Started implements Policy.
func (w *WFQ) Started(f *Flow, now time.Time) {
	st := w.state(f)
	st.tag += st.est / f.Weight()
}

// Ended implements Policy.
func (w *WFQ) Ended(f *Flow, ran time.Duration, now time.Time) {
	st := w.state(f)
	st.tag += (float64(ran) - st.est) / f.Weight()
	if st.est == 0 {
		st.est = float64(ran)
	} else {
		st.est += (float64(ran) - st.est) / 8
	}
}

// Pick implements Policy.
func (w *WFQ) Pick(waiting []*Flow, now time.Time) int {
	best, starved := -1, -1
	for i, f := range waiting {
		if now.Sub(f.Oldest()) > w.maxWait && (starved < 0 || f.Oldest().Before(waiting[starved].Oldest())) {
			starved = i
		}
		if best < 0 {
			best = i
			continue
		}
		b := waiting[best]
		switch {
		case f.Class() != b.Class():
			if f.Class() < b.Class() {
				best = i
			}
		case w.state(f).tag < w.state(b).tag:
			best = i
		case w.state(f).tag == w.state(b).tag && f.Oldest().Before(b.Oldest()):
			best = i
		}
	}
	if starved >= 0 && waiting[starved].Class() != waiting[best].Class() {
		best = starved
	}
	if t := w.state(waiting[best]).tag; t > w.vnow {
		w.vnow = t
	}
	return best
}
