package sched

import (
	"math"
	"slices"
	"testing"
	"time"
)

// Policies register themselves and are made by name; FIFO ignores
// weights: with three clients each, 3:1 weights split device time by the
// clients, half and half, where WFQ splits it 3:1.
func TestPoliciesByName(t *testing.T) {
	if got := Policies(); !slices.Contains(got, "wfq") || !slices.Contains(got, "fifo") {
		t.Fatalf("Policies() = %v, want wfq and fifo among them", got)
	}
	if _, err := NewPolicy("lottery", 0); err == nil {
		t.Fatal("NewPolicy of an unknown name: no error")
	}
	for _, tc := range []struct {
		policy string
		wantA  float64
	}{{"", 0.75}, {"wfq", 0.75}, {"fifo", 0.5}} {
		t.Run(tc.policy, func(t *testing.T) {
			clk := newFakeClock()
			s := New(Config{MaxRuns: 1, Clock: clk, PolicyName: tc.policy})
			a, b := s.Flow("a"), s.Flow("b")
			a.Set(3, Default)
			b.Set(1, Default)
			serial(t, clk, 400, func(*Flow) time.Duration { return time.Millisecond }, a, a, a, b, b, b)
			fa := float64(a.DeviceTime()) / float64(a.DeviceTime()+b.DeviceTime())
			if math.Abs(fa-tc.wantA) > 0.03 {
				t.Fatalf("a had %.3f of device time, want %.2f", fa, tc.wantA)
			}
		})
	}
}
