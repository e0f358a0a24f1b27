package grpcapi

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/gate"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/pipeline"
	"github.com/plover-run/plover/reqmetrics"
)

// ModelInfer's handler charges the call's measured decoding to the flow
// of the model it found, answers the call itself (for the codec to encode
// in that flow's name) with its request let go, and charges nothing for a
// call an interceptor refused: a decode of a second, set by the test, is
// either the flow's or no one's.
func TestInferHandlerChargesItsDecodeOnlyOnceAdmitted(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("f"), nil))
	reg := prometheus.NewRegistry()
	door := frontdoor.New(frontdoor.Config{Runner: pipeline.New(e, reg), Gate: gate.New(nil, reg), Metrics: reqmetrics.New(reg)})
	s := New(door, Options{})
	dec := func(v any) error {
		c := v.(*inferCall)
		c.req.ModelName = "f"
		c.req.Inputs = []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{4}}}
		c.req.RawInputContents = [][]byte{[]byte("abcd")}
		c.io.decode = time.Second
		return nil
	}
	ioOf := func() float64 {
		fi, err := e.Control().Function(context.Background(), "f")
		if err != nil {
			t.Fatal(err)
		}
		return fi.IOSeconds
	}
	refuse := func(context.Context, any, *grpc.UnaryServerInfo, grpc.UnaryHandler) (any, error) {
		return nil, errors.New("refused")
	}
	if _, err := inferHandler(s, context.Background(), dec, refuse); err == nil {
		t.Fatal("a refused call answered")
	}
	if got := ioOf(); got != 0 {
		t.Fatalf("a refused call charged its function %v s", got)
	}
	resp, err := inferHandler(s, context.Background(), dec, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, ok := resp.(*inferCall)
	if !ok || c.resp == nil || c.io.fl == nil {
		t.Fatalf("the handler answered %T, not the call with its answer and flow", resp)
	}
	if c.req.GetModelName() != "" || c.req.GetRawInputContents() != nil {
		t.Fatal("the answered call still holds its request")
	}
	if got := ioOf(); got < 1 {
		t.Fatalf("an admitted call charged its function %v s, want its decode's 1 s and more", got)
	}
}
