package worker

import (
	"context"
	"sync"
	"time"
)

// standbyDemand sizes the standby pool: policy apart from the pool's
// mechanism (Device.keepStandby), fed by one event, a worker taken for a
// load. The pool holds as many workers as loads took in the busiest second
// of the last window, between a floor and a ceiling: a node whose
// functions wake in bursts keeps a burst's worth started, and a quiet node
// goes back to the floor (each idle worker holds a few MiB, on a GPU a
// context) a window after its last burst.
type standbyDemand struct {
	min, max int
	mu       sync.Mutex
	sec      [standbyWindow]int64 // the second (monoOf) each count is for
	n        [standbyWindow]int
}

// standbyWindow is how many seconds of takes the pool is sized by: a node
// whose functions wake in bursts a minute apart keeps a burst's workers.
const standbyWindow = 60

// took records a worker taken from the pool (or started because it was
// empty) at now.
func (s *standbyDemand) took(now time.Time) {
	t := monoOf(now) / int64(time.Second) // a wall clock stepped back held the peak as long
	i := (t%standbyWindow + standbyWindow) % standbyWindow
	s.mu.Lock()
	if s.sec[i] != t {
		s.sec[i], s.n[i] = t, 0
	}
	s.n[i]++
	s.mu.Unlock()
}

// target is how many standby workers to keep at now.
func (s *standbyDemand) target(now time.Time) int {
	t := monoOf(now) / int64(time.Second)
	peak := 0
	s.mu.Lock()
	for i, sec := range s.sec {
		if t-sec < standbyWindow {
			peak = max(peak, s.n[i])
		}
	}
	s.mu.Unlock()
	return min(max(peak, s.min), s.max)
}

// keepStandby keeps the pool at its target: it starts workers when a take
// or the timer finds fewer ready and starting than the target (several at
// once, so that refills keep up with a burst), and ends those past it once
// the target falls.
func (d *Device) keepStandby() {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	starting := 0
	var backoff time.Time // after a start failed: no start before then
	for {
		select {
		case <-d.stop:
			return // Close kills every worker, those starting included
		case <-d.refill:
		case <-tick.C:
		case r := <-d.started:
			starting--
			if r.err != nil {
				d.opts.Log.Error("cannot start a standby worker", "device", d.Name(), "error", r.err)
				backoff = time.Now().Add(time.Second)
				break
			}
			select {
			case d.standby <- r.p:
			default: // full: the target fell meanwhile
				r.p.kill("the standby pool is full")
			}
		}
		d.dropDead()
		now := time.Now()
		target := d.demand.target(now)
		// Ready workers past the target go; those starting are not counted
		// against it (one may yet fail).
	shrink:
		for len(d.standby) > target {
			select {
			case p := <-d.standby:
				p.kill("the standby pool shrank")
			default:
				break shrink
			}
		}
		if now.Before(backoff) {
			continue
		}
		for len(d.standby)+starting < target && starting < standbyParallel {
			// Counted under mu, unless Close has begun: Close waits for
			// the count to drop to zero only after it set closed.
			d.mu.Lock()
			if d.closed {
				d.mu.Unlock()
				return
			}
			d.starts.add()
			d.mu.Unlock()
			starting++
			go func() {
				defer d.starts.done()
				p, err := d.spawn(context.Background(), 0)
				d.started <- standbyStart{p, err} // buffered: never blocks
			}()
		}
	}
}

// dropDead takes the standby workers that died while they waited (the
// OOM killer, an operator's kill, a crash) out of the pool, so that the
// pool counts only workers a take can use and starts others in their
// place; before, a dead one held its place until a take skipped it, and
// that take was a cold start. Only keepStandby puts workers in the pool,
// so one taken out here always fits back.
func (d *Device) dropDead() {
	for range len(d.standby) {
		select {
		case p := <-d.standby:
			if p.alive() {
				d.standby <- p
				continue
			}
			d.opts.Log.Warn("a standby worker died while it waited; another starts in its place", "device", d.Name(), "pid", p.pid)
		default:
			return
		}
	}
}

// standbyStart is the end of a standby worker's start.
type standbyStart struct {
	p   *proc
	err error
}

// standbyParallel bounds the standby workers starting at once: a worker's
// start is mostly its own CPU time (exec, the runtime, containment, the
// preloads), so more than a couple only queue for the CPUs.
const standbyParallel = 2
