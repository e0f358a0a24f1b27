// Package evict holds the policies that decide what goes when a device is
// short of memory (open-lambda's evictors are the model): the engine keeps
// the pools, gathers what may go, frees what a policy picks and accounts
// for it; a policy only picks. Each registers itself under a name, so a
// new one is a file here and plover serve --evict NAME selects it.
package evict

import (
	"time"

	"github.com/plover-run/plover/named"
)

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
// min_instances keeps, a function that min_instances keeps (even with no
// instance left), or the whole function the room is for (its idle
// instances may be shown); it is called
// under the ledger's lock, so it must be quick and must not call the
// engine. (Idleness, the other reason to free, is each function's
// idle_ttl: configuration, applied by Reap.)
type Evictor interface {
	// Pick returns the index in idle (never empty) of the next thing to
	// free, or -1 to free nothing more. It must not keep idle.
	Pick(idle []Idle) int
}

func init() {
	Register("lru", LRU{})
	Register("largest", Largest{})
}

// LRU is the default Evictor: idle instances before programs (an instance
// is recreated in microseconds, a program costs its function a cold
// start), each kind least recently used first.
type LRU struct{}

// Pick implements Evictor.
func (LRU) Pick(idle []Idle) int {
	return pick(idle, func(c, b Idle) bool { return c.LastUsed.Before(b.LastUsed) })
}

// Largest frees idle instances before programs, as LRU does, and among
// each the one that gives back the most memory first: the fewest
// evictions to make room for a large function, at the cost of sometimes
// evicting something used a moment ago.
type Largest struct{}

// Pick implements Evictor.
func (Largest) Pick(idle []Idle) int {
	return pick(idle, func(c, b Idle) bool {
		return c.Bytes > b.Bytes || (c.Bytes == b.Bytes && c.LastUsed.Before(b.LastUsed))
	})
}

// pick is the index of the idle entry to evict first: an instance before
// any program, and among the same kind the one first goes before b; -1
// when idle is empty.
func pick(idle []Idle, first func(c, b Idle) bool) int {
	best := -1
	for i, c := range idle {
		switch {
		case best < 0:
			best = i
		case c.Instance != idle[best].Instance:
			if c.Instance {
				best = i
			}
		case first(c, idle[best]):
			best = i
		}
	}
	return best
}

// Default is the policy used when none is named.
const Default = "lru"

var evictors = named.New[Evictor]("eviction policy")

// Register adds an eviction policy; an empty name, a nil policy or a
// second of the same name is a programming error (it panics).
func Register(name string, e Evictor) { evictors.Register(name, e) }

// Names are the registered policies, sorted.
func Names() []string { return evictors.Names() }

// Lookup is the policy registered as name ("": Default).
func Lookup(name string) (Evictor, error) {
	if name == "" {
		name = Default
	}
	return evictors.Lookup(name)
}
