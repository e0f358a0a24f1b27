package engine

import (
	"context"
	"time"
)

// ReapEvery runs Reap periodically until ctx ends, at most every
// millisecond: a period of 0 (a quarter of a 3 ns --idle-ttl) panicked in
// NewTicker after the server had started serving.
func (e *Engine) ReapEvery(ctx context.Context, every time.Duration) {
	t := time.NewTicker(max(every, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			e.Reap(now)
		}
	}
}

// Reap releases instances idle for longer than their function's idle_ttl,
// keeping min_instances, and unloads (scales to zero) functions that have
// had no instance for that long. The server calls it periodically.
func (e *Engine) Reap(now time.Time) {
	for _, fv := range e.tab.versions(true) {
		e.reapOne(fv.f, fv.v, now)
	}
}

// reapOne is Reap's pass over v, a version of f. A panic in it (a
// device's Go code closing an instance or a program) is logged, and the
// pass goes on to the other versions: the reaper's goroutine has nothing
// above it to recover one, and the process ended.
func (e *Engine) reapOne(f *function, v *version, now time.Time) {
	defer func() { e.survived("reaping", f.name, recover()) }()
	e.topUp(f, v, now)
	if !v.loaded.Load() {
		return
	}
	ttl := v.idleTTL()
	if ttl <= 0 {
		return
	}
	closed, zero := v.pool.reap(now, ttl, v.minInstances())
	if closed > 0 {
		e.cfg.Log.Info("released idle instances", "function", f.name, "count", closed, "idle_ttl", ttl)
	}
	if zero && e.unload(f, v) {
		e.cfg.Log.Info("scaled to zero", "function", f.name, "version", v.rec.ID, "idle_ttl", ttl)
	}
}

// unload replaces v, if still current, by an unloaded copy of the same
// version and retires v: its programs go once in-flight requests end. The
// next request is a cold start. As an eviction does (evictEmpty), only if
// v still has no instance and no request under the table's lock, and no
// request takes it after: one that found v between the reaper's look and
// the detach would run on a retired v while the next loaded a second copy.
func (e *Engine) unload(f *function, v *version) bool {
	if !e.tab.detach(f, v, func() bool { return v.pool.evictEmpty(0) }) {
		return false
	}
	v.pool.retire()
	return true
}

// topUp brings a current version that has fewer instances than its
// min_instances back up to them (keepWarm: one whose pre-warm failed
// before it was loaded too), in the background: an instance that
// closed broken (a worker lost, a run past its deadline) is otherwise not
// made again until a request needs one, and the version, kept loaded by
// its minimum, holds its programs while it has none (neither the reaper
// nor the evictor takes them). Not while the version backs off after
// crashes (its requests fail fast; making instances would run the crashing
// code again), nor while a request or a warm may be making an instance
// (one not counted until it is made: a top-up beside a slow constructor
// made a second), nor beside another warm of the version (warmCurrent's
// warming, which it holds while it runs), and one every topUpEvery at most,
// doubling after each that failed (an init that keeps failing, a device
// that refuses the memory) up to topUpDoublings times.
func (e *Engine) topUp(f *function, v *version, now time.Time) {
	keep := e.keepWarm(v)
	wait := topUpEvery << min(v.topFails.Load(), topUpDoublings)
	if keep == 0 || now.UnixNano() < v.pool.backoffUntil.Load() || now.UnixNano()-v.toppedAt.Load() < int64(wait) ||
		v.pool.building() || e.tab.currentOf(f) != v {
		return
	}
	if n, retired := v.pool.instances(); n >= keep || retired || !v.warming.CompareAndSwap(false, true) {
		return
	}
	v.toppedAt.Store(now.UnixNano())
	go func() {
		defer v.warming.Store(false)
		if e.topUpNow(f, v) != nil {
			v.topFails.Add(1)
		} else {
			v.topFails.Store(0)
		}
	}()
}

// topUpNow is topUp's warm of v, on a goroutine of its own: a panic in
// it (a device's Go code) is logged and counted as a failed top-up, so
// that the next waits longer, rather than ending the process.
func (e *Engine) topUpNow(f *function, v *version) (err error) {
	defer func() {
		if p := e.survived("topping up to min_instances", f.name, recover()); p != nil {
			err = p
		}
	}()
	// Under the table's life, as a poll's warms are: Close ends a load
	// under way rather than leaving it to spawn on closing devices.
	return e.warmTaken(e.tab.life, f, v) // v itself: a deploy meanwhile pre-warms its own
}

// keepWarm is the instances topUp keeps v at: its min_instances once it
// is loaded; before, one where its record asks for some and its pre-warm
// failed (the store unreachable a moment, the bundle cache full), which
// left it cold until its first request: warmTaken then makes them all.
// Not before a warm was tried: a deploy's or a poll's warm of it is under
// way or to come, and a top-up beside it would take the warm over (one at
// a time), the deploy answering before its instances are made. None
// after one was refused for good (warmRefusal): every try would meet the
// refusal again, and say so in the log, for as long as v was current.
func (e *Engine) keepWarm(v *version) int {
	switch {
	case v.warmRefusal() != nil:
		return 0
	case v.loaded.Load():
		return v.minInstances() // its policy, read once loaded
	case v.warmFailed.Load() && !v.side.Load() && e.wantsWarm(v.rec):
		return 1
	}
	return 0
}

// topUpEvery is the least time between two top-ups of a version; after
// failed ones it doubles, topUpDoublings times at most (to about 10 min).
const (
	topUpEvery     = 10 * time.Second
	topUpDoublings = 6
)
