package sched

import (
	"context"
	"testing"
	"time"
)

// A run in flight when the share changes, while another flow's start has
// moved the clock into the run's charge ahead (0 < lead < charged): the
// run's end takes back exactly what the tag holds of it. The first fix of
// share changes scaled the lead only, and the run's whole charge: a
// 1.5 ms run moved its tag by -5e10, half a second of its device time.
func TestReweighWithTheClockInsideARunsCharge(t *testing.T) {
	for _, c := range []struct {
		name     string
		from, to float64
		gRan     time.Duration // g's second run: sets where the clock lands
	}{
		{"lowered, clock inside the charge", 1000, 0.01, 500 * time.Microsecond},
		{"lowered, clock past the tag", 1000, 0.01, 1500 * time.Microsecond},
		{"raised, clock inside the charge", 0.01, 1000, 500 * time.Microsecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			clk := newFakeClock()
			w := NewWFQ(time.Second)
			s := New(Config{MaxRuns: 2, Policy: w, Clock: clk})
			f, g := s.Flow("f"), s.Flow("g")
			f.Set(c.from, Default)
			// f learns an estimate of 1s.
			ranFor(t, clk, f, time.Second)
			// g learns an estimate (1ms) and sits at the clock.
			ranFor(t, clk, g, time.Millisecond)
			tf := admitted(t, f) // f's run in flight
			fAt := clk.Now()
			s.mu.Lock()
			fStart := w.state(f).tag - float64(time.Second)/c.from
			s.mu.Unlock()
			// g runs beside it twice: its second start moves the clock.
			ranFor(t, clk, g, c.gRan)
			tg := admitted(t, g)
			s.mu.Lock()
			t.Logf("f tag %.6g, clock %.6g, lead %.6g, f's run charged %.6g", w.state(f).tag, w.vnow[Default], w.state(f).tag-w.vnow[Default], float64(time.Second)/c.from)
			s.mu.Unlock()
			f.Set(c.to, Default) // the redeploy
			clk.Advance(time.Millisecond)
			tf.Done()
			tg.Done()
			s.mu.Lock()
			moved := w.state(f).tag - fStart
			lag := w.vnow[Default] - w.state(f).tag
			s.mu.Unlock()
			ran := clk.Now().Sub(fAt)
			want := float64(ran) / c.to
			t.Logf("f's %v run moved its tag by %.6g (want %.6g); f lags the clock by %.6g = %v of device time at share %v",
				ran, moved, want, lag, time.Duration(lag*c.to), c.to)
			if d := moved - want; d > 1e-6*want || d < -1e-6*want {
				t.Errorf("run's end did not take back what its start added: moved %.6g, want %.6g", moved, want)
			}
		})
	}
}

// The first case of TestReweighWithTheClockInsideARunsCharge, then f and g
// flood with 1 ms runs: f's part of the next 200 runs (fair: 0.01 against
// 1, about 2; it took 195 with the lead alone scaled).
func TestReweighMidRunKeepsTheShares(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 2, Clock: clk, MaxWait: time.Hour})
	f, g := s.Flow("f"), s.Flow("g")
	f.Set(1000, Default)
	ranFor(t, clk, f, time.Second)
	ranFor(t, clk, g, time.Millisecond)
	tf := admitted(t, f)
	tg := admitted(t, g)
	clk.Advance(500 * time.Microsecond)
	tg.Done()
	tg = admitted(t, g)
	f.Set(0.01, Default) // the redeploy, f's run in flight
	chans := map[*Flow]<-chan result{}
	for _, x := range []*Flow{f, g} {
		chans[x] = admitAsync(x, context.Background(), time.Time{}, nil)
		waitFor(t, "queued", func() bool { return x.queued() == 1 })
	}
	cur := []Ticket{tf, tg}
	runs := map[*Flow]int{}
	for i := 0; i < 200; i++ {
		clk.Advance(time.Millisecond)
		cur[0].Done()
		x, r := nextOf(t, chans, f, g)
		cur = append(cur[1:], r.t)
		runs[x]++
	}
	t.Logf("of the next 200 runs: f (share 0.01) %d, g (share 1) %d", runs[f], runs[g])
	if runs[f] > 10 {
		t.Errorf("f took %d of 200", runs[f])
	}
}

// A batch flow of share 0.01 with a run in flight, lagging the clock, is
// redeployed as latency share 1 beside a latency flood of share 1: its
// place is lifted to the clock and its run's end takes back only what it
// was charged (it took 100 of 100 when the end took back the charge at
// the old share from a lifted tag).
func TestClassLiftWithARunInFlight(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 2, Clock: clk, MaxWait: time.Hour})
	f, g, h := s.Flow("f"), s.Flow("g"), s.Flow("h")
	f.Set(0.01, Batch)
	g.Set(1, Latency)
	h.Set(0.01, Default)
	ranFor(t, clk, h, time.Second)          // h used a second: its tag is far ahead
	ranFor(t, clk, f, 100*time.Millisecond) // f learns a 100ms estimate
	tf := admitted(t, f)                    // f's run in flight, charged 10ms/0.01
	th := admitted(t, h)                    // h's start moves the clock far past f's tag
	clk.Advance(time.Millisecond)
	th.Done()
	f.Set(1, Latency)               // the redeploy
	cur := []Ticket{admitted(t, g)} // g's flood takes the other slot
	chans := map[*Flow]<-chan result{}
	for _, x := range []*Flow{f, g} {
		chans[x] = admitAsync(x, context.Background(), time.Time{}, nil)
		waitFor(t, "queued", func() bool { return x.queued() == 1 })
	}
	clk.Advance(9 * time.Millisecond)
	tf.Done() // f's run ends while f has one queued: f stays active
	x, r := nextOf(t, chans, f, g)
	cur = append(cur, r.t)
	t.Logf("first after the end: %v", x == f)
	runs := map[*Flow]int{}
	for i := 0; i < 100; i++ {
		clk.Advance(10 * time.Millisecond)
		cur[0].Done()
		x, r := nextOf(t, chans, f, g)
		cur = append(cur[1:], r.t)
		runs[x]++
	}
	t.Logf("of the next 100 runs: f %d, g %d", runs[f], runs[g])
	if runs[f] > 65 {
		t.Errorf("f, moved to latency share 1 beside g's latency share-1 flood, took %d of 100, want about 50", runs[f])
	}
}

// admitted is a run of x admitted now.
func admitted(t *testing.T, x *Flow) Ticket {
	t.Helper()
	tk, _, err := x.Admit(context.Background(), time.Time{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// ranFor admits a run of x that holds the device for d.
func ranFor(t *testing.T, clk *fakeClock, x *Flow, d time.Duration) {
	t.Helper()
	tk := admitted(t, x)
	clk.Advance(d)
	tk.Done()
}
