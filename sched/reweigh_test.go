package sched

import (
	"context"
	"math"
	"testing"
	"time"
)

// A function redeployed with another share while one of its runs is on the
// device: the run's end corrects the charge its start made, at the weight
// the start made it at, and the run costs its device time over the weight
// the flow has now. Corrected at the new weight, a run that took less than
// its estimate after a share went from 1000 to 0.01 moved the flow's tag
// back by its estimate over 0.01: a second's estimate let it take every
// pick for 100 s of others' device time.
func TestWeightChangedWhileRunningChargesTheRunOnce(t *testing.T) {
	for _, c := range []struct {
		name     string
		from, to float64
		est, ran time.Duration
	}{
		{"lowered, shorter than its estimate", 1000, 0.01, time.Second, time.Millisecond},
		{"lowered, longer than its estimate", 1000, 0.01, time.Millisecond, time.Second},
		{"raised, shorter than its estimate", 0.01, 1000, time.Second, time.Millisecond},
		{"raised, longer than its estimate", 0.01, 1000, time.Millisecond, time.Second},
		{"unchanged", 2, 2, time.Second, time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			clk := newFakeClock()
			w := NewWFQ(time.Second)
			s := New(Config{MaxRuns: 1, Policy: w, Clock: clk})
			f := s.Flow("f")
			f.Set(c.from, Default)
			// One run teaches the flow its estimate.
			tk, _, err := f.Admit(context.Background(), time.Time{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			clk.Advance(c.est)
			tk.Done()

			tk, _, err = f.Admit(context.Background(), time.Time{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			s.mu.Lock()
			tag0 := w.state(f).tag - c.est.Seconds()*1e9/c.from // before the start's charge
			s.mu.Unlock()
			f.Set(c.to, Default)
			clk.Advance(c.ran)
			tk.Done()
			s.mu.Lock()
			moved := w.state(f).tag - tag0
			s.mu.Unlock()
			if want := float64(c.ran) / c.to; math.Abs(moved-want) > 1e-6*want {
				t.Fatalf("the run moved the tag %.4g, want its %v over the weight %v: %.4g", moved, c.ran, c.to, want)
			}
		})
	}
}
