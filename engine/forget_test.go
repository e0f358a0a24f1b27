package engine

import (
	"slices"
	"testing"
)

// A function forgotten on this node (deleted here, or found deleted by a
// refresh) is told to forgotten, which drops its kept output and ends its
// followers; a refresh whose epoch moved on forgets nothing.
func TestForgetTellsForgotten(t *testing.T) {
	var got []string
	tab := &table{funcs: map[string]*function{"f": {name: "f"}, "g": {name: "g"}}, tags: map[string]string{},
		epoch: 1, forgotten: func(name string) { got = append(got, name) }}
	tab.forget("f", 0)
	tab.forget("g", 7) // a refresh that read epoch 7: stale
	tab.forget("g", tab.epoch)
	if !slices.Equal(got, []string{"f", "g"}) {
		t.Fatalf("forgotten told %v, want [f g]", got)
	}
}
