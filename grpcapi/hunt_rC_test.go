package grpcapi_test

// Bug hunt (branch rC): each test here demonstrates a defect and fails on
// the code it was written against.

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/plover-run/plover/grpcapi"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
)

// A request message over the limit (--max-body, as an HTTP body over it,
// which HTTP answers 413 too_large) is refused by gRPC-Go itself before any
// handler runs: ResourceExhausted, the class README's table gives to busy
// and rate_limited (retry later), where apierr maps too_large to
// InvalidArgument; its message names neither the field nor the flag.
func TestHuntOverLimitRequestIsTooLargeNotExhausted(t *testing.T) {
	f := serveOpts(t, nil, grpcapi.Options{MaxMessageBytes: 200})
	big := make([]byte, 1000)
	_, err := f.client.ModelInfer(ctxT(t), &pb.ModelInferRequest{ModelName: "echo",
		Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{int64(len(big))}}}, RawInputContents: [][]byte{big}})
	st, _ := status.FromError(err)
	if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "--max-body") {
		t.Errorf("a 1000-byte request over a 200-byte limit: %v %q; want InvalidArgument (too_large, as HTTP's 413) naming the limit and --max-body",
			st.Code(), st.Message())
	}
}
