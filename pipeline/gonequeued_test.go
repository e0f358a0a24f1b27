package pipeline_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/pipeline"
)

// A client that leaves while its request waits in a step's queue ends the
// pipeline's request (499, the pipeline's client error), as one that
// leaves between steps does; the step did not fail, so it is not counted
// in plover_pipeline_step_errors_total, whose 4xx are the input's fault
// (nor timed: it did not run).
func TestGoneWhileQueuedAtAStepIsNoStepError(t *testing.T) {
	reg := prometheus.NewRegistry()
	var left atomic.Bool
	e, busy, done := queuedAtStep(t, 300, reg, &call.Request{Input: []byte("x"), Gone: left.Load})
	left.Store(true)
	if err := <-done; errdefs.KindOf(err) != errdefs.KindGone {
		t.Fatalf("the pipeline's request: %v, want the client gone", err)
	}
	if err := <-busy; err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(reg, "plover_pipeline_step_errors_total"); err != nil || n != 0 {
		t.Errorf("%d step error series (%v), want none: the client left, no step failed", n, err)
	}
	fi, err := e.Control().Function(context.Background(), "p")
	if err != nil || fi.Requests != 1 || fi.ClientErrors != 1 || fi.Errors != 0 {
		t.Errorf("p: %d requests, %d client errors, %d errors (%v); want 1, 1, 0", fi.Requests, fi.ClientErrors, fi.Errors, err)
	}
}

// queuedAtStep deploys slow (one instance, whose run takes ms), echo and
// the pipeline p (echo, then slow), on an engine whose pipelines count
// their metrics in reg, and runs req on p once another client's request
// holds slow's instance: req queues at step 1 and stays queued. The
// other request's end and req's come on busy and done.
func queuedAtStep(t *testing.T, ms int, reg prometheus.Registerer, req *call.Request) (e *engine.Engine, busy, done <-chan error) {
	t.Helper()
	e = testkit.Engine(t, engine.Config{})
	slow := testkit.Slow("slow", ms)
	slow.MaxInstances = 1
	testkit.Deploy(t, e, testkit.BundleDir(t, slow, nil))
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	testkit.Deploy(t, e, pipelineDir(t, "p", "echo", "slow"))
	r := pipeline.New(e, reg)
	b, d := make(chan error, 1), make(chan error, 1)
	go func() { b <- r.Invoke(context.Background(), "slow", &call.Request{Input: []byte("b")}) }()
	testkit.WaitFor(t, e, "slow", "its run to start", testkit.Busy(1, 0))
	go func() { d <- r.Invoke(context.Background(), "p", req) }()
	testkit.WaitFor(t, e, "slow", "the pipeline's request queued", testkit.Busy(1, 1))
	return e, b, d
}
