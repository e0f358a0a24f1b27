package pipeline_test

// Pipelines against what can go wrong in their definitions and while they
// run: siblings of a failed branch, steps that do not fit each other,
// limits that deploy and run must agree on, outputs of a parallel last
// step, and deploys landing while a request's plan is made. Each test
// failed on the code before its fix.

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/apierr"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
	"github.com/plover-run/plover/oip"
	"github.com/plover-run/plover/pipeline"
)

// A parallel step whose branch fails fails the request, but its sibling
// branches are not stopped: a sibling that is a nested pipeline goes on to
// run its later steps for a request that has already failed (the walk
// checks only the client's departure and the deadline between steps, never
// a sibling's failure). tail must never see the request.
func TestParallelFailureStopsSiblings(t *testing.T) {
	e := testkit.Engine(t, engine.Config{Timeout: 30 * time.Second})
	failing := testkit.Manifest("failing")
	failing.Chain = []abi.Launch{{Kernel: "fail", Grid: 1, Block: 1}}
	testkit.Deploy(t, e, testkit.BundleDir(t, failing, nil))
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Slow("slow", 400), nil))
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("tail"), nil))
	testkit.Deploy(t, e, pipelineDir(t, "inner", "slow", "tail"))
	testkit.Deploy(t, e, pipelineDir(t, "p", map[string]any{"parallel": []string{"failing", "inner"}}))
	r := pipeline.New(e, nil)
	t0 := time.Now()
	err := r.Invoke(context.Background(), "p", &call.Request{Input: []byte("x")})
	took := time.Since(t0)
	if errdefs.KindOf(err) != errdefs.KindKernel || !strings.Contains(err.Error(), "failing") {
		t.Fatalf("err = %v, want the failing branch's kernel failure", err)
	}
	fi, _ := e.Control().Function(context.Background(), "tail")
	if fi.Requests != 0 {
		t.Errorf("after its sibling failed (the request already lost), the other branch still ran its next step: tail served %d requests; the failure was answered after %v", fi.Requests, took)
	}
}

// A parallel step answers its first failure in time, not the first branch's
// in the listed order: a branch that refuses the client's input at once
// (422, the client's to mend) is the answer though a sibling listed before
// it, whose step was already running, fails later (500). The caller was
// told the later 500, naming the other function (a review). Which failed
// first is read from the steps' timings, not assumed from the kernels.
func TestAParallelStepAnswersItsFirstFailure(t *testing.T) {
	e := testkit.Engine(t, engine.Config{Timeout: 30 * time.Second})
	deployChain(t, e, "slowfail", abi.Launch{Kernel: "sleep_ms", Grid: 500, Block: 1}, abi.Launch{Kernel: "fail", Grid: 1, Block: 1})
	deployChain(t, e, "refuse", abi.Launch{Kernel: "refuse", Grid: 1, Block: 1})
	r := pipeline.New(e, nil)
	for _, fn := range []string{"slowfail", "refuse"} {
		r.Invoke(context.Background(), fn, &call.Request{Input: []byte{}}) // loaded: a branch's step starts at once
	}
	for _, tc := range []struct {
		name     string
		branches []string
	}{
		{"the later failure listed first", []string{"slowfail", "refuse"}},
		{"the later failure listed last", []string{"refuse", "slowfail"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testkit.Deploy(t, e, pipelineDir(t, "p", map[string]any{"parallel": tc.branches}))
			req := &call.Request{Input: []byte{}}
			err := r.Invoke(context.Background(), "p", req)
			ended := map[string]time.Duration{}
			for _, st := range req.Steps {
				ended[st.Step] = st.Begin + st.Timing.Total
			}
			// slowfail's step absent: given up in its queue, after refuse
			// failed.
			if slow, ran := ended["slowfail"]; ran && ended["refuse"] >= slow {
				t.Fatalf("refuse's step ended %v into the request, slowfail's %v: the test needs refuse to fail first", ended["refuse"], slow)
			}
			if errdefs.KindOf(err) != errdefs.KindRejected || !strings.Contains(err.Error(), "(refuse)") {
				t.Errorf("err = %v (kind %v), want refuse's refusal, the first failure", err, errdefs.KindOf(err))
			}
		})
	}
}

