package grpcapi_test

import (
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
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
	gs := grpcapi.New(testkit.Door(e, nil, nil), grpcapi.Options{}).GRPC()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(ln)
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = pb.NewGRPCInferenceServiceClient(conn).ModelInfer(ctxT(t), &pb.ModelInferRequest{ModelName: "picky",
		Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{0}}}, RawInputContents: [][]byte{{}}})
	if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "refused its input: input must not be empty") {
		t.Fatalf("%v, want InvalidArgument with the function's message", err)
	}
}
