package engine_test

import (
	"context"
	"testing"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
)

// Every run goes through the device's scheduler: with one run on the
// device at a time, a latency function's request waits for the run in
// progress only, not for the runs queued before it; the wait shows in its
// timing, and device time is accounted per function.
func TestRunsGoThroughTheDeviceScheduler(t *testing.T) {
	e := testkit.Engine(t, engine.Config{Sched: engine.SchedConfig{MaxRuns: 1, NoReserve: true}})
	slow := testkit.Slow("slow", 150)
	slow.MaxInstances = 4
	slow.Priority = "batch"
	testkit.Deploy(t, e, testkit.BundleDir(t, slow, nil))
	fast := testkit.Manifest("fast")
	fast.Priority = "latency"
	fast.Share = 2
	testkit.Deploy(t, e, testkit.BundleDir(t, fast, nil))
	invoke(t, e, "fast", []byte{1}) // loaded: its later request is hot

	done := make(chan string, 4)
	for i := 0; i < 3; i++ {
		go func() {
			if err := e.Invoke(context.Background(), "slow", &call.Request{Input: []byte{1}}); err != nil {
				t.Errorf("slow: %v", err)
			}
			done <- "slow"
		}()
	}
	// One slow run on the device, two waiting for it.
	testkit.WaitFor(t, e, "slow", "one slow run and two queued", testkit.Busy(3, 2))
	req := &call.Request{Input: []byte{2}}
	if err := e.Invoke(context.Background(), "fast", req); err != nil {
		t.Fatal(err)
	}
	done <- "fast"
	order := ""
	for i := 0; i < 4; i++ {
		order += (<-done)[:1]
	}
	if order[:2] != "sf" && order[:1] != "f" {
		t.Fatalf("completion order %q: the latency request waited for the queued batch runs", order)
	}
	if req.Timing.Sched <= 0 {
		t.Fatalf("the latency request's sched wait is %v, want the rest of the running slow run", req.Timing.Sched)
	}
	fi := info(t, e, "slow")
	if fi.DeviceSeconds < 0.45 || fi.Priority != "batch" || fi.Share != 1 {
		t.Fatalf("slow: device %.3fs (want >= 3 x 150 ms), priority %q, share %v", fi.DeviceSeconds, fi.Priority, fi.Share)
	}
	if ff := info(t, e, "fast"); ff.Share != 2 || ff.Priority != "latency" || ff.DeviceFraction <= 0 || ff.DeviceFraction >= fi.DeviceFraction {
		t.Fatalf("fast: share %v, priority %q, fraction %.3f (slow's %.3f)", ff.Share, ff.Priority, ff.DeviceFraction, fi.DeviceFraction)
	}
}
