package sched

import (
	"testing"
	"time"
)

// A flow floods while it has two or more runs queued or running and for d
// after (what the light workers' boost asks), and never with one at a
// time, however long and however many in a row.
func TestFlooding(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 4, Clock: clk})
	one, two := s.Flow("one"), s.Flow("two")
	admit := func(f *Flow) Ticket {
		t.Helper()
		tk, w := s.enter(f, clk.Now(), time.Time{}, 0)
		if w != nil {
			t.Fatal("a run queued with slots free")
		}
		return tk
	}
	const d = 250 * time.Millisecond
	for range 5 {
		tk := admit(one)
		clk.Advance(time.Second)
		if one.Flooding(d) {
			t.Fatal("a flow with one run at a time floods")
		}
		tk.Done()
	}
	a, b := admit(two), admit(two)
	if !two.Flooding(d) {
		t.Fatal("a flow with two runs at once does not flood")
	}
	a.Done()
	clk.Advance(100 * time.Millisecond)
	b.Done()
	if !two.Flooding(d) {
		t.Fatal("a flow that had two runs at once 100 ms ago does not flood within 250 ms")
	}
	clk.Advance(d)
	if two.Flooding(d) {
		t.Fatal("a flow floods 250 ms after it had two runs at once")
	}
	if one.Flooding(d) {
		t.Fatal("another flow's runs made one flood")
	}
}
