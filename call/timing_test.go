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

// EndIn gives what no part holds to the part a request failed in, none to
// Dispatch, and leaves a part past the total as it is.
func TestEndInGivesTheRestToItsPart(t *testing.T) {
	for _, tc := range []struct {
		name        string
		in          Timing
		part        func(*Timing) *time.Duration
		total, left time.Duration // left: the part's after
	}{
		{"queue", Timing{Resolve: 2}, func(t *Timing) *time.Duration { return &t.Queue }, 20, 18},
		{"load after a queue", Timing{Resolve: 2, Queue: 5, Load: 3}, func(t *Timing) *time.Duration { return &t.Load }, 20, 13},
		{"resolve", Timing{Load: 4, Prep: 4}, func(t *Timing) *time.Duration { return &t.Resolve }, 20, 16},
		{"parts past the total", Timing{Resolve: 2, Queue: 30}, func(t *Timing) *time.Duration { return &t.Queue }, 20, 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tm := tc.in
			tm.EndIn(tc.part(&tm), tc.total)
			if tm.Total != tc.total || tm.Dispatch != 0 || *tc.part(&tm) != tc.left {
				t.Fatalf("total %v, dispatch %v, part %v; want %v, 0, %v", tm.Total, tm.Dispatch, *tc.part(&tm), tc.total, tc.left)
			}
		})
	}
}
