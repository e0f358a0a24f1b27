// Package sched shares one device among functions. Every run on a device
// (a request's chain, or a batch) is admitted by the device's Scheduler
// before it starts and reports its end; between the two it holds one of the
// device's slots, so at most MaxRuns runs are on the device at once and a
// flood waits in its own queue in the server, not on the device or in the
// kernel's run queue.
//
// The Scheduler is mechanism: slots, queues, deadlines, accounting. Which
// queued run goes next is its Policy's choice, made from the events the
// Scheduler feeds it (a flow woke, a run started, a run ended and how long
// it held the device); the default, WFQ, is weighted fair queuing on device
// time with priority classes.
package sched

import (
	"fmt"
	"math"
	"time"
)

// Class is a flow's priority class: a queued run of a higher class is
// admitted before queued runs of lower classes (but see Config.MaxWait).
type Class uint8

const (
	Latency Class = iota // interactive: admitted first
	Default
	Batch // throughput work: admitted when nothing else waits, but for turns (Config.MaxWait)
	numClasses
)

var classNames = [numClasses]string{"latency", "default", "batch"}

func (c Class) String() string {
	if c < numClasses {
		return classNames[c]
	}
	return fmt.Sprintf("class(%d)", uint8(c))
}

// ParseClass reads a manifest's "priority" ("" is Default).
func ParseClass(s string) (Class, error) {
	if s == "" {
		return Default, nil
	}
	for c, n := range classNames {
		if s == n {
			return Class(c), nil
		}
	}
	return Default, fmt.Errorf("%q: want latency, default or batch", s)
}

// Clock is the Scheduler's time; tests use a fake one.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f after d (time.AfterFunc's contract).
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a Clock's timer.
type Timer interface{ Stop() bool }

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }
func (wallClock) AfterFunc(d time.Duration, f func()) Timer {
	return time.AfterFunc(d, f)
}

// Policy chooses which flow's oldest queued run is admitted next. The
// Scheduler calls it under its lock, with every event in order: a policy
// must be quick, must not block and must not call the Scheduler.
type Policy interface {
	// Woke says f has a run queued or running and had none since it
	// last went idle: a fair policy must not let it spend the time it
	// was idle.
	Woke(f *Flow, now time.Time)
	// Started says a run of f was admitted; what it returns (the cost the
	// policy charged ahead, in its own units) comes back with the run's end.
	Started(f *Flow, now time.Time) float64
	// Ended says a run of f ended after holding the device for ran;
	// charged is what Started returned for that run.
	Ended(f *Flow, ran time.Duration, charged float64, now time.Time)
	// Charged says f used d of what the policy shares beside its runs
	// (Flow.Charge: the server's CPU on its bytes): a fair policy counts
	// it as it counts a run's time.
	Charged(f *Flow, d time.Duration, now time.Time)
	// Reweighed says f's weight or class went from old and oldClass to
	// f.Weight() and f.Class() (Flow.Set, a redeploy): what f used before
	// counts at its weight now, as if it had had it all along, and in
	// another class it starts as a flow that wakes there. inflight is
	// the sum of what Started returned for f's runs in flight; what it
	// returns multiplies each of them, as they come back with their ends.
	Reweighed(f *Flow, old float64, oldClass Class, inflight float64, now time.Time) float64
	// Pick returns the index in waiting (never empty; each has a run
	// queued and may start one) of the flow whose oldest run goes next.
	Pick(waiting []*Flow, now time.Time) int
}

