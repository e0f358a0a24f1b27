package call

import (
	"testing"
	"time"
)

// End makes Dispatch what no other part holds, and keeps Handoff and
// Handback, which a worker reports, within it.
func TestEndBoundsDispatchsParts(t *testing.T) {
	for _, tc := range []struct {
		name                string
		in                  Timing
		total               time.Duration
		dispatch, off, back time.Duration
	}{
		{"within", Timing{Kernels: 5, Handoff: 2, Handback: 3}, 20, 15, 2, 3},
		{"each past dispatch", Timing{Kernels: 15, Handoff: 9, Handback: 9}, 20, 5, 5, 0},
		{"together past dispatch", Timing{Kernels: 10, Handoff: 6, Handback: 6}, 20, 10, 6, 4},
		{"no dispatch", Timing{Kernels: 30, Handoff: 1, Handback: 1}, 20, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tm := tc.in
			tm.End(tc.total)
			if tm.Dispatch != tc.dispatch || tm.Handoff != tc.off || tm.Handback != tc.back {
				t.Fatalf("dispatch %v, handoff %v, handback %v; want %v, %v, %v", tm.Dispatch, tm.Handoff, tm.Handback, tc.dispatch, tc.off, tc.back)
			}
		})
	}
}
