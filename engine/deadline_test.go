package engine_test

import (
	"testing"
	"time"

	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
)

// A request that brings no deadline gets the engine's timeout from its
// start; one that brings its own keeps it, earlier or later than that,
// up to the engine's longest (MaxTimeout) from its start.
func TestDeadlineDefaultsToTheTimeout(t *testing.T) {
	e := testkit.Engine(t, engine.Config{Timeout: 5 * time.Second, MaxTimeout: time.Hour})
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tt := range []struct {
		name    string
		d, want time.Time
	}{
		{"none", time.Time{}, start.Add(5 * time.Second)},
		{"earlier", start.Add(time.Second), start.Add(time.Second)},
		{"later", start.Add(time.Minute), start.Add(time.Minute)},
		{"past", start.Add(-time.Second), start.Add(-time.Second)},
		{"at the longest", start.Add(time.Hour), start.Add(time.Hour)},
		{"past the longest", start.Add(49 * 24 * time.Hour), start.Add(time.Hour)},
	} {
		if got := e.Deadline(tt.d, start); !got.Equal(tt.want) {
			t.Errorf("%s: Deadline(%v, start) = %v, want %v", tt.name, tt.d, got, tt.want)
		}
	}
}

// The longest deadline defaults to 10 minutes, and is never less than the
// timeout.
func TestMaxTimeoutDefaults(t *testing.T) {
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	far := start.Add(49 * 24 * time.Hour)
	for _, tt := range []struct {
		name string
		cfg  engine.Config
		want time.Duration
	}{
		{"default", engine.Config{Timeout: 5 * time.Second}, 10 * time.Minute},
		{"below the timeout", engine.Config{Timeout: time.Hour, MaxTimeout: time.Minute}, time.Hour},
	} {
		e := testkit.Engine(t, tt.cfg)
		if got := e.Deadline(far, start); !got.Equal(start.Add(tt.want)) {
			t.Errorf("%s: a 49-day deadline is cut to %v from the start, want %v", tt.name, got.Sub(start), tt.want)
		}
	}
}