// Config configures a Scheduler.
type Config struct {
	// MaxRuns bounds the runs on the device at once (>= 1).
	MaxRuns int
	// Reserve is how many of MaxRuns (at most MaxRuns-1) are kept for
	// light functions, ones that send a run at a time (no two queued or
	// running within Overlap), while such a function went idle within Recent
	// and has nothing running: an interactive function finds the device
	// free between its requests instead of behind a neighbour's long run (a
	// spatial share, as MPS keeps SMs), while floods share the rest by the
	// policy. With no light function about, every slot is used. 0: none.
	Reserve int
	// FloodRuns, where set (1..MaxRuns-Reserve), is how many runs the
	// floods may have on the device together while a light function is
	// about (Reserve's condition), in place of MaxRuns-Reserve. A device
	// that preempts nothing in flight (a GPU: a copy already queued on
	// the copy engine, a kernel already launched) makes a light run wait
	// behind every flood run started before it, however free its slot:
	// fewer floods in flight bound that wait. 0: MaxRuns-Reserve. Without
	// a Reserve nobody is about, and it does nothing.
	FloodRuns int
	// SharedRuns, where set (1..MaxRuns), is how many runs floods may
	// have on the device together while two or more functions have runs
	// queued or running: a device whose runs share cores (the host
	// device's CPUs) serves MaxRuns at once only by slowing each, and how
	// the ones in flight are slowed is the OS's split, not the policy's
	// (nice levels do not carry across CPUs: a run alone on a CPU has it
	// whole, whatever its weight). Runs a flood may not have wait in the
	// queue, where the policy orders them. A function alone may still
	// have MaxRuns (all but the Reserve while a light function is about),
	// and a light function's runs are not counted in SharedRuns. The
	// bound is kept as runs start: a flood that had more before another
	// function came keeps them until they end, and a light function whose
	// run is in flight when it sends a second becomes a flood with that
	// run. 0: MaxRuns.
	SharedRuns int
	// Recent is how long after going idle a light function counts for
	// Reserve (default DefaultRecent): one that was light as it went idle
	// (a flood that stops is not).
	Recent time.Duration
	// Overlap is how long after two of its runs were queued or running at
	// once a function does not count as light (default DefaultOverlap).
	Overlap time.Duration
	// Policy orders queued runs; nil: the policy registered as PolicyName
	// ("": DefaultPolicy), made with MaxWait. An unknown name is a
	// programming error (New panics): check it with NewPolicy first.
	Policy     Policy
	PolicyName string
	// MaxWait bounds how long the default policy lets a lower class be
	// held back by higher ones (default 200ms): a class whose queued runs
	// have waited longer than that behind a higher class's, counted from
	// no earlier than its last run's end, has a turn: its next run in
	// fair order is admitted first. Its next turn comes once it has been
	// held back as long again, counted from no earlier than that turn's
	// start; a flow whose turn's run is still on the device has no other
	// turn until it ends (its class's other flows do), and at most half
	// the slots a flood may have (MaxRuns-Reserve, rounded up; 1 at
	// least) hold turns' runs at once, every class's together. So a lower class's
	// run waits about MaxWait and a run behind higher floods however deep
	// their backlogs, and a lower class's own backlog (runs older than
	// MaxWait from waiting in their own queue) goes before no higher run.
	// Priorities order runs; they do not starve any.
	MaxWait time.Duration
	// Decay is the time constant of each function's recent share of
	// device time (Flow.Fraction; default 10s).
	Decay time.Duration
	// Capacity is how many runs the device serves at full speed at once,
	// for charging (Ticket.DoneUsed), where a run's own measure of its
	// device time can include other runs' work: a GPU's events time a span
	// on one stream, and other contexts' kernels run inside it while
	// contexts time-slice (1). 0: the device's measure is the run's alone
	// (the host device's per-thread CPU time), and nothing is split.
	Capacity float64
	// Clock is the time source; nil: the wall clock.
	Clock Clock
}

// decayed is an exponentially decayed sum of device time: what a recent
// fraction is computed from.
type decayed struct {
	v  float64
	at time.Time
}

func (d *decayed) add(x float64, now time.Time, tau time.Duration) {
	d.decay(now, tau)
	d.v += x
}

func (d *decayed) decay(now time.Time, tau time.Duration) {
	if !d.at.IsZero() && now.After(d.at) {
		x := float64(now.Sub(d.at)) / float64(tau)
		if x < 1e-3 {
			// Runs end microseconds apart: the series is exact to 1e-10
			// there, and a run's end need not pay for math.Exp.
			d.v *= 1 - x + x*x/2
		} else {
			d.v *= math.Exp(-x)
		}
	}
	d.at = now
}
