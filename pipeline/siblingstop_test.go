package pipeline_test

import (
	"context"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/pipeline"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A sibling whose branch stops for another branch's failure is not a
// failure of its own healthy function: the step it waits for runs (its
// wait was cancelled once, and counted as the function's 5xx and a 503
// step error), and it takes no further step.
func TestSiblingStopIsNoErrorOfItsFunction(t *testing.T) {
	e, busy := siblingWaitsBehind(t, 400)
	reg := prometheus.NewRegistry()
	err := pipeline.New(e, reg).Invoke(context.Background(), "p", &call.Request{Input: []byte("x")})
	if errdefs.KindOf(err) != errdefs.KindKernel {
		t.Fatalf("err = %v", err)
	}
	if err := <-busy; err != nil {
		t.Fatal(err)
	}
	fi, _ := e.Control().Function(context.Background(), "slow")
	n, _ := testutil.GatherAndCount(reg, "plover_pipeline_step_errors_total")
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			t.Logf("%s %v %v", mf.GetName(), m.GetLabel(), m.GetCounter().GetValue())
		}
	}
	t.Logf("slow: requests %d, errors %d, client errors %d; step error series %d", fi.Requests, fi.Errors, fi.ClientErrors, n)
	if fi.Errors != 0 || n != 1 {
		t.Errorf("slow (healthy, only stopped for its sibling's failure) counts %d server errors; %d step error series, want 1 (failing's)", fi.Errors, n)
	}
}

// A branch whose step waits in its function's queue when a sibling fails
// gives the wait up: the pipeline answers the failure at once, not after
// the queued step got an instance and ran (here, after the request ahead
// of it, 3 s). The step given up is its function's client error (its
// caller went), no server error.
func TestAQueuedSiblingGivesUpAtAFailure(t *testing.T) {
	e, busy := siblingWaitsBehind(t, 3000)
	err := pipeline.New(e, prometheus.NewRegistry()).Invoke(context.Background(), "p", &call.Request{Input: []byte("x")})
	var ahead error
	select {
	case ahead = <-busy:
		t.Errorf("the pipeline answered (%v) only after the request ahead of its queued step ended", err)
	default:
		ahead = <-busy
	}
	if errdefs.KindOf(err) != errdefs.KindKernel {
		t.Errorf("err = %v, want failing's failure", err)
	}
	if ahead != nil {
		t.Fatal(ahead)
	}
	fi, _ := e.Control().Function(context.Background(), "slow")
	if fi.Errors != 0 {
		t.Errorf("slow counts %d server errors, want 0", fi.Errors)
	}
}

// siblingWaitsBehind is an engine with pipeline p running slow (one
// instance, ms a run) and failing in parallel, slow's instance held by a
// request whose result busy gives: p's slow branch waits in its queue.
func siblingWaitsBehind(t *testing.T, ms int) (*engine.Engine, chan error) {
	e := testkit.Engine(t, engine.Config{Timeout: 30 * time.Second})
	failing := testkit.Manifest("failing")
	failing.Chain = []abi.Launch{{Kernel: "fail", Grid: 1, Block: 1}}
	testkit.Deploy(t, e, testkit.BundleDir(t, failing, nil))
	slow := testkit.Slow("slow", ms)
	slow.MaxInstances = 1
	testkit.Deploy(t, e, testkit.BundleDir(t, slow, nil))
	testkit.Deploy(t, e, pipelineDir(t, "p", map[string]any{"parallel": []string{"slow", "failing"}}))
	busy := make(chan error, 1)
	go func() { busy <- e.Invoke(context.Background(), "slow", &call.Request{Input: []byte("x")}) }()
	testkit.WaitFor(t, e, "slow", "its instance busy", func(fi api.FunctionInfo) bool { return fi.Busy == 1 })
	return e, busy
}
