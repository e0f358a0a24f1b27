package sched

import (
	"context"
	"fmt"
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

// A redeploy that changes a function's share while its flow is ahead of
// the clock (it used the device just now: its last run, or its I/O) keeps
// that lead as device time, not as virtual time at the old weight: the
// flow waits for the others to use what it used over its new share. Kept
// as virtual time, a function raised from share 0.01 to 1000 after a 10 ms
// run waited for a share-1 neighbour's flood to use a second (100 of its
// 10 ms runs), its old share's wait; one lowered from 100 to 1 after a
// 100 ms run went after one, not ten. Alike whether the function was idle
// at the redeploy or had a run queued.
func TestWeightChangedKeepsTheLeadAsDeviceTime(t *testing.T) {
	const bRun = 10 * time.Millisecond
	for _, c := range []struct {
		name     string
		from, to float64
		aRan     time.Duration
	}{
		{"raised", 0.01, 1000, 10 * time.Millisecond},
		{"lowered", 100, 1, 100 * time.Millisecond},
		{"unchanged", 1, 1, 50 * time.Millisecond},
	} {
		for _, queued := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s, queued %v", c.name, queued), func(t *testing.T) {
				clk := newFakeClock()
				s := New(Config{MaxRuns: 1, Clock: clk})
				a, b := s.Flow("a"), s.Flow("b")
				a.Set(c.from, Default)
				tk, _, err := a.Admit(context.Background(), time.Time{}, nil)
				if err != nil {
					t.Fatal(err)
				}
				clk.Advance(c.aRan)
				tk.Done() // a is ahead of the clock by its run over its share
				cur, _, err := b.Admit(context.Background(), time.Time{}, nil)
				if err != nil {
					t.Fatal(err)
				}
				var ca <-chan result
				queue := func() {
					ca = admitAsync(a, context.Background(), time.Time{}, nil)
					waitFor(t, "a queued", func() bool { return a.queued() == 1 })
				}
				if queued {
					queue()
				}
				a.Set(c.to, Default) // the redeploy
				if !queued {
					queue()
				}
				runs := 0
				for ; runs < 500; runs++ {
					cb := admitAsync(b, context.Background(), time.Time{}, nil) // b floods
					waitFor(t, "b queued", func() bool { return b.queued() == 1 })
					clk.Advance(bRun)
					cur.Done()
					select {
					case r := <-ca:
						r.t.Done()
						got(t, cb, "b").t.Done()
					case r := <-cb:
						cur = r.t
						continue
					case <-time.After(5 * time.Second):
						t.Fatal("nothing admitted")
					}
					break
				}
				// b's runs before a's: b's device time reaches what a
				// used over its share now (b's share is 1), the run
				// holding the device at least.
				want := max(1, int(float64(c.aRan)/c.to/float64(bRun)))
				if runs+1 < want-1 || runs+1 > want+1 {
					t.Errorf("a (share %v -> %v after a %v run) went after %d of b's %v runs (share 1), want %d", c.from, c.to, c.aRan, runs+1, bRun, want)
				}
			})
		}
	}
}

// A function redeployed into another priority class while it has runs
// queued takes its place in the new class as a flow that wakes there, at
// the clock: its tag had lagged it below a busier class (batch behind a
// latency flood, which moves the clock), a place among its old class's
// flows that means nothing among the new one's. Kept, a batch flood moved
// to latency beside a latency flood of the same share took 100 of the
// next 100 runs: the second of device time it lagged by, owed to it by
// nobody.
func TestClassChangedStartsAtTheClock(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 1, Clock: clk, MaxWait: time.Hour})
	h, l, b := s.Flow("h"), s.Flow("l"), s.Flow("b")
	l.Set(1, Latency)
	b.Set(1, Batch)
	cur, _, err := h.Admit(context.Background(), time.Time{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	chans := map[*Flow]<-chan result{}
	for _, f := range []*Flow{l, b} {
		chans[f] = admitAsync(f, context.Background(), time.Time{}, nil)
		waitFor(t, "queued", func() bool { return f.queued() == 1 })
	}
	runs := map[*Flow]int{}
	for i := 0; i < 200; i++ {
		if i == 100 {
			if runs[b] != 0 {
				t.Fatalf("b (batch) ran %d times beside a latency flood with a MaxWait of an hour", runs[b])
			}
			b.Set(1, Latency) // the redeploy
			runs = map[*Flow]int{}
		}
		clk.Advance(10 * time.Millisecond)
		cur.Done()
		f, r := nextOf(t, chans, l, b)
		cur = r.t
		runs[f]++
	}
	if runs[b] < 40 || runs[b] > 60 {
		t.Errorf("b, moved from batch to latency beside a latency flood of its share, had %d of the next 100 runs, want about 50", runs[b])
	}
}
