package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
)

// An instance's run is reused request after request: a request the
// device's scheduler refuses (its deadline passed while a batch-class run
// held the device) ran nothing, and carries none of the instance's last
// run's parts or copied bytes into its timing, metrics or trace.
func TestARefusedRunCarriesNoEarlierTiming(t *testing.T) {
	e := testkit.Engine(t, engine.Config{Sched: engine.SchedConfig{MaxRuns: 1, NoReserve: true}})
	slow := testkit.Slow("slow", 300)
	slow.Priority = "batch"
	testkit.Deploy(t, e, testkit.BundleDir(t, slow, nil))
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("fast"), nil))
	first := &call.Request{Input: []byte{1}}
	if err := e.Invoke(context.Background(), "fast", first); err != nil {
		t.Fatal(err)
	}
	if first.Timing.Kernels <= 0 || first.Copied <= 0 {
		t.Fatalf("the first run: kernels %v, copied %d; want both above 0 (else this test shows nothing)", first.Timing.Kernels, first.Copied)
	}
	go e.Invoke(context.Background(), "slow", &call.Request{Input: []byte{1}})
	testkit.WaitFor(t, e, "slow", "one slow run", testkit.Busy(1, 0))
	req := &call.Request{Input: []byte{2}, Deadline: time.Now().Add(80 * time.Millisecond)}
	if err := e.Invoke(context.Background(), "fast", req); err == nil {
		t.Fatal("the second request ran beside a 300 ms run on a device of one run at a time, within 80 ms")
	}
	if tm := req.Timing; tm.CopyIn != 0 || tm.Kernels != 0 || tm.CopyOut != 0 || tm.Handoff != 0 || tm.Handback != 0 || req.Copied != 0 {
		t.Errorf("a refused request carries copy in %v, kernels %v, copy out %v, handoff %v, handback %v, copied %d: want none",
			tm.CopyIn, tm.Kernels, tm.CopyOut, tm.Handoff, tm.Handback, req.Copied)
	}
}
