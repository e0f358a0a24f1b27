package engine_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/ioshare"
)

// --flood-runs reaches the device's scheduler: while a light function
// sends one request at a time, a flood of three slow requests has one run
// on the device and two queued with FloodRuns 1, where without it the
// flood has all but the reserve (two of four) and one queued.
func TestFloodRunsBoundAFloodBesideALightFunction(t *testing.T) {
	for _, tt := range []struct {
		floodRuns, running int
	}{{1, 1}, {0, 2}} {
		e := testkit.Engine(t, engine.Config{Sched: engine.SchedConfig{MaxRuns: 4, FloodRuns: tt.floodRuns}})
		slow := testkit.Slow("slow", 300)
		slow.MaxInstances = 4
		testkit.Deploy(t, e, testkit.BundleDir(t, slow, nil))
		testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("light"), nil))
		invoke(t, e, "slow", []byte{1}) // loaded: its runs below are the flood's
		invoke(t, e, "light", []byte{1})

		ctx, stop := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		t.Cleanup(func() { stop(); wg.Wait() }) // before the engine's: also when WaitFor fails
		wg.Add(1)
		go func() { // the light function, one request at a time throughout
			defer wg.Done()
			for ctx.Err() == nil {
				if err := e.Invoke(context.Background(), "light", &call.Request{Input: []byte{2}}); err != nil {
					t.Errorf("light: %v", err)
					return
				}
			}
		}()
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := e.Invoke(context.Background(), "slow", &call.Request{Input: []byte{1}}); err != nil {
					t.Errorf("slow: %v", err)
				}
			}()
		}
		testkit.WaitFor(t, e, "slow", "the flood's runs on the device and queued", testkit.Busy(3, 3-tt.running))
		stop()
	}
}

// ReserveHold reaches the device's scheduler and the server's I/O: after a
// light function's one request, a flood of four slow requests has all but
// the reserve (two of four) on the device while the hold lasts, and all
// four with a hold that has passed before the flood comes.
func TestReserveHoldKeepsSlotsAfterALightRequest(t *testing.T) {
	for _, tt := range []struct {
		hold    time.Duration
		running int
	}{{time.Hour, 2}, {time.Nanosecond, 4}} {
		e := testkit.Engine(t, engine.Config{Sched: engine.SchedConfig{MaxRuns: 4, ReserveHold: tt.hold}})
		slow := testkit.Slow("slow", 300)
		slow.MaxInstances = 4
		testkit.Deploy(t, e, testkit.BundleDir(t, slow, nil))
		testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("light"), nil))
		invoke(t, e, "slow", []byte{1})
		invoke(t, e, "light", []byte{1}) // its one request: then quiet

		var wg sync.WaitGroup
		t.Cleanup(wg.Wait)
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := e.Invoke(context.Background(), "slow", &call.Request{Input: []byte{1}}); err != nil {
					t.Errorf("slow: %v", err)
				}
			}()
		}
		testkit.WaitFor(t, e, "slow", fmt.Sprintf("hold %v: the flood's runs on the device and queued", tt.hold), testkit.Busy(4, 4-tt.running))
		wg.Wait()

		// The server's I/O holds the same: a turn beside a light
		// function's request moves one piece (ioshare's default 256 KiB)
		// while the hold lasts, more once it has passed.
		e.IO("light").Touch(time.Now())
		tn, err := e.IO("slow").Turn(context.Background(), time.Time{}, nil, false)
		if err != nil {
			t.Fatal(err)
		}
		if shared, want := tn.Piece() == 256<<10, tt.running == 2; shared != want {
			t.Errorf("hold %v: a turn beside the light function's request moves %d bytes", tt.hold, tn.Piece())
		}
		tn.Done()
	}
}

// --sched fair-no-reserve keeps no slot in the server's I/O either: a
// flood's pieces beside a light function's request take every slot there.
func TestNoReserveReachesTheServersIO(t *testing.T) {
	for _, noReserve := range []bool{false, true} {
		e := testkit.Engine(t, engine.Config{Sched: engine.SchedConfig{NoReserve: noReserve, ReserveHold: time.Hour,
			IO: ioshare.Config{Slots: 2, Hold: time.Hour}}})
		for _, name := range []string{"flood", "light"} {
			testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest(name), nil))
		}
		e.IO("light").Touch(time.Now())
		first, err := e.IO("flood").Turn(context.Background(), time.Time{}, nil, false)
		if err != nil {
			t.Fatal(err)
		}
		// Kept, the last slot stays free however long the second
		// waits: its deadline ends the wait.
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		second, err := e.IO("flood").Turn(ctx, time.Time{}, nil, false)
		cancel()
		if took := err == nil; took != noReserve {
			t.Errorf("NoReserve %v: the flood's second piece beside a light function took the last slot %v (%v)", noReserve, took, err)
		}
		second.Done()
		first.Done()
	}
}

// SharedRuns reaches the device's scheduler, and the host device's default
// is its CPUs and one: two functions of four slow requests each have that
// many runs on the device together, the rest queued, where one alone has
// all four (TestReserveHoldKeepsSlotsAfterALightRequest).
func TestSharedRunsBoundTwoFloods(t *testing.T) {
	for _, tt := range []struct {
		shared, running int
	}{{2, 2}, {0, min(runtime.NumCPU()+1, 4)}} {
		// No hold: a function's first request leaves it light, and
		// about, for the hold; here both are floods from the start.
		e := testkit.Engine(t, engine.Config{Sched: engine.SchedConfig{MaxRuns: 4, SharedRuns: tt.shared, ReserveHold: time.Nanosecond}})
		for _, name := range []string{"a", "b"} {
			// Long enough for all 8 to take instances, three new ones
			// each, before the first runs end (1 s was not, once, under
			// the race detector on a loaded machine).
			m := testkit.Slow(name, 3000)
			m.MaxInstances = 4
			testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
			invoke(t, e, name, []byte{1}) // loaded: the runs below are floods'
		}
		var wg sync.WaitGroup
		t.Cleanup(wg.Wait) // before the engine's Close
		for range 4 {
			for _, name := range []string{"a", "b"} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := e.Invoke(context.Background(), name, &call.Request{Input: []byte{1}}); err != nil {
						t.Errorf("%s: %v", name, err)
					}
				}()
			}
		}
		running := func() (int, bool) {
			n, all := 0, true
			for _, name := range []string{"a", "b"} {
				fi, err := e.Control().Function(context.Background(), name)
				if err != nil {
					t.Fatal(err)
				}
				n += fi.Busy - fi.Queue
				all = all && fi.Busy == 4
			}
			return n, all
		}
		deadline := time.Now().Add(10 * time.Second)
		most := 0 // with all 8 in: the last poll's count said nothing of what was seen
		for {
			n, all := running()
			if all && n == tt.running {
				break
			}
			if all {
				most = max(most, n)
			}
			if time.Now().After(deadline) {
				t.Fatalf("SharedRuns %d: at most %d runs on the device with all 8 requests in (last poll: %d, all in %v), want %d", tt.shared, most, n, all, tt.running)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
}
