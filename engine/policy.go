package engine

import (
	"time"

	"github.com/plover-run/plover/abi"
)

// policy is a version's pool policy: its manifest over the server defaults.
type policy struct {
	min, max, queue int
	idleTTL         time.Duration // <= 0: never release for idleness
}

// sideTTL is the idle_ttl of a version pipelines pinned that is not
// current, when its own policy never releases: such a version serves
// pipelines alone and must not hold a worker and device memory for ever.
const sideTTL = 5 * time.Minute

// minInstances is the instances v keeps: none for a pinned version that is
// not current (its min_instances is for when it is the function's).
func (v *version) minInstances() int {
	if v.side.Load() {
		return 0
	}
	return v.policy.min
}

// idleTTL is how long v's idle instances, and v itself, are kept.
func (v *version) idleTTL() time.Duration {
	if v.side.Load() && v.policy.idleTTL <= 0 {
		return sideTTL
	}
	return v.policy.idleTTL
}

func (e *Engine) policyFor(m *abi.Manifest) policy {
	p := policy{min: e.cfg.MinInstances, max: e.cfg.MaxInstances, queue: e.cfg.MaxQueue, idleTTL: e.cfg.IdleTTL}
	if m.MinInstances > 0 {
		p.min = m.MinInstances
	}
	if m.MaxInstances > 0 {
		p.max = m.MaxInstances
	}
	if m.MaxQueue > 0 {
		p.queue = m.MaxQueue
	}
	if d, ok := m.IdleTTLDuration(); ok {
		p.idleTTL = d
	}
	if p.min > p.max {
		p.min = p.max
	}
	return p
}

// Idle is something idle on a device that the engine could free to make
// room: an instance in a function's warm pool, or a loaded function with
// no instance and no request in flight (its program: library and
// constants). The ledger gathers them from its bookkeeping, the last-use
// time every request's end records, and frees the one the Evictor picks.
type Idle struct {
	Function string
	Instance bool      // an idle instance; false: the function's program
	Bytes    int64     // what freeing it gives back on the device
	LastUsed time.Time // when its last request ended (a program: its function's)
}

// Evictor decides what goes when a device is short of memory. The engine
// keeps the pools, frees what it picks and accounts for it (ledger.go), as
// open-lambda keeps its evictors apart from the sandboxes they evict. Pick
// is shown only what may go: never a busy instance, an instance that
// min_instances keeps, or the whole function the room is for (its idle
// instances may be shown); it is called
// under the ledger's lock, so it must be quick and must not call the
// engine. (Idleness, the other reason to free, is each function's
// idle_ttl: configuration, applied by Reap.)
type Evictor interface {
	// Pick returns the index in idle (never empty) of the next thing to
	// free, or -1 to free nothing more. It must not keep idle.
	Pick(idle []Idle) int
}

// LRU is the default Evictor: idle instances before programs (an instance
// is recreated in microseconds, a program costs its function a cold
// start), each kind least recently used first.
type LRU struct{}

// Pick implements Evictor.
func (LRU) Pick(idle []Idle) int {
	best := -1
	for i, c := range idle {
		if best < 0 {
			best = i
			continue
		}
		b := idle[best]
		if c.Instance != b.Instance {
			if c.Instance {
				best = i
			}
			continue
		}
		if c.LastUsed.Before(b.LastUsed) {
			best = i
		}
	}
	return best
}