// An intermediate output over the next step's max_input_bytes is the
// pipeline's definition at fault (its steps do not fit each other), not the
// client's: the client sent 1 byte, yet the request is answered 413 "input
// is 256 bytes", a client error no smaller request can avoid, and counted
// in the pipeline's client errors. Deploy does not refuse the mismatch
// either (pipedef checks existence and cycles only).
func TestUnfitStepsAreThePipelinesFault(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("wide"), nil)) // out_bytes 256
	narrow := testkit.Manifest("narrow")
	narrow.MaxInputBytes = 16
	testkit.Deploy(t, e, testkit.BundleDir(t, narrow, nil))
	testkit.Deploy(t, e, pipelineDir(t, "p", "wide", "narrow"))
	err := pipeline.New(e, nil).Invoke(context.Background(), "p", &call.Request{Input: []byte{1}})
	if err == nil {
		t.Fatal("a 256-byte intermediate into a step taking 16 succeeded")
	}
	st, _, msg, _ := apierr.Classify(err)
	if st != apierr.BadOutput || !strings.Contains(msg, "step 1 (narrow)") {
		t.Errorf("a 1-byte request whose step 0 output (256 bytes) exceeds step 1's max_input_bytes (16) is answered %d %s %q; want 500 bad_output naming the step",
			st.HTTP, st.Name, msg)
	}
}

// A later step whose function refuses its input (plover_reject, 422) refused
// the step before it's output, not the client's input: 500 bad_output, as
// README says of a step that refuses its input "as too large or invalid".
// It was passed through as the client's 422 (a hunt found it).
func TestLaterStepsRefusalIsThePipelinesFault(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	picky := testkit.Manifest("picky")
	picky.Chain = []abi.Launch{{Kernel: "refuse", Grid: 1, Block: 1}}
	testkit.Deploy(t, e, testkit.BundleDir(t, picky, nil))
	exact := testkit.Manifest("exact") // answers what it got, no more: nothing for nothing
	exact.Chain = []abi.Launch{{Kernel: "echo_exact", Grid: 1, Block: 1}}
	testkit.Deploy(t, e, testkit.BundleDir(t, exact, nil))
	testkit.Deploy(t, e, pipelineDir(t, "p", "exact", "picky"))
	err := pipeline.New(e, nil).Invoke(context.Background(), "p", &call.Request{})
	st, _, msg, _ := apierr.Classify(err)
	if st != apierr.BadOutput || !strings.Contains(msg, "step 1 (picky)") {
		t.Errorf("step 1 refusing step 0's output: %d %s %q (%v); want 500 bad_output naming the step", st.HTTP, st.Name, msg, err)
	}
}

// Deploy accepts a pipeline running exactly pipedef.MaxFunctions (256)
// functions through a nested pipeline (16 x inner, inner 16 x f), but every
// request to it is refused: the runner counts its pins, nested pipelines'
// own pins included, against the same limit of functions.
func TestFunctionLimitCountsFunctionsAsDeployDoes(t *testing.T) {
	e := nested256(t)
	req := &call.Request{Input: []byte{1}}
	if err := pipeline.New(e, nil).Invoke(context.Background(), "outer", req); err != nil {
		t.Fatalf("deploy accepted outer (256 functions, the limit), but its request fails: %v", err)
	}
	if len(req.Steps) != 256 {
		t.Fatalf("%d steps ran, want 256", len(req.Steps))
	}
}

