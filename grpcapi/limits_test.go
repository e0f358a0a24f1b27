package grpcapi_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/plover-run/plover/grpcapi"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
)

// A raw response over the server's message limit is refused by the server,
// naming the model, the sizes and the flag that sets the limit (plover
// serve --max-body; there is no --max-body-mb), not by gRPC's own check,
// which names neither, and counted as the 500 it is, not as the success
// the run was.
func TestResponseOverMessageLimit(t *testing.T) {
	f := serveOpts(t, nil, grpcapi.Options{MaxMessageBytes: 200}) // echo's output is 256 bytes
	_, err := f.client.ModelInfer(ctxT(t), &pb.ModelInferRequest{ModelName: "echo",
		Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{1}}}, RawInputContents: [][]byte{{7}}})
	st, _ := status.FromError(err)
	if st.Code() != codes.Internal || !strings.Contains(st.Message(), "model echo") || !strings.Contains(st.Message(), "over the gRPC message limit of 200 bytes") ||
		!strings.Contains(st.Message(), "(plover serve --max-body)") {
		t.Fatalf("%v %q, want Internal naming the model, the limit and plover serve --max-body", st.Code(), st.Message())
	}
	if got := testutil.ToFloat64(counter(t, f.reg, "echo", "500")); got != 1 {
		t.Errorf("requests counted as 500: %v, want 1", got)
	}
}
