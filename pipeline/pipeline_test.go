package pipeline_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/pipeline"
)

func pipelineDir(t *testing.T, name string, steps ...any) string {
	t.Helper()
	return testkit.PipelineDir(t, name, steps...)
}

// deployChain deploys function name on e, its manifest running chain.
func deployChain(t *testing.T, e *engine.Engine, name string, chain ...abi.Launch) {
	t.Helper()
	m := testkit.Manifest(name)
	m.Chain = chain
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
}

// A client that leaves while a step runs stops the pipeline before its
// next step: the next function never sees the request.
func TestGoneStopsAtTheNextStep(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Slow("slow", 300), nil))
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	testkit.Deploy(t, e, pipelineDir(t, "p", "slow", "echo"))
	r := pipeline.New(e, nil)
	var left atomic.Bool
	done := make(chan error, 1)
	go func() {
		req := &call.Request{Input: []byte("x"), Gone: left.Load}
		done <- r.Invoke(context.Background(), "p", req)
	}()
	testkit.WaitFor(t, e, "slow", "its run to start", testkit.Busy(1, 0))
	left.Store(true)
	err := <-done
	if errdefs.KindOf(err) != errdefs.KindGone || !strings.Contains(err.Error(), "before step 1 (echo)") {
		t.Fatalf("err = %v", err)
	}
	fi, _ := e.Control().Function(context.Background(), "echo")
	if fi.Requests != 0 {
		t.Fatalf("echo ran %d requests after the client left", fi.Requests)
	}
}