// A parallel last step's outputs are described (Pin.Version().Tensors,
// what /v2 metadata and gRPC ModelMetadata say, and what both transports
// cut the output by) as each branch's declared outputs in order, but the
// output is each branch's whole run output (out_bytes) concatenated: when
// a branch's out_bytes is more than its declared tensors' bytes, the next
// branch's tensor is cut from the first's padding. Here "b" (second
// branch, an echo of [1 2 3 4]) reads as zeroes.
func TestParallelLastOutputsCutPerBranch(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	a := testkit.Manifest("fa") // out_bytes 256, declares only a UINT8[4]
	a.Tensors = &abi.Tensors{Inputs: abi.RawTensors.Inputs, Outputs: []abi.Tensor{{Name: "a", Datatype: "UINT8", Shape: []int64{4}}}}
	b := testkit.Manifest("fb")
	b.OutBytes = 4
	b.Tensors = &abi.Tensors{Inputs: abi.RawTensors.Inputs, Outputs: []abi.Tensor{{Name: "b", Datatype: "UINT8", Shape: []int64{4}}}}
	testkit.Deploy(t, e, testkit.BundleDir(t, a, nil))
	testkit.Deploy(t, e, testkit.BundleDir(t, b, nil))
	testkit.Deploy(t, e, pipelineDir(t, "p", map[string]any{"parallel": []string{"fa", "fb"}}))
	r := pipeline.New(e, nil)
	p, err := r.Pin(context.Background(), "p", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	outs := p.Version().Tensors.Outputs
	if len(outs) != 2 || outs[0].Name != "a" || outs[1].Name != "b" {
		t.Fatalf("outputs %+v, want a then b", outs)
	}
	in := []byte{1, 2, 3, 4}
	req := &call.Request{Input: in}
	if err := p.Invoke(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	cuts, _, err := oip.CutOutputs(req.Output, outs, nil, nil) // as /v2 infer and gRPC ModelInfer cut it
	if err != nil {
		t.Fatalf("cutting the output by the pipeline's declared outputs: %v", err)
	}
	if !bytes.Equal(cuts[0].Bytes, in) || !bytes.Equal(cuts[1].Bytes, in) {
		t.Errorf("a = %v, b = %v; want both %v (each branch echoes the input)", cuts[0].Bytes, cuts[1].Bytes, in)
	}
}

// A parallel last step whose first branch declares a variable last output
// gives the pipeline outputs where a variable tensor is not last, which no
// function may declare (abi: only the last output may vary): every /v2 or
// gRPC inference of the pipeline fails with 500 bad_output though its
// metadata advertises those outputs.
func TestParallelLastVariableOutputNotLastIsRaw(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Typed("typed"), nil)) // outputs z FP32[2,2], rest INT16[-1]
	b := testkit.Manifest("fb")
	b.OutBytes = 4
	b.Tensors = &abi.Tensors{Inputs: abi.RawTensors.Inputs, Outputs: []abi.Tensor{{Name: "b", Datatype: "UINT8", Shape: []int64{4}}}}
	testkit.Deploy(t, e, testkit.BundleDir(t, b, nil))
	testkit.Deploy(t, e, pipelineDir(t, "p", map[string]any{"parallel": []string{"typed", "fb"}}))
	p, err := pipeline.New(e, nil).Pin(context.Background(), "p", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	req := &call.Request{Input: make([]byte, 24)} // x FP32[2,2] and y INT16[4]
	if err := p.Invoke(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if _, _, err := oip.CutOutputs(req.Output, p.Version().Tensors.Outputs, nil, nil); err != nil {
		t.Errorf("the pipeline's advertised outputs %+v cannot be cut from its own output: %v", p.Version().Tensors.Outputs, err)
	}
	if outs := p.Version().Tensors.Outputs; len(outs) != 1 || outs[0].Name != abi.RawTensors.Outputs[0].Name {
		t.Errorf("outputs %+v, want the raw bytes (a variable output in the middle cannot be cut)", outs)
	}
}

// A branch of a parallel last step that writes fewer bytes than its
// declared outputs take fails the request (500 bad_output, naming the
// branch): its tensors cannot be cut, and its siblings' would be misplaced.
func TestParallelLastShortBranchIsBadOutput(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	deployWriting(t, e, "fa", 2)
	deployWriting(t, e, "fb", 4)
	testkit.Deploy(t, e, pipelineDir(t, "p", map[string]any{"parallel": []string{"fa", "fb"}}))
	reg := prometheus.NewRegistry()
	err := pipeline.New(e, reg).Invoke(context.Background(), "p", &call.Request{Input: []byte{1, 2, 3, 4}})
	st, _, msg, _ := apierr.Classify(err)
	if st != apierr.BadOutput || !strings.Contains(msg, "branch 0 wrote 2 bytes, its declared outputs take 4") {
		t.Fatalf("a 2-byte branch declaring 4: %v %q, want bad_output naming the branch", st, msg)
	}
	// Counted as the step's error: each branch ran, and no step's error
	// was counted for a failed request (a review found it).
	if n, err := testutil.GatherAndCount(reg, "plover_pipeline_step_errors_total"); err != nil || n != 1 {
		t.Errorf("step error series: %d (%v), want the parallel step's", n, err)
	}
}

// deployWriting deploys function name on e, declaring an output of 4 bytes
// and writing out bytes.
func deployWriting(t *testing.T, e *engine.Engine, name string, out int64) {
	t.Helper()
	m := testkit.Manifest(name)
	m.OutBytes = out
	m.Tensors = &abi.Tensors{Inputs: abi.RawTensors.Inputs, Outputs: []abi.Tensor{{Name: name, Datatype: "UINT8", Shape: []int64{4}}}}
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
}

// A parallel step's failure is told to a caller whose token may use every
// function it names, and to no other (pipeline.Hidden): a short branch's
// names its own function alone; one before the step ran (its client left)
// names each branch's. The step's label, "parallel(secret-fn, mycnn)", was
// matched whole against the token's globs: "*cnn*" took it and was told a
// message naming secret-fn, while "secret-fn" and "mycnn" together were
// told nothing; and the short branch's error series, labelled so, stayed
// after Forget("mycnn") (a review).
func TestAParallelStepsFailureIsToldByItsFunctions(t *testing.T) {
	e := testkit.Engine(t, engine.Config{Timeout: 30 * time.Second})
	deployWriting(t, e, "secret-fn", 4)
	deployWriting(t, e, "mycnn", 2) // short: branch 1
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Slow("slow", 300), nil))
	par := map[string]any{"parallel": []string{"secret-fn", "mycnn"}}
	testkit.Deploy(t, e, pipelineDir(t, "short", par))
	testkit.Deploy(t, e, pipelineDir(t, "left", "slow", par))
	reg := prometheus.NewRegistry()
	r := pipeline.New(e, reg)
	short := r.Invoke(context.Background(), "short", &call.Request{Input: []byte{1, 2, 3, 4}})
	if st, _, _, _ := apierr.Classify(short); st != apierr.BadOutput {
		t.Fatalf("short: %v, want mycnn's bad_output", short)
	}
	var gone atomic.Bool
	done := make(chan error, 1)
	go func() {
		done <- r.Invoke(context.Background(), "left", &call.Request{Input: []byte{1, 2, 3, 4}, Gone: gone.Load})
	}()
	testkit.WaitFor(t, e, "slow", "its run to start", testkit.Busy(1, 0))
	gone.Store(true) // the walk stops before the parallel step
	left := <-done
	if errdefs.KindOf(left) != errdefs.KindGone {
		t.Fatalf("left: %v, want its client's departure before step 1", left)
	}
	for _, tc := range []struct {
		name   string
		err    error
		globs  []string
		hidden bool
	}{
		{"a short branch, to a token for it alone", short, []string{"*cnn*"}, false},
		{"a short branch, to a token for both", short, []string{"secret-fn", "mycnn"}, false},
		{"a short branch, to a token for its sibling alone", short, []string{"secret-*"}, true},
		{"before the step, to a token for one branch", left, []string{"slow", "*cnn*"}, true},
		{"before the step, to a token for both", left, []string{"slow", "secret-fn", "mycnn"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sees := func(fn string) bool {
				for _, g := range tc.globs {
					if ok, _ := filepath.Match(g, fn); ok {
						return true
					}
				}
				return false
			}
			msg, hidden := pipeline.Hidden(tc.err, sees)
			if !hidden {
				msg = tc.err.Error()
			}
			if hidden != tc.hidden {
				t.Errorf("hidden = %v, want %v: told %q", hidden, tc.hidden, msg)
			}
			for _, fn := range []string{"secret-fn", "mycnn"} {
				if strings.Contains(msg, fn) && !sees(fn) {
					t.Errorf("told %q, naming %s, which the token may not use", msg, fn)
				}
			}
		})
	}
	if got := stepSeries(t, reg); !slices.Contains(got, "short/0/mycnn/500") {
		t.Errorf("step series %q, want short's error under mycnn", got)
	}
	r.Forget("mycnn")
	for _, s := range stepSeries(t, reg) {
		if strings.Contains(s, "mycnn") {
			t.Errorf("series %s after mycnn was forgotten", s)
		}
	}
}

