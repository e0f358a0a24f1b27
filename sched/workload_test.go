package sched

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// workloadCheck, when set, is called under no lock after every step of
// a workload, with the Scheduler and the clock's time: an error fails it.
var workloadCheck func(s *Scheduler, now time.Time) error

// workload drives a Scheduler on a fake clock, one goroutine, through a
// seeded random mix of what its callers do: runs of a few floods and many
// light functions arriving (some with deadlines, some held turns), ending,
// giving up; light functions touching; functions forgotten; Alone asked;
// time passing by steps around Overlap and Recent. It returns the trace of
// what the Scheduler decided, one line a decision: two builds that trace
// alike admit alike.
func workload(seed uint64, cfg Config, steps int, check func(*Scheduler, time.Time) error) ([]string, error) {
	clk := newFakeClock()
	cfg.Clock = clk
	s := New(cfg)
	rng := rand.New(rand.NewPCG(seed, 1))
	type pending struct {
		id int
		f  *Flow
		w  *waiter
	}
	type held struct {
		id int
		t  Ticket
	}
	var (
		queued []pending
		runs   []held
		trace  []string
		next   int
	)
	name := func() string {
		if rng.IntN(3) == 0 {
			return fmt.Sprint("flood-", rng.IntN(3))
		}
		return fmt.Sprint("light-", rng.IntN(40))
	}
	settle := func() {
		kept := queued[:0]
		for _, q := range queued {
			select {
			case <-q.w.ready:
				if q.w.err != nil {
					trace = append(trace, fmt.Sprintf("%d refused: %v", q.id, q.w.err))
				} else {
					trace = append(trace, fmt.Sprintf("%d started", q.id))
					runs = append(runs, held{q.id, q.w.t})
				}
			default:
				kept = append(kept, q)
			}
		}
		queued = kept
	}
	for step := range steps {
		now := clk.Now()
		switch k := rng.IntN(100); {
		case k < 34: // a run arrives
			n := name()
			f := s.Flow(n)
			var deadline time.Time
			if rng.IntN(4) == 0 {
				deadline = now.Add(time.Duration(1+rng.IntN(400)) * time.Millisecond)
			}
			var hold time.Duration
			if rng.IntN(6) == 0 {
				hold = time.Duration(1+rng.IntN(40)) * time.Millisecond
			}
			next++
			if t, w := s.enter(f, now, deadline, hold); w == nil {
				trace = append(trace, fmt.Sprintf("%d %s at once", next, n))
				runs = append(runs, held{next, t})
			} else {
				trace = append(trace, fmt.Sprintf("%d %s queued", next, n))
				queued = append(queued, pending{next, f, w})
			}
		case k < 64: // a run ends
			if len(runs) > 0 {
				i := rng.IntN(len(runs))
				r := runs[i]
				runs = append(runs[:i], runs[i+1:]...)
				r.t.DoneAt(now)
				trace = append(trace, fmt.Sprintf("%d done", r.id))
			}
		case k < 69: // a queued run gives up
			if len(queued) > 0 {
				i := rng.IntN(len(queued))
				if q := queued[i]; s.leave(q.f, q.w) {
					queued = append(queued[:i], queued[i+1:]...)
					trace = append(trace, fmt.Sprintf("%d gave up", q.id))
				}
			}
		case k < 76:
			n := name()
			s.Flow(n).Touch()
			trace = append(trace, n+" touched")
		case k < 78:
			n := name()
			s.Forget(n)
			trace = append(trace, n+" forgotten")
		case k < 84:
			n := name()
			trace = append(trace, fmt.Sprintf("%s alone %v", n, s.Flow(n).Alone()))
		default: // time passes: mostly within Overlap, now and then past Recent
			d := time.Duration(rng.IntN(30)) * time.Millisecond
			if rng.IntN(8) == 0 {
				d = time.Duration(rng.IntN(1500)) * time.Millisecond
			}
			clk.Advance(d)
			trace = append(trace, fmt.Sprintf("+%v", d))
		}
		settle()
		if check != nil {
			if err := check(s, clk.Now()); err != nil {
				return trace, fmt.Errorf("step %d (%s): %w", step, trace[len(trace)-1], err)
			}
		}
	}
	return trace, nil
}

// workloadConfigs are the device shapes the workloads run on: with and
// without a reserve, FloodRuns, SharedRuns.
var workloadConfigs = []Config{
	{MaxRuns: 4, Reserve: 1},
	{MaxRuns: 4, Reserve: 1, SharedRuns: 2},
	{MaxRuns: 8, Reserve: 2, FloodRuns: 4, SharedRuns: 3},
	{MaxRuns: 2},
	{MaxRuns: 1},
	{MaxRuns: 4, SharedRuns: 2}, // --sched fair-no-reserve on a host device
}

// TestWorkloadTraces runs the workloads (with workloadCheck after every
// step where it is set) and, where SCHED_TRACE_DIR names a directory,
// writes their traces there, to compare two builds' decisions.
func TestWorkloadTraces(t *testing.T) {
	dir := os.Getenv("SCHED_TRACE_DIR")
	for ci, cfg := range workloadConfigs {
		for seed := range uint64(20) {
			trace, err := workload(seed, cfg, 3000, workloadCheck)
			if err != nil {
				t.Fatalf("config %d %+v, seed %d: %v", ci, cfg, seed, err)
			}
			if dir != "" {
				file := filepath.Join(dir, fmt.Sprintf("c%d-s%d.txt", ci, seed))
				if err := os.WriteFile(file, []byte(strings.Join(trace, "\n")+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

// No flow waits while the device has a slot its limits let it take, after
// any step of the workloads: the moments at which the state changes by time
// alone (a deadline, a reserve's lapse, a run turning light) each have a
// timer. Before, a run turning light raised the floods' SharedRuns bound
// with no timer where there was no reserve (--sched fair-no-reserve), and a
// flood's run queued under the old bound waited for the next run's end.
func TestWorkConservedAfterEveryStep(t *testing.T) {
	conserved := func(s *Scheduler, now time.Time) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if len(s.running) >= s.cfg.MaxRuns {
			return nil
		}
		fl := s.floodLimit(now)
		for _, f := range s.waiting {
			if lim := s.limitOf(f, now, fl); len(s.running) < lim {
				return fmt.Errorf("a flow waits with %d runs on the device, its limit %d", len(s.running), lim)
			}
		}
		return nil
	}
	for ci, cfg := range workloadConfigs {
		for seed := range uint64(20) {
			if _, err := workload(seed, cfg, 3000, conserved); err != nil {
				t.Errorf("config %d %+v, seed %d: %v", ci, cfg, seed, err)
				break
			}
		}
	}
}
