package evict_test

import (
	"testing"
	"time"

	"github.com/plover-run/plover/evict"
)

func TestLRUPick(t *testing.T) {
	t0 := time.Unix(1000, 0)
	inst := func(fn string, ago int) evict.Idle {
		return evict.Idle{Function: fn, Instance: true, Bytes: 1, LastUsed: t0.Add(-time.Duration(ago) * time.Second)}
	}
	prog := func(fn string, ago int) evict.Idle {
		return evict.Idle{Function: fn, Bytes: 1, LastUsed: t0.Add(-time.Duration(ago) * time.Second)}
	}
	tests := []struct {
		name string
		idle []evict.Idle
		want string // the picked function; "" for an instance-vs-program check below
		inst bool
	}{
		{"one", []evict.Idle{inst("a", 1)}, "a", true},
		{"oldest instance", []evict.Idle{inst("a", 1), inst("b", 5), inst("c", 3)}, "b", true},
		{"instances before programs, however old", []evict.Idle{prog("old", 100), inst("a", 1)}, "a", true},
		{"oldest program when no instance", []evict.Idle{prog("a", 1), prog("b", 9), prog("c", 3)}, "b", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			i := evict.LRU{}.Pick(tt.idle)
			if i < 0 || tt.idle[i].Function != tt.want || tt.idle[i].Instance != tt.inst {
				t.Fatalf("picked %d (%+v), want %s (instance %v)", i, tt.idle, tt.want, tt.inst)
			}
		})
	}
}

// Largest frees the instance that gives back most first; policies are
// found by name.
func TestLargestAndRegistry(t *testing.T) {
	t0 := time.Unix(1000, 0)
	idle := []evict.Idle{
		{Function: "small-old", Instance: true, Bytes: 1 << 10, LastUsed: t0.Add(-time.Hour)},
		{Function: "big-new", Instance: true, Bytes: 1 << 20, LastUsed: t0},
		{Function: "huge-program", Bytes: 1 << 30, LastUsed: t0.Add(-time.Hour)},
	}
	if i := (evict.Largest{}).Pick(idle); idle[i].Function != "big-new" {
		t.Fatalf("Largest picked %s, want big-new (instances first, then the largest)", idle[i].Function)
	}
	if i := (evict.LRU{}).Pick(idle); idle[i].Function != "small-old" {
		t.Fatalf("LRU picked %s, want small-old", idle[i].Function)
	}
	for _, tc := range []struct {
		name string
		want any
		ok   bool
	}{{"", evict.LRU{}, true}, {"lru", evict.LRU{}, true}, {"largest", evict.Largest{}, true}, {"random", nil, false}} {
		e, err := evict.Lookup(tc.name)
		if (err == nil) != tc.ok || (tc.ok && e != tc.want) {
			t.Errorf("Lookup(%q) = %v, %v", tc.name, e, err)
		}
	}
}
