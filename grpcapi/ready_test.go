package grpcapi_test

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/plover-run/plover/grpcapi/inferencepb"
	"github.com/plover-run/plover/internal/testkit"
)

// ModelReady is whether the model takes inference requests now: a
// function whose library a device refused (a dependency missing: every
// request fails with InvalidArgument, and will until a redeploy) is not
// ready, as Triton answers for a model that failed to load; it answered
// ready: true. Another function on the same server stays ready.
func TestModelReadyOfAFunctionThatFailedToLoad(t *testing.T) {
	f := serve(t, nil) // echo among its functions
	testkit.Deploy(t, f.e, testkit.UnloadableBundleDir(t, testkit.Manifest("broken")))
	c, ctx := f.client, ctxT(t)
	in := &pb.ModelInferRequest{ModelName: "broken", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{1}}},
		RawInputContents: [][]byte{{1}}}
	for range 2 {
		if _, err := c.ModelInfer(ctx, in); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("ModelInfer of broken: %v, want InvalidArgument (its library refused)", err)
		}
		r, err := c.ModelReady(ctx, &pb.ModelReadyRequest{Name: "broken"})
		if err != nil || r.Ready {
			t.Fatalf("ModelReady of broken after its load failed: %v %v, want ready false", r, err)
		}
	}
	if r, err := c.ModelReady(ctx, &pb.ModelReadyRequest{Name: "echo"}); err != nil || !r.Ready {
		t.Fatalf("ModelReady of echo: %v %v", r, err)
	}
}