// One request of a pipeline that names the same function in several steps
// may run different versions of it: the plan pins each step on its own
// (expand calls Engine.Pin per step), so a deploy that lands while a
// request's plan is being made splits the request across two versions.
// Deploys alternate two bundles of f while requests of p (f 16 times in
// each of 16 nested steps) run; every request must run one version of f.
func TestOneRequestRunsOneVersionOfAFunction(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	v1, v2 := testkit.Manifest("f"), testkit.Manifest("f")
	v2.OutBytes = 128 // another bundle, another version
	var bundles [2][]byte
	for i, m := range []*abi.Manifest{v1, v2} {
		b, _, _, err := bundle.PackBytes(testkit.BundleDir(t, m, nil))
		if err != nil {
			t.Fatal(err)
		}
		bundles[i] = b
	}
	if _, err := e.Control().Deploy(context.Background(), "f", bytes.NewReader(bundles[0]), false); err != nil {
		t.Fatal(err)
	}
	steps := make([]any, 16)
	for i := range steps {
		steps[i] = "f"
	}
	testkit.Deploy(t, e, pipelineDir(t, "inner", steps...))
	for i := range steps[:15] {
		steps[i] = "inner" // 15 x 16 = 240 functions: under the runner's count of pins
	}
	testkit.Deploy(t, e, pipelineDir(t, "p", steps[:15]...))
	stop := make(chan struct{})
	deployed := make(chan int)
	go func() {
		n := 0
		defer func() { deployed <- n }()
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := e.Control().Deploy(context.Background(), "f", bytes.NewReader(bundles[i%2]), false); err != nil {
				t.Errorf("deploy %d: %v", i, err)
				return
			}
			n++
		}
	}()
	r := pipeline.New(e, nil)
	end := time.Now().Add(3 * time.Second)
	var split string
	requests := 0
	for time.Now().Before(end) && split == "" && requests < 600 {
		req := &call.Request{Input: []byte{1}}
		if err := r.Invoke(context.Background(), "p", req); err != nil {
			t.Fatal(err)
		}
		requests++
		for _, s := range req.Steps {
			if s.Version != req.Steps[0].Version {
				split = req.Steps[0].Version + " and " + s.Version
				break
			}
		}
	}
	close(stop)
	n := <-deployed
	if split != "" {
		t.Errorf("one request ran f at versions %s (request %d, %d deploys meanwhile)", split, requests, n)
	}
}

