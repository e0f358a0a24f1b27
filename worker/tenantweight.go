package worker

import (
	"slices"
	"time"
)

// A tenant's worker is weighed as the functions that are busy in it, not as
// every function it holds: its CPU weight is the sum of the weights of its
// programs with a run in flight or one begun within the last weighWindow
// (up to twice that), and the heaviest program's weight while none is busy.
// Summing every program loaded would let a tenant that keeps many
// functions warm and few busy outweigh another tenant's busy function many
// times over (under cgroup v1 a default function weighs 1,024 cpu.shares,
// 20 of them 20,480), and the kernel would give its runs the CPU the
// device scheduler's shares meant for the other's: of two tenants at equal
// shares flooding one function each, the one holding 20 more idle was
// served 0.60-0.66 of the requests, 0.43-0.52 since (make bench-tenants).
//
// The weight is written by one goroutine per worker (weighLoop), off the
// request's path: a run marks its program busy with an atomic load on the
// hot path (a store and a wake-up only when it was idle), loads and unloads
// wake the loop, and the loop writes the group (a file write, or a renice
// of every thread) only when the sum changed.
const weighWindow = time.Second

// weighSpacing spaces the writes a wake-up brings: loads in a row (a burst
// of first requests, a tenant warming its functions) make one write each
// 10 ms, not one each.
const weighSpacing = 10 * time.Millisecond

// busyNow marks g busy for its worker's weight (a run of it began) and
// wakes its worker's weighLoop when it was idle.
func (g *program) busyNow() {
	if !g.busy.Load() {
		g.touch()
	}
}

// touch marks g busy from now (a load of it began or ended: a load may
// outlast a window, queued behind a sibling's and then up to its bound).
func (g *program) touch() {
	g.busyAt.Store(monoNow())
	if g.busy.CompareAndSwap(false, true) {
		g.p.tenant.poke()
	}
}

// poke wakes the worker's weighLoop; a wake-up already pending serves.
func (t *tenancy) poke() {
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// weighLoop keeps p's CPU weight (see weighWindow) until p ends. It looks
// again a window after it finds a program busy, to let that one go idle,
// and at most once every weighSpacing after a write.
func (p *proc) weighLoop() {
	tick := time.NewTimer(time.Hour)
	tick.Stop()
	var wrote time.Time
	for {
		select {
		case <-p.done:
			tick.Stop()
			return
		case <-p.tenant.wake:
			if wait := weighSpacing - time.Since(wrote); wait > 0 {
				tick.Reset(wait) // sooner than a window: that look is this one's
				continue
			}
		case <-tick.C:
		}
		busy, changed := p.reweigh(time.Now())
		if changed {
			wrote = time.Now()
		}
		if busy {
			tick.Reset(p.tenant.window)
		}
	}
}

// reweigh gives p's CPU group the weight of its busy programs (idle ones
// are let go here) when that changed, and says whether any is busy still
// and whether it wrote. It runs on weighLoop alone. The weight is decided
// under p's mu, and never written once the process exited (its group
// goes, and with nice levels its pid may come to be another process's) or
// was killed (Dying gave its group a default function's weight, so that
// it ends soon whatever its functions' weights). It is written after p's
// mu is let go: with nice levels the write walks the worker's whole tree
// (Group.walk: up to a second), and every run takes p's mu twice (its CPU
// readings, cpuNow) and a kill at a deadline once. The group's own lock
// orders the write with the exit and the kill instead: Exited closes the
// group before the reap, and Dying's weight stands against any write.
func (p *proc) reweigh(now time.Time) (busy, changed bool) {
	p.mu.Lock()
	sum, busy := p.busyWeight(now)
	if p.exited || p.killed.Load() != nil {
		p.mu.Unlock()
		return busy, false
	}
	// The boost asks the server of every function the worker holds (an
	// idle one moves no bytes and floods nothing), whichever are busy and
	// whether or not the weight changes: the busy set changes while their
	// weights' sum stays.
	all := make([]string, 0, len(p.tenant.progs))
	for _, g := range p.tenant.progs {
		all = append(all, g.name)
	}
	slices.Sort(all)
	cg := p.cgroup
	changed = sum != 0 && sum != p.tenant.weighed
	if changed {
		p.tenant.weighed = sum
		p.tenant.writes.Add(1)
	}
	p.mu.Unlock()
	if !changed {
		cg.setNames(all)
		return busy, false
	}
	cg.setWeight(sum, all)
	return busy, true
}

// busyWeight is the weight of p's busy programs, letting go those idle for
// a window, or the heaviest program's where none is busy (then busy is
// false). Under p.mu.
func (p *proc) busyWeight(now time.Time) (sum float64, busy bool) {
	var top float64
	for _, g := range p.tenant.progs {
		top = max(top, g.weight)
		if !g.busy.Load() {
			continue
		}
		// runs before the times: a run's end stores runEnded, then
		// lowers runs, so a count of 0 comes with its end's time.
		runs := g.runs.Load()
		last := max(g.busyAt.Load(), g.runEnded.Load())
		if runs == 0 && time.Duration(monoOf(now)-last) >= p.tenant.window {
			g.busy.Store(false)
			// A run that began meanwhile saw busy set and woke no one
			// (its count went up before its load of busy), and one may
			// have begun and ended since: either keeps g busy.
			if g.runs.Load() == 0 && max(g.busyAt.Load(), g.runEnded.Load()) == last {
				continue
			}
			g.busy.Store(true)
		}
		busy = true
		sum += g.weight
	}
	if !busy {
		sum = top
	}
	return sum, busy
}
