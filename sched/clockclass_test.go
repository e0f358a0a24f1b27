package sched

import (
	"context"
	"testing"
	"time"
)

// backlog drives flows whose clients queue a run again at once, in
// groups started and stopped on their own while the others stay
// backlogged.
type backlogRun struct {
	f *Flow
	t Ticket
}

type backlog struct {
	t        *testing.T
	clk      *fakeClock
	admitted chan backlogRun
	want     map[*Flow]int // clients per flow now
	stops    map[*Flow]context.CancelFunc
	nowait   bool
}

func newBacklog(t *testing.T, clk *fakeClock) *backlog {
	return &backlog{t: t, clk: clk, admitted: make(chan backlogRun), want: map[*Flow]int{}, stops: map[*Flow]context.CancelFunc{}}
}

func (d *backlog) start(f *Flow, k int) {
	ctx, cancel := context.WithCancel(context.Background())
	d.stops[f] = cancel
	d.want[f] = k
	for i := 0; i < k; i++ {
		go func() {
			for {
				tk, _, err := f.Admit(ctx, time.Time{}, nil)
				if err != nil {
					return
				}
				select {
				case d.admitted <- backlogRun{f, tk}:
				case <-ctx.Done():
					tk.Done()
					return
				}
			}
		}()
	}
	if !d.nowait {
		waitFor(d.t, "clients queued", func() bool { return f.Waiting() >= k-1 })
	} else {
		waitFor(d.t, "a client queued", func() bool { return f.Waiting() >= 1 })
	}
}

// stop ends f's clients (their queued runs leave; one admitted meanwhile
// is handed back).
func (d *backlog) stop(f *Flow) {
	d.stops[f]()
	delete(d.want, f)
	waitFor(d.t, "clients gone", func() bool { return f.Waiting() == 0 })
}

// run admits n runs, each holding the device cost(f).
func (d *backlog) run(n int, cost func(*Flow) time.Duration) map[*Flow]int {
	runs := map[*Flow]int{}
	for i := 0; i < n; i++ {
		var r backlogRun
		select {
		case r = <-d.admitted:
		case <-time.After(5 * time.Second):
			d.t.Fatal("nothing admitted")
		}
		waitFor(d.t, "every client queued", func() bool {
			for f, k := range d.want {
				if f.Waiting() != k {
					return false
				}
			}
			return true
		})
		runs[r.f]++
		d.clk.Advance(cost(r.f))
		r.t.Done()
	}
	return runs
}

// A default flow backlogged behind a latency flood lags its class's
// clock. With one clock for every class, moved by the latency flood's
// runs, a flow that then woke in the default class (d2), or the flood
// moved there by a redeploy, started far ahead of the lagging one and got
// nothing until it caught up (0 and 1 of 400 runs at an equal share).
func TestAFlowBesideOneLaggingBelowABusierClassGetsItsShare(t *testing.T) {
	for _, tc := range []struct {
		name string
		then func(d *backlog, lat, d2 *Flow) *Flow // the flow that should get half
	}{
		{"a flow wakes beside it", func(d *backlog, lat, d2 *Flow) *Flow { d.stop(lat); d.start(d2, 2); return d2 }},
		{"the flood moves to its class", func(d *backlog, lat, _ *Flow) *Flow { lat.Set(1, Default); return lat }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newFakeClock()
			s := New(Config{MaxRuns: 1, Clock: clk})
			lat, d1, d2 := s.Flow("lat"), s.Flow("d1"), s.Flow("d2")
			lat.Set(1, Latency)
			d := newBacklog(t, clk)
			ms := func(*Flow) time.Duration { return time.Millisecond }
			d.start(lat, 2)
			d.start(d1, 2)
			d.run(2000, ms) // d1 runs only past maxWait: its tag lags
			g := tc.then(d, lat, d2)
			first, runs := -1, 0
			for i := 0; i < 400; i++ {
				if r := d.run(1, ms); r[g] > 0 {
					runs++
					if first < 0 {
						first = i
					}
				}
			}
			if runs < 150 || first > 2 {
				t.Errorf("%d of 400 runs beside d1 at an equal share, the first after %d: want about half, at once", runs, first)
			}
		})
	}
}

// A light function's runs go into the reserved slot out of fair
// order; each start moves the shared clock to its tag, which at a small
// share runs far ahead of the floods' tags. A flood that wakes then starts
// at that clock, behind a backlogged flood of equal share that lags it,
// and is starved while the light function keeps calling.
func TestALowShareLightFunctionDoesNotDragTheClock(t *testing.T) {
	clk := newFakeClock()
	s := New(Config{MaxRuns: 2, Reserve: 1, Recent: time.Hour, Clock: clk})
	f1, f2, l := s.Flow("f1"), s.Flow("f2"), s.Flow("light")
	l.Set(0.01, Default)
	d := newBacklog(t, clk)
	d.nowait = true
	lightRun := func() {
		tk, _, err := l.Admit(context.Background(), time.Now().Add(2*time.Second), nil)
		if err != nil {
			t.Fatal(err)
		}
		clk.Advance(time.Millisecond)
		tk.Done()
	}
	lightRun() // listed: about from now on (Recent: an hour)
	d.start(f1, 2)
	step := func(n int, withLight bool) map[*Flow]int {
		runs := map[*Flow]int{}
		for i := 0; i < n; i++ {
			var r backlogRun
			select {
			case r = <-d.admitted:
			case <-time.After(5 * time.Second):
				t.Fatal("nothing admitted")
			}
			waitFor(t, "clients queued", func() bool {
				for f, k := range d.want {
					if f.Waiting() != k-boolInt(f == r.f) && f.Waiting() != k {
						return false
					}
				}
				return true
			})
			runs[r.f]++
			if withLight && i%10 == 0 {
				lightRun() // beside the flood's run, in the reserved slot
			}
			clk.Advance(time.Millisecond)
			r.t.Done()
		}
		return runs
	}
	r0 := step(500, true)
	t.Logf("phase 1: %v; running %d, f1 waiting %d", r0, s.running_(), f1.Waiting())
	d.start(f2, 2)
	waitFor(t, "f2 queued", func() bool { return f2.Waiting() >= 1 })
	r := step(3000, true)
	t.Logf("f1 and f2 at equal shares, the light function calling beside them: f1 %d, f2 %d of 3000", r[f1], r[f2])
	if r[f2] < 150 {
		t.Errorf("f2 got %d of 3000 runs at f1's share", r[f2])
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
