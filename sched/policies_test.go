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

// A run is charged the device time it used, when its device says: not the
// time it held its slot (which includes waiting for the device when runs
// outnumber it), but at least its slot time over the device's slots.
func TestChargeIsTheDeviceTimeUsed(t *testing.T) {
	for _, tc := range []struct {
		name       string
		held, used time.Duration
		want       time.Duration
	}{
		{"unknown: the slot time", 8 * time.Millisecond, 0, 8 * time.Millisecond},
		{"used less than held (waited for a CPU)", 8 * time.Millisecond, 3 * time.Millisecond, 3 * time.Millisecond},
		{"a sleeping run: the slot's share", 8 * time.Millisecond, time.Microsecond, 2 * time.Millisecond},
		{"more than held (another clock): held", 8 * time.Millisecond, 9 * time.Millisecond, 8 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newFakeClock()
			s := New(Config{MaxRuns: 4, Clock: clk})
			f := s.Flow("f")
			tk, _, err := f.Admit(t.Context(), time.Time{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			clk.Advance(tc.held)
			tk.DoneUsed(clk.Now(), tc.used)
			if got := f.DeviceTime(); got != tc.want {
				t.Fatalf("charged %v, want %v", got, tc.want)
			}
		})
	}
}
