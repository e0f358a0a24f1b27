package engine_test

import (
	"testing"
	"time"

	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
)

// A request that brings no deadline gets the engine's timeout from its
// start; one that brings its own keeps it, earlier or later than that.
func TestDeadlineDefaultsToTheTimeout(t *testing.T) {
	e := testkit.Engine(t, engine.Config{Timeout: 5 * time.Second})
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tt := range []struct {
		name    string
		d, want time.Time
	}{
		{"none", time.Time{}, start.Add(5 * time.Second)},
		{"earlier", start.Add(time.Second), start.Add(time.Second)},
		{"later", start.Add(time.Minute), start.Add(time.Minute)},
		{"past", start.Add(-time.Second), start.Add(-time.Second)},
	} {
		if got := e.Deadline(tt.d, start); !got.Equal(tt.want) {
			t.Errorf("%s: Deadline(%v, start) = %v, want %v", tt.name, tt.d, got, tt.want)
		}
	}
}
