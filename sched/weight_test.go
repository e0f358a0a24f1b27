package sched

import (
	"context"
	"math"
	"testing"
	"time"
)

// A weight that is no weight (a manifest's share is checked at deploy:
// 0.01..1000; one that slipped through) is the default 1: NaN made the
// clock NaN at the flow's first start (math.Max), and every tag after it,
// so that no pick compared; +Inf charged the flow nothing, for ever.
func TestNonFiniteWeightIsTheDefault(t *testing.T) {
	for _, wt := range []float64{math.NaN(), math.Inf(1), math.Inf(-1), 0, -2, 1e-310, 1e-300, 1e300} {
		clk := newFakeClock()
		w := NewWFQ(time.Second)
		s := New(Config{MaxRuns: 1, Policy: w, Clock: clk})
		f := s.Flow("f")
		f.Set(wt, Latency)
		s.mu.Lock()
		got := f.Weight()
		s.mu.Unlock()
		if want := map[float64]float64{1e-310: MinWeight, 1e-300: MinWeight, 1e300: MaxWeight}[wt]; want == 0 && got != 1 || want != 0 && got != want {
			t.Errorf("Set(%v): weight %v, want %v (0: 1)", wt, got, want)
			continue
		}
		tk, _, err := f.Admit(context.Background(), time.Time{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		clk.Advance(time.Millisecond)
		tk.Done()
		s.mu.Lock()
		tag, vnow := w.state(f).tag, w.vnow[Default]
		s.mu.Unlock()
		if math.IsNaN(tag) || math.IsInf(tag, 0) || math.IsNaN(vnow) || tag <= 0 {
			t.Errorf("Set(%v): after a run, tag %v, clock %v", wt, tag, vnow)
		}
	}
}