// README and pipedef.MaxDepth allow pipelines "up to 8 levels deep" (a
// pipeline naming a pipeline is depth 2), and the runner runs 8 levels
// (it refuses a 9th), but a deploy refuses 8: pipedef's step checks the
// depth on every step, function steps of the 8th pipeline included, so it
// is off by one against the runner and the documentation.
func TestEightLevelsDeployAndRun(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("f"), nil))
	prev := "f"
	for i := 8; i >= 2; i-- { // p8 names f, p7 names p8, ... p2 names p3
		name := "p" + string(rune('0'+i))
		testkit.Deploy(t, e, pipelineDir(t, name, prev))
		prev = name
	}
	b, _, _, err := bundle.PackBytes(pipelineDir(t, "top", "p2")) // top, p2 .. p8: 8 levels
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Control().Deploy(context.Background(), "top", bytes.NewReader(b), false); err != nil {
		t.Fatalf("a pipeline 8 levels deep (top -> p2 -> ... -> p8 -> f) is refused: %v", err)
	}
	if err := pipeline.New(e, nil).Invoke(context.Background(), "top", &call.Request{Input: []byte{1}}); err != nil {
		t.Fatalf("8 levels: %v", err)
	}
}

// A pipeline's input bound is its first step's (the least of a parallel
// first step's branches): what the transports check before laying out a
// request's tensors, as for a function.
func TestPipelineMaxInputIsItsFirstSteps(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	for _, c := range []struct {
		name string
		max  int64
	}{{"wide", 1 << 10}, {"narrow", 16}} {
		m := testkit.Manifest(c.name)
		m.MaxInputBytes = c.max
		testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	}
	testkit.Deploy(t, e, pipelineDir(t, "seq", "wide", "narrow"))
	testkit.Deploy(t, e, pipelineDir(t, "par", map[string]any{"parallel": []string{"wide", "narrow"}}, "wide"))
	r := pipeline.New(e, nil)
	for name, want := range map[string]int64{"seq": 1 << 10, "par": 16} {
		p, err := r.Pin(context.Background(), name, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		if got := p.Version().MaxInputBytes; got != want {
			t.Errorf("%s: MaxInputBytes %d, want %d", name, got, want)
		}
		p.Release()
	}
}

// A nested pipeline deployed again with more steps would take a pipeline
// that runs it past pipedef.MaxFunctions: the deploy is refused (409
// naming that pipeline) unless forced; forced (or raced by another
// node's deploy), the outer pipeline's requests then fail with 500 naming
// the limit, the deployed pipelines' fault, not the client's (it was 422,
// a client error).
func TestALimitPassedSinceItsDeployIsTheServers(t *testing.T) {
	e := nested256(t)
	// outer would run 16 x 17 = 272: refused, naming outer, unless forced.
	b, _, _, err := bundle.PackBytes(pipelineDir(t, "inner", testkit.Repeat(17, "f")...))
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.Control().Deploy(context.Background(), "inner", bytes.NewReader(b), false)
	if st, _, _, _ := apierr.Classify(err); st.HTTP != 409 || !strings.Contains(err.Error(), "pipeline outer runs inner") || !strings.Contains(err.Error(), "plover deploy --force") {
		t.Fatalf("deploying inner past outer's limit: %v (HTTP %d), want 409 naming outer and --force", err, st.HTTP)
	}
	fi := testkit.ForceDeploy(t, e, pipelineDir(t, "inner", testkit.Repeat(17, "f")...))
	if len(fi.Warnings) != 1 || !strings.Contains(fi.Warnings[0], "pipeline outer runs inner") {
		t.Errorf("the forced deploy's warnings: %q, want one naming outer", fi.Warnings)
	}
	err = pipeline.New(e, nil).Invoke(context.Background(), "outer", &call.Request{Input: []byte{1}})
	if st, _, _, _ := apierr.Classify(err); st.HTTP != 500 || !strings.Contains(err.Error(), "more than 256 functions") {
		t.Errorf("outer past the limit: %v (HTTP %d), want 500 naming the limit", err, st.HTTP)
	}
}

// nested256 is an engine with f, inner (16 x f) and outer (16 x inner):
// 256 functions a request, the limit.
func nested256(t *testing.T) *engine.Engine {
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("f"), nil))
	testkit.Deploy(t, e, pipelineDir(t, "inner", testkit.Repeat(16, "f")...))
	testkit.Deploy(t, e, pipelineDir(t, "outer", testkit.Repeat(16, "inner")...))
	return e
}

