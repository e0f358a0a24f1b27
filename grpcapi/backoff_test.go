package grpcapi_test

import (
	"regexp"
	"strconv"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/grpcapi"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
	"github.com/plover-run/plover/internal/testkit"
)

// A version backing off says when to retry over gRPC too, in the message
// (gRPC has no Retry-After): the seconds until the back-off ends, as HTTP's
// header has them.
func TestBackoffSaysWhenToRetry(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.FailingLoadBundleDir(t, "h"))
	client := pb.NewGRPCInferenceServiceClient(dial(t, grpcapi.New(testkit.Door(e, nil, nil), grpcapi.Options{}).GRPC()))
	retryIn := regexp.MustCompile(`is backing off: .* \(retry in (\d+) s\)$`)
	for i := 0; ; i++ {
		if i == 10 {
			t.Fatal("10 requests to a function whose load fails, and no back-off")
		}
		_, err := client.ModelInfer(ctxT(t), &pb.ModelInferRequest{ModelName: "h",
			Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{1}}}, RawInputContents: [][]byte{{1}}})
		st, _ := status.FromError(err)
		if st.Code() != codes.Unavailable {
			continue
		}
		sub := retryIn.FindStringSubmatch(st.Message())
		if sub == nil {
			t.Fatalf("%v; want the back-off with (retry in N s)", err)
		}
		if n, _ := strconv.Atoi(sub[1]); n < 1 || n > 60 {
			t.Fatalf("retry in %d s; want 1..60 (the back-off's minute)", n)
		}
		return
	}
}
