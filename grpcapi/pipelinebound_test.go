package grpcapi_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/grpcapi"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
	"github.com/plover-run/plover/internal/testkit"
)

// A pipeline's input bound is its first step's max_input_bytes (it may
// set none of its own): an input past it names that step, not the
// pipeline's max_input_bytes.
func TestPipelineInputBoundNamesItsStep(t *testing.T) {
	f := serve(t, nil)
	dir := testkit.PipelineDir(t, "p", "echo", "echo")
	testkit.Deploy(t, f.e, dir)
	req := oneByte("p") // echo takes 64 KiB
	req.Inputs[0].Shape[0], req.RawInputContents[0] = 1<<16+1, make([]byte, 1<<16+1)
	_, err := f.client.ModelInfer(ctxT(t), req)
	if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "model p takes at most 65536 (its step 0 (echo)'s max_input_bytes)") {
		t.Fatalf("%v; want InvalidArgument naming step 0 (echo)'s max_input_bytes", err)
	}
}

// A pipeline whose step's function was deleted (plover rm --force) exists,
// but its requests fail before they run: ModelReady says not ready, not
// NotFound, as /v2/models/NAME/ready answers 503 ready false.
func TestModelReadyOfAPipelineWhoseStepWasDeleted(t *testing.T) {
	f := serve(t, nil)
	testkit.Deploy(t, f.e, testkit.BundleDir(t, testkit.Manifest("gone"), nil))
	dir := testkit.PipelineDir(t, "p", "echo", "gone")
	testkit.Deploy(t, f.e, dir)
	if err := f.e.Control().Delete(context.Background(), "gone", true); err != nil {
		t.Fatal(err)
	}
	resp, err := f.client.ModelReady(ctxT(t), &pb.ModelReadyRequest{Name: "p"})
	if err != nil || resp.GetReady() {
		t.Fatalf("ModelReady(p) after its step's function was deleted: %v, %v; want not ready", resp, err)
	}
	// Its metadata cannot be told (its tensors are its steps'), but the
	// model exists: Unavailable naming the step, not NotFound.
	_, err = f.client.ModelMetadata(ctxT(t), &pb.ModelMetadataRequest{Name: "p"})
	if st, _ := status.FromError(err); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "step 1 (gone)") || !strings.Contains(st.Message(), "model p") {
		t.Fatalf("ModelMetadata(p) after its step's function was deleted: %v; want Unavailable naming model p and step 1 (gone)", err)
	}
}

// Over gRPC as over HTTP, a pipeline's version other than its current one
// runs only for a token that may invoke each of its steps (oip.PinVersion):
// a redeploy without a step withdraws it from the pipeline's callers.
func TestAnOlderPipelineVersionNeedsItsStepsOverGRPC(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	old, cur := testkit.WithdrawnStep(t, e)
	f := serveEngine(t, e, table{
		"caller":  {Name: "caller", Scopes: auth.Invoke, Functions: []string{"p"}},
		"trusted": {Name: "trusted", Scopes: auth.Invoke, Functions: []string{"p", "secret"}},
	}, grpcapi.Options{})
	for _, tc := range []struct {
		token, version string
		want           codes.Code
	}{
		{"caller", "", codes.OK},
		{"caller", cur, codes.OK},
		{"caller", old, codes.PermissionDenied},
		{"trusted", old, codes.OK},
	} {
		req := oneByte("p")
		req.ModelVersion = tc.version
		_, err := f.client.ModelInfer(withToken(ctxT(t), tc.token), req)
		if st, _ := status.FromError(err); st.Code() != tc.want || strings.Contains(st.Message(), "secret") {
			t.Errorf("%s calling p version %q: %v; want %v (naming no step: it may be another tenant's)", tc.token, tc.version, err, tc.want)
		}
	}
}

// An input past a pipeline's first step's bound, from a token that may not
// use that step's function, is refused with the bound and the step's
// place, not its name (pipeline.StepRef.Refusal); a token that may use it
// reads its name.
func TestPipelineInputBoundHidesAStepItsCallerMayNotUse(t *testing.T) {
	f := serve(t, table{
		"a":   {Name: "a", Scopes: auth.Invoke, Functions: []string{"a-*"}},
		"all": {Name: "all", Scopes: auth.Invoke, Functions: []string{"*"}},
	})
	testkit.Deploy(t, f.e, testkit.PipelineDir(t, "a-pipe", "echo", "echo"))
	req := oneByte("a-pipe") // echo takes 64 KiB
	req.Inputs[0].Shape[0], req.RawInputContents[0] = 1<<16+1, make([]byte, 1<<16+1)
	for _, tc := range []struct {
		token string
		named bool
	}{{"a", false}, {"all", true}} {
		_, err := f.client.ModelInfer(withToken(ctxT(t), tc.token), req)
		st, _ := status.FromError(err)
		if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "model a-pipe takes at most 65536 (its step 0") ||
			strings.Contains(st.Message(), "(echo)") != tc.named {
			t.Errorf("token %s: %v; want InvalidArgument with the bound of step 0, naming echo %v", tc.token, err, tc.named)
		}
	}
}

// A pipeline's step that fails is told by its place and status alone to a
// token that may not use its function (pipeline.Hidden), over gRPC as over
// HTTP: not its name nor its function's own words; a token that may use it
// reads both.
func TestAHiddenStepsFailureOverGRPC(t *testing.T) {
	f := serve(t, table{
		"a":   {Name: "a", Scopes: auth.Invoke, Functions: []string{"a-*"}},
		"all": {Name: "all", Scopes: auth.Invoke, Functions: []string{"*"}},
	})
	failing := testkit.Manifest("b-fails")
	failing.Chain = []abi.Launch{{Kernel: "fail", Grid: 1, Block: 1}}
	testkit.Deploy(t, f.e, testkit.BundleDir(t, failing, nil))
	testkit.Deploy(t, f.e, testkit.PipelineDir(t, "a-failing", "echo", "b-fails"))
	for _, tc := range []struct {
		token string
		named bool
	}{{"a", false}, {"all", true}} {
		_, err := f.client.ModelInfer(withToken(ctxT(t), tc.token), oneByte("a-failing"))
		st, _ := status.FromError(err)
		named := strings.Contains(st.Message(), "b-fails") || strings.Contains(st.Message(), "asked to fail")
		if st.Code() != codes.Internal || !strings.Contains(st.Message(), "step 1") || named != tc.named {
			t.Errorf("token %s: %v; want Internal saying step 1, naming the step and its error %v", tc.token, err, tc.named)
		}
	}
}