// listDown is a store whose listings of the records fail while down: the
// records a pipeline deploy reads by name are there, the list of them all
// is not.
type listDown struct {
	objectstore.Store
	down atomic.Bool
}

func (s *listDown) List(ctx context.Context, prefix string) ([]objectstore.Info, error) {
	if s.down.Load() && prefix == "functions/" {
		return nil, errors.New("endpoint unreachable (http://127.0.0.1:9): connection refused")
	}
	return s.Store.List(ctx, prefix)
}

// A pipeline deploy whose store cannot list the pipelines that may run it
// is 503 naming what was not checked; with force it lands and says so in
// its warnings (it said nothing: a forced deploy past an unchecked limit
// read as one past nothing).
func TestAForcedDeployPastAnUncheckedListingSaysSo(t *testing.T) {
	fs, err := objectstore.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	store := &listDown{Store: fs}
	e := testkit.Engine(t, engine.Config{Store: store})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("f"), nil))
	testkit.Deploy(t, e, pipelineDir(t, "inner", "f"))
	store.down.Store(true)
	b, _, _, err := bundle.PackBytes(pipelineDir(t, "inner", "f", "f"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.Control().Deploy(context.Background(), "inner", bytes.NewReader(b), false)
	if st, _, _, _ := apierr.Classify(err); st.HTTP != 503 || !strings.Contains(err.Error(), "the pipelines that may run it were not checked") {
		t.Fatalf("deploying inner, the store's listing down: %v (HTTP %d), want 503 saying what was not checked", err, st.HTTP)
	}
	fi := testkit.ForceDeploy(t, e, pipelineDir(t, "inner", "f", "f"))
	if len(fi.Warnings) != 1 || !strings.Contains(fi.Warnings[0], "deploy inner: the pipelines that may run it were not checked: store unavailable") || !strings.Contains(fi.Warnings[0], "endpoint unreachable") {
		t.Errorf("the forced deploy's warnings: %q, want one saying the pipelines were not checked and why", fi.Warnings)
	}
}
