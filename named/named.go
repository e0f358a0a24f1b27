// Package named is the registry Plover's pluggable parts register
// themselves in, each in its own init (database/sql's drivers are the
// model): bundle targets (abi), device kinds (device), scheduling policies
// (sched) and eviction policies (evict). A new one is a file beside the
// others and a Register call; flags and help text list the names the
// registry holds, and a name it does not hold is refused naming them. It
// imports nothing of Plover, so the lowest of those packages can use it.
package named

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
)

// Registry holds values of T by name. Entries register at init and are
// read for the rest of the process's life; the lock makes a late
// registration (a test's) safe, and readers share it.
type Registry[T any] struct {
	what string // an entry as messages name it: "scheduling policy"

	mu sync.RWMutex
	m  map[string]T
}

// New is an empty registry whose entries messages call what.
func New[T any](what string) *Registry[T] {
	return &Registry[T]{what: what, m: map[string]T{}}
}

// Register adds v as name. An empty name, a nil v or a name registered
// twice is a programming error, found at init: it panics.
func (r *Registry[T]) Register(name string, v T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.m[name]; dup || name == "" || isNil(v) {
		panic(fmt.Sprintf("named: %s %q: empty, nil or registered twice", r.what, name))
	}
	r.m[name] = v
}

// Get is the entry registered as name, if any.
func (r *Registry[T]) Get(name string) (T, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	v, ok := r.m[name]
	return v, ok
}

// Lookup is the entry registered as name, or an *UnknownError naming the
// registered ones.
func (r *Registry[T]) Lookup(name string) (T, error) {
	if v, ok := r.Get(name); ok {
		return v, nil
	}
	var zero T
	return zero, &UnknownError{What: r.what, Name: name, Known: r.Names()}
}

// Names are the registered names, sorted: the order flags and help text
// list them in.
func (r *Registry[T]) Names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return slices.Sorted(maps.Keys(r.m))
}

// UnknownError is a lookup of a name nothing registered.
type UnknownError struct {
	What, Name string
	Known      []string // the registered names, sorted
}

func (e *UnknownError) Error() string {
	return fmt.Sprintf("%s %q: want one of %s", e.What, e.Name, strings.Join(e.Known, ", "))
}

// isNil says whether v is a nil func, pointer, map, interface, slice or
// channel, or an interface holding one (a nil *T as an Evictor): a
// registration that would fail only when first used.
func isNil[T any](v T) bool {
	rv := reflect.ValueOf(&v).Elem()
	if rv.Kind() == reflect.Interface && !rv.IsNil() {
		rv = rv.Elem()
	}
	switch rv.Kind() {
	case reflect.Func, reflect.Pointer, reflect.Map, reflect.Interface, reflect.Slice, reflect.Chan:
		return rv.IsNil()
	}
	return false
}