// A pipeline's request reports each step and sums their phases; it takes
// no chain override; its tensors are its first step's inputs and last
// step's outputs.
func TestStepsTimingOverrideTensors(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	in := testkit.Manifest("typed-in")
	in.Tensors = &abi.Tensors{Inputs: []abi.Tensor{{Name: "x", Datatype: "UINT8", Shape: []int64{-1}}}, Outputs: abi.RawTensors.Outputs}
	out := testkit.Manifest("typed-out")
	out.Tensors = &abi.Tensors{Inputs: abi.RawTensors.Inputs, Outputs: []abi.Tensor{{Name: "y", Datatype: "FP32", Shape: []int64{64}}}}
	testkit.Deploy(t, e, testkit.BundleDir(t, in, nil))
	testkit.Deploy(t, e, testkit.BundleDir(t, out, nil))
	testkit.Deploy(t, e, pipelineDir(t, "p", "typed-in", map[string]any{"parallel": []string{"typed-in", "typed-out"}}, "typed-out"))
	r := pipeline.New(e, nil)
	req := &call.Request{Input: []byte{7, 8, 9}}
	if err := r.Invoke(context.Background(), "p", req); err != nil {
		t.Fatal(err)
	}
	if len(req.Output) != 256 || req.Output[0] != 7 || req.Output[2] != 9 {
		t.Fatalf("output %v", req.Output[:4])
	}
	var names []string
	var sum int64
	for _, s := range req.Steps {
		names = append(names, s.Step)
		sum += int64(s.Timing.Kernels)
	}
	if got := strings.Join(names, ","); got != "typed-in,typed-in,typed-out,typed-out" || req.Steps[1].Index != 1 || req.Steps[2].Index != 1 || req.Steps[3].Index != 2 {
		t.Fatalf("steps %s (%+v)", got, req.Steps)
	}
	if int64(req.Timing.Kernels) != sum || req.Timing.Total < req.Timing.Kernels {
		t.Fatalf("timing %+v, steps' kernels %d", req.Timing, sum)
	}
	req.Override = &call.Override{OutBytes: 8, TmpBytes: -1}
	if err := r.Invoke(context.Background(), "p", req); errdefs.KindOf(err) != errdefs.KindBadRequest {
		t.Fatalf("override on a pipeline: %v", err)
	}
	p, err := r.Pin(context.Background(), "p", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	ts := p.Version().Tensors
	if ts == nil || ts.Inputs[0].Name != "x" || ts.Outputs[0].Name != "y" || !p.Pipeline() {
		t.Fatalf("tensors %+v", ts)
	}
	var v api.Version = p.Version()
	if !v.IsPipeline() {
		t.Fatalf("version %+v", v)
	}
}

// A step that refuses its input fails its pipeline's request as the
// client's (422, a client error of the pipeline's in plover ls, and the
// step's error counted under code 422); a step whose kernel fails is the
// server's (500). Neither pipeline has a mean: none of its requests
// succeeded.
func TestStepErrorsByClass(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	picky := testkit.Manifest("picky")
	picky.Chain = []abi.Launch{{Kernel: "refuse", Grid: 1, Block: 1}}
	testkit.Deploy(t, e, testkit.BundleDir(t, picky, nil))
	failing := testkit.Manifest("failing")
	failing.Chain = []abi.Launch{{Kernel: "fail", Grid: 1, Block: 1}}
	testkit.Deploy(t, e, testkit.BundleDir(t, failing, nil))
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	testkit.Deploy(t, e, pipelineDir(t, "p", "picky", "echo"))
	testkit.Deploy(t, e, pipelineDir(t, "q", "echo", "failing"))
	reg := prometheus.NewRegistry()
	r := pipeline.New(e, reg)
	if err := r.Invoke(context.Background(), "p", &call.Request{}); errdefs.KindOf(err) != errdefs.KindRejected {
		t.Fatalf("p: %v, want the step's refusal", err)
	}
	if err := r.Invoke(context.Background(), "q", &call.Request{Input: []byte("x")}); errdefs.KindOf(err) != errdefs.KindKernel {
		t.Fatalf("q: %v, want the step's kernel failure", err)
	}
	want := `# HELP plover_pipeline_step_errors_total Pipeline steps that failed, by pipeline, step index, function and the HTTP status of the failure's class (4xx: the input's fault; 5xx: the function's or the server's).
# TYPE plover_pipeline_step_errors_total counter
plover_pipeline_step_errors_total{code="422",function="picky",pipeline="p",step="0"} 1
plover_pipeline_step_errors_total{code="500",function="failing",pipeline="q",step="1"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "plover_pipeline_step_errors_total"); err != nil {
		t.Error(err)
	}
	for _, tc := range []struct {
		name                 string
		clientErrors, errors int64
	}{{"p", 1, 0}, {"q", 0, 1}, {"picky", 1, 0}, {"failing", 0, 1}} {
		fi, err := e.Control().Function(context.Background(), tc.name)
		if err != nil || fi.Requests != 1 || fi.ClientErrors != tc.clientErrors || fi.Errors != tc.errors || fi.MeanUs != 0 {
			t.Errorf("%s: %d requests, %d client errors, %d errors, mean %d µs (%v); want 1, %d, %d, 0",
				tc.name, fi.Requests, fi.ClientErrors, fi.Errors, fi.MeanUs, err, tc.clientErrors, tc.errors)
		}
	}
}

// A request that did not come through the door (no deadline) still has
// one deadline for all its steps, the engine's timeout from its start: the
// third of three 200 ms steps starts past a 300 ms timeout and is not run.
func TestOneDefaultDeadlineForAllSteps(t *testing.T) {
	e := testkit.Engine(t, engine.Config{Timeout: 300 * time.Millisecond})
	for _, n := range []string{"s1", "s2", "s3"} {
		testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Slow(n, 200), nil))
	}
	testkit.Deploy(t, e, pipelineDir(t, "p", "s1", "s2", "s3"))
	err := pipeline.New(e, nil).Invoke(context.Background(), "p", &call.Request{Input: []byte("x")})
	if errdefs.KindOf(err) != errdefs.KindTimeout {
		t.Fatalf("three 200 ms steps under a 300 ms timeout: err = %v, want a timeout", err)
	}
	if fi, _ := e.Control().Function(context.Background(), "s3"); fi.Requests != 0 {
		t.Fatalf("the third step ran %d requests past the pipeline's deadline", fi.Requests)
	}
}

// A pipeline's request counts the payload bytes its steps copied on the
// host, and a parallel step's concatenation of its branches' outputs: it
// counted none (plover_payload_copied_bytes_total under the pipeline's
// name), though its steps copy as a function's request does.
func TestAPipelineCountsItsStepsCopies(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	testkit.Deploy(t, e, pipelineDir(t, "seq", "echo", "echo"))
	testkit.Deploy(t, e, pipelineDir(t, "par", map[string]any{"parallel": []string{"echo", "echo"}}))
	r := pipeline.New(e, nil)
	in := []byte("copied bytes")
	invoke := func(name string, in []byte) *call.Request {
		t.Helper()
		req := &call.Request{Input: in}
		if err := r.Invoke(context.Background(), name, req); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return req
	}
	one := invoke("echo", in)
	if one.Copied <= 0 {
		t.Fatalf("echo alone copied %d bytes on the host; the test needs a function that copies", one.Copied)
	}
	then := invoke("echo", one.Output) // seq's second step: on the first's output
	for _, tc := range []struct {
		name string
		want int64
	}{
		{"seq", one.Copied + then.Copied},
		{"par", 2*one.Copied + 2*int64(len(one.Output))},
	} {
		if got := invoke(tc.name, in).Copied; got != tc.want {
			t.Errorf("pipeline %s counted %d bytes copied, want %d", tc.name, got, tc.want)
		}
	}
}
