package grpcapi_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/grpcapi"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
	"github.com/plover-run/plover/internal/testkit"
)

// A function's refusal of its input (plover_reject) is InvalidArgument
// over gRPC, with its message, as it is 422 over HTTP.
func TestRefusedInputIsInvalidArgument(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	m := testkit.Manifest("picky")
	m.Chain = []abi.Launch{{Kernel: "refuse", Grid: 1, Block: 1}}
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	conn := dial(t, grpcapi.New(testkit.Door(e, nil, nil), grpcapi.Options{}).GRPC())
	_, err := pb.NewGRPCInferenceServiceClient(conn).ModelInfer(ctxT(t), &pb.ModelInferRequest{ModelName: "picky",
		Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{0}}}, RawInputContents: [][]byte{{}}})
	if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "refused its input: input must not be empty") {
		t.Fatalf("%v, want InvalidArgument with the function's message", err)
	}
}
