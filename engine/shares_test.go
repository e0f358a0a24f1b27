package engine_test

import (
	"context"
	"math"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/fileutil"
	"github.com/plover-run/plover/internal/testkit"
)

// Two backlogged functions with shares 3:1 split the device's time 3:1
// through the engine (runs that sleep, so that the CPU is not what divides
// them: make bench-fair measures the CPU-bound case).
func TestSharesSplitDeviceTime(t *testing.T) {
	e := testkit.Engine(t, engine.Config{Sched: engine.SchedConfig{MaxRuns: 2}})
	for _, n := range []struct {
		name  string
		share float64
	}{{"a", 3}, {"b", 1}} {
		m := testkit.Slow(n.name, 5)
		m.MaxInstances, m.Share = 4, n.share
		testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	var wg sync.WaitGroup
	for _, fn := range []string{"a", "a", "a", "a", "a", "a", "a", "a", "b", "b", "b", "b", "b", "b", "b", "b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				e.Invoke(context.Background(), fn, &call.Request{Input: []byte{1}})
			}
		}()
	}
	wg.Wait()
	a, b := info(t, e, "a"), info(t, e, "b")
	part := a.DeviceSeconds / (a.DeviceSeconds + b.DeviceSeconds)
	if part < 0.68 || part > 0.82 {
		t.Fatalf("a (share 3) had %.3f of the device time (a %.3fs in %d requests, b %.3fs in %d), want 0.75", part, a.DeviceSeconds, a.Requests, b.DeviceSeconds, b.Requests)
	}
}

// Compute-bound floods with shares 3:1 on a device whose runs outnumber
// its CPUs: each is charged and billed the CPU time its chains used, so
// the billed device time splits like the work done. Charged by the time
// they held their slots, which includes waiting for a CPU, they were
// billed 62-67 / 33-38 for work done 75 / 25.
func TestBilledDeviceTimeFollowsTheWorkDone(t *testing.T) {
	if testing.Short() {
		t.Skip("a 2 s compute flood")
	}
	dir := t.TempDir()
	testkit.BuildLib(t, filepath.Join(testkit.Root(), "samples", "spin", "spin.cu"), dir, "spin.so", "-DSPIN_ROUNDS=3000")
	e := testkit.Engine(t, engine.Config{Sched: engine.SchedConfig{MaxRuns: 2 * runtime.NumCPU(), NoReserve: true}})
	for _, n := range []struct {
		name  string
		share float64
	}{{"heavy", 3}, {"light", 1}} {
		m := &abi.Manifest{Name: n.name, ABI: abi.Major, Target: abi.TargetHost, Library: "spin.so", MaxInputBytes: 1024, OutBytes: 1024,
			Chain: []abi.Launch{{Kernel: "spin", Grid: 1, Block: 256}}, Share: n.share, MaxInstances: 8}
		d := t.TempDir()
		fileutil.Copy(filepath.Join(dir, "spin.so"), filepath.Join(d, "spin.so"))
		testkit.WriteManifest(t, d, m)
		testkit.Deploy(t, e, d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	in := make([]byte, 1024)
	for _, fn := range []string{"heavy", "heavy", "heavy", "heavy", "light", "light", "light", "light"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				e.Invoke(context.Background(), fn, &call.Request{Input: in})
			}
		}()
	}
	wg.Wait()
	h, l := info(t, e, "heavy"), info(t, e, "light")
	work := float64(h.Requests) / float64(h.Requests+l.Requests)
	billed := h.DeviceSeconds / (h.DeviceSeconds + l.DeviceSeconds)
	if math.Abs(billed-work) > 0.05 || math.Abs(work-0.75) > 0.05 {
		t.Fatalf("heavy (share 3) did %.3f of the work (%d of %d requests) and was billed %.3f of the device time (%.3fs of %.3fs); want both 0.75 +- 0.05",
			work, h.Requests, h.Requests+l.Requests, billed, h.DeviceSeconds, h.DeviceSeconds+l.DeviceSeconds)
	}
}
