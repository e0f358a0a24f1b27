package wire

import (
	"testing"
	"time"
)

// The poll is twice the recent wait, none once that passes spinMax, and a
// long wait (a client that paused) weighs as 2*spinMax at most.
func TestWaitEstimate(t *testing.T) {
	us := func(n int) time.Duration { return time.Duration(n) * time.Microsecond }
	for _, tc := range []struct {
		name  string
		waits []time.Duration
		want  time.Duration
	}{
		{"nothing seen: no poll", nil, 0},
		{"short waits: twice them", []time.Duration{us(10), us(10), us(10)}, us(20)},
		{"a run's wait: no poll", []time.Duration{us(300)}, 0},
		{"one pause after short waits: no poll", []time.Duration{us(10), us(10), time.Second}, 0},
		{"short waits again after a pause: polling returns", []time.Duration{us(10), time.Second, us(10), us(10), us(10), us(10), us(10), us(10), us(10)}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var w WaitEstimate
			for _, d := range tc.waits {
				w.Observe(d)
			}
			got := w.Budget()
			if tc.name == "short waits again after a pause: polling returns" {
				if got <= 0 || got > SpinMax {
					t.Fatalf("budget %v after the pause decayed, want within (0, %v]", got, SpinMax)
				}
				return
			}
			if got != tc.want {
				t.Fatalf("budget %v, want %v", got, tc.want)
			}
		})
	}
}
