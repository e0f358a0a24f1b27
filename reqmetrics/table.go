package reqmetrics

import (
	"strings"
	"sync"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/call"
)

// Labels that are no function's own: Unknown, of requests for names no
// function has (or had: see Table.Forget); Other, of functions met past a
// Table's limit. Function names have no '_', so neither is one.
const (
	Unknown = "_unknown"
	Other   = "_other"
)

// Table is the bounded set of names (functions' and pipelines') that have
// metric series of their own, each with what its series are (a T, made
// when the name takes a slot and dropped when it is forgotten): the
// request metrics keep one, and so do a pipeline's step metrics (package
// pipeline). At most limit names have their own; a name met past them
// shares Other's series, one that no function can have Unknown's, so
// that neither a client probing names nor functions coming and going can
// grow the series without bound. Forget, which the engine calls when a
// function leaves the node (engine.Forgetter), gives the name's slot back:
// the next name met takes it. It is safe for concurrent use.
type Table[T any] struct {
	mu    sync.RWMutex
	slots map[string]*T // by name: its own series, or those of Unknown and Other
	own   int           // the slots of names (not Unknown's, not Other's)
	limit int
	gone  forgotten
	make  func(label string) *T
	drop  func(*T) // deletes its series; under mu, so that a name met again makes its series anew after they went
}

// NewTable is a table of limit names, make making a name's series under
// label (the name, Unknown or Other) and drop deleting them.
func NewTable[T any](limit int, make func(label string) *T, drop func(*T)) *Table[T] {
	return &Table[T]{slots: map[string]*T{}, limit: limit, make: make, drop: drop}
}

// Of is the series of name (which may be borrowed) when it has its own,
// else nil: one not met yet, forgotten, or met past the limit.
func (t *Table[T]) Of(name string) *T {
	t.mu.RLock()
	s := t.slots[name]
	t.mu.RUnlock()
	return s
}

// Take is name's series: its own (a copy of name is kept the first time),
// or Other's past the limit, or Unknown's for a name no function can have
// and for one forgotten and not met since. Where name has a slot it takes
// a read lock and a map lookup, and allocates nothing.
func (t *Table[T]) Take(name call.Name) *T {
	fn := name.Borrow() // for the lookups
	if s := t.Of(fn); s != nil {
		return s
	}
	if fn != Unknown && !abi.ValidName(fn) {
		// A label that is not UTF-8 fails every scrape: whatever a
		// client sent shares one series.
		return t.Take(call.NameOf(Unknown))
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if s := t.slots[fn]; s != nil {
		return s
	}
	switch {
	case fn == Unknown || t.gone.has(fn):
		// A request of a deleted function that ended after its delete
		// would otherwise take a slot the name would then hold for good.
		return t.shared(Unknown)
	case t.own >= t.limit:
		// Names past the limit share one series and one entry: a name
		// is not kept once its series is no longer its own.
		return t.shared(Other)
	}
	label := name.Keep()
	s := t.make(label)
	t.slots[label] = s
	t.own++
	return s
}

// shared is label's series, made the first time. Called with t.mu held.
func (t *Table[T]) shared(label string) *T {
	s := t.slots[label]
	if s == nil {
		s = t.make(label)
		t.slots[label] = s
	}
	return s
}

// Met tells the table that a function of name is on the node (deployed,
// looked up or polled): a name forgotten takes a slot again when it is
// next met in a request.
func (t *Table[T]) Met(name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.gone.remove(name)
}

// Forget drops name's series and gives its slot back, and reports whether
// it had one. Until name is met again (Met), requests for it count under
// Unknown: those of the deleted function still in flight do not take the
// slot back. The forgotten names kept for that are bounded (the limit's
// number, the oldest let go first), so a request that ends after as many
// later deletes may make the name's series once more, in a slot of the
// limit's like any name's.
func (t *Table[T]) Forget(name string) bool {
	if !abi.ValidName(name) {
		return false // Unknown and Other are never forgotten
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.gone.add(strings.Clone(name), t.limit) // kept: not a caller's borrowed bytes
	s := t.slots[name]
	if s == nil {
		return false
	}
	delete(t.slots, name)
	t.own--
	t.drop(s)
	return true
}

// forgotten is the names forgotten and not met since, at most n of them:
// past n the oldest is let go (a ring of names, each with its place).
type forgotten struct {
	at   map[string]uint64 // name: the count of adds when it was added
	ring []string          // the names by their add count, modulo n
	adds uint64
}

func (f *forgotten) has(name string) bool {
	_, ok := f.at[name]
	return ok
}

func (f *forgotten) remove(name string) { delete(f.at, name) }

func (f *forgotten) add(name string, n int) {
	if f.ring == nil {
		f.ring, f.at = make([]string, max(n, 1)), map[string]uint64{}
	}
	i := f.adds % uint64(len(f.ring))
	if old := f.ring[i]; old != "" {
		if at, ok := f.at[old]; ok && at+uint64(len(f.ring)) == f.adds {
			delete(f.at, old) // still there from this place: the oldest
		}
	}
	f.ring[i], f.at[name] = name, f.adds
	f.adds++
}
