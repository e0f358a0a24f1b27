package sched

import (
	"context"
	"testing"
	"time"
)

// A host run (Capacity 0: its measure is its own CPU time, several
// threads' worth) is billed what it used, at most its slot time times the
// slots, whether it ends in time or is expired at its deadline because
// another run waited: expired, it was billed its slot time alone and what
// its holder then reported was dropped (a review's probe: 10 s billed for
// 40 s of CPU), so a chain on many threads that always overran beside
// others was billed a fraction of what it used.
func TestAnExpiredHostRunIsBilledItsMeasure(t *testing.T) {
	for _, tc := range []struct {
		name   string
		expire bool
		used   time.Duration
		want   time.Duration
	}{
		{"ended", false, 40 * time.Second, 40 * time.Second},
		{"expired", true, 40 * time.Second, 40 * time.Second},
		{"expired, a measure past the slots", true, 90 * time.Second, 40 * time.Second},
		{"expired, a measure below its slot time", true, 4 * time.Second, 10 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newFakeClock()
			s := New(Config{MaxRuns: 4, SharedRuns: 1, Clock: clk})
			f, g := s.Flow("f"), s.Flow("g")
			bg := context.Background()
			tk, _, err := f.Admit(bg, clk.Now().Add(10*time.Second), nil)
			if err != nil {
				t.Fatal(err)
			}
			var gc <-chan result
			if tc.expire {
				gc = admitAsync(g, bg, time.Time{}, nil) // waits: SharedRuns 1
				waitFor(t, "g queued", func() bool { return g.queued() == 1 })
			}
			clk.Advance(10 * time.Second)
			if tc.expire {
				got(t, gc, "g") // f's run expired: g has its slot
			}
			tk.DoneUsed(clk.Now(), tc.used)
			if d := f.DeviceTime(); d != tc.want {
				t.Errorf("a 10 s run measured %v, %s: billed %v, want %v", tc.used, tc.name, d, tc.want)
			}
		})
	}
}
