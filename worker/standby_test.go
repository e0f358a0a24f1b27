package worker

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/internal/testkit"
)

// The pool is sized by the busiest second of the last minute, between its
// floor and its ceiling.
func TestStandbyDemand(t *testing.T) {
	// At a second of the monotonic clock the pool goes by (monoOf).
	t0 := monoBase.Add(time.Duration(monoNow()/int64(time.Second)+1) * time.Second)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	for _, tc := range []struct {
		name  string
		takes []float64 // seconds after t0
		now   float64
		want  int
	}{
		{"none: the floor", nil, 0, 2},
		{"one a second: the floor", []float64{0, 1, 2, 3}, 3.5, 2},
		{"a burst of five", []float64{1, 1.1, 1.2, 1.3, 1.4}, 2, 5},
		{"a burst past the ceiling", []float64{1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, 2, 8},
		{"the busiest second counts", []float64{1, 1, 1, 1, 4, 5}, 6, 4},
		{"a minute later: the floor again", []float64{1, 1.1, 1.2, 1.3, 1.4}, 61, 2},
		{"59 seconds later: still the burst", []float64{1, 1.1, 1.2, 1.3, 1.4}, 60.9, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &standbyDemand{min: 2, max: 8}
			for _, s := range tc.takes {
				d.took(at(s))
			}
			if got := d.target(at(tc.now)); got != tc.want {
				t.Fatalf("target %d, want %d", got, tc.want)
			}
		})
	}
}

// The pool grows to a burst's size with real worker processes, each
// contained and ready (a worker taken from it serves a request), and
// shrinks to its floor once the burst is out of the window.
func TestStandbyPoolFollowsDemand(t *testing.T) {
	d := NewDevice(Options{Exe: os.Args[0], Base: device.NewHost(0), Standby: 1, MaxStandby: 4, Landlock: true,
		StageDir: t.TempDir(), Spawner: spawner})
	defer d.Close()
	ready := func(n int) func() bool { return func() bool { return len(d.standby) == n } }
	waitFor(t, "one standby worker", ready(1))
	m := testkit.Manifest("echo")
	var taken []*proc
	for range 4 {
		p, err := d.take(context.Background(), m)
		if err != nil {
			t.Fatal(err)
		}
		taken = append(taken, p)
	}
	// Every take was recorded. Four takes may straddle a second's
	// boundary on a loaded machine (two seconds of two): the burst is put
	// in one second, as four takes within it are counted, and the pool
	// told to look again, so that what follows does not hang on the clock.
	d.demand.mu.Lock()
	total := 0
	for _, n := range d.demand.n {
		total += n
	}
	now := time.Now().Unix()
	d.demand.sec, d.demand.n = [standbyWindow]int64{}, [standbyWindow]int{}
	d.demand.sec[now%standbyWindow], d.demand.n[now%standbyWindow] = now, total
	d.demand.mu.Unlock()
	if total != 4 {
		t.Fatalf("%d takes recorded, want 4", total)
	}
	d.refillPool()
	waitFor(t, "four standby workers after four takes in a second", ready(4))
	for _, p := range taken {
		p.kill("test")
	}
	// The burst, moved out of the window; the pool is told to look again.
	d.demand.mu.Lock()
	d.demand.sec = [standbyWindow]int64{}
	d.demand.mu.Unlock()
	d.refillPool()
	waitFor(t, "back to one standby worker", ready(1))
	// What remains serves: a load takes it and runs a chain.
	p := load(t, d, m)
	in := newInst(t, p, m)
	r := &device.Run{Input: []byte("hello"), Output: make([]byte, m.OutBytes), TmpLen: m.TmpBytes,
		Chain: []device.Step{{Entry: 0, Grid: 1, Block: 64}}, Deadline: time.Now().Add(5 * time.Second)}
	if err := in.Run(r); err != nil {
		t.Fatalf("a standby worker's run: %v", err)
	}
}

// waitFor polls cond until it holds, failing the test after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// A standby worker that dies while it waits is replaced: the pool counts
// only workers a take can use. Before, the dead one kept its place until
// a take skipped it, and that take started a worker cold.
func TestStandbyPoolReplacesADeadWorker(t *testing.T) {
	d := NewDevice(Options{Exe: os.Args[0], Base: device.NewHost(0), Standby: 1, MaxStandby: 1, Landlock: true,
		StageDir: t.TempDir(), Spawner: spawner})
	defer d.Close()
	waitFor(t, "one standby worker", func() bool { return len(d.standby) == 1 })
	// Killed outside the pool and put back dead; a refill may fill the
	// pool meanwhile (its timer), and then the next one is tried.
	var p *proc
	for try := 0; p == nil; try++ {
		if try == 3 {
			t.Fatal("the pool refilled each time its worker was out: cannot put a dead one in")
		}
		q := <-d.standby
		if err := syscall.Kill(q.pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the standby worker's end seen", func() bool { return !q.alive() })
		select {
		case d.standby <- q:
			p = q
		default:
			waitFor(t, "the refilled worker", func() bool { return len(d.standby) == 1 })
		}
	}
	waitFor(t, "a live standby worker in the dead one's place", func() bool {
		q := peekStandby(d)
		return q != nil && q != p && q.alive()
	})
}
