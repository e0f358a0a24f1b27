package grpcapi

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/plover-run/plover/auth"
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

// openTokens is a token table that knows none: the gate is not open.
type openTokens struct{}

func (openTokens) Lookup([]byte) *auth.Principal { return nil }

// A call whose stream ended before its interceptor ran is answered as it
// ended: cancelled by its client, or past its read timeout. The stream's
// end stops the call's read timer as it gives its place back, and a timer
// stopped was taken for one that fired: a call its client cancelled was
// told its message came late.
func TestACallEndedBeforeItsInterceptorSaysHow(t *testing.T) {
	reg := prometheus.NewRegistry()
	door := frontdoor.New(frontdoor.Config{Runner: testkit.PanicRunner{}, Gate: gate.New(openTokens{}, reg), Metrics: reqmetrics.New(reg)})
	s := New(door, Options{})
	info := &grpc.UnaryServerInfo{FullMethod: pb.GRPCInferenceService_ServerLive_FullMethodName}
	handler := func(context.Context, any) (any, error) { return &pb.ServerLiveResponse{Live: true}, nil }
	for _, tc := range []struct {
		name string
		end  func(cancel context.CancelFunc, c *pending)
		want codes.Code
	}{
		{"cancelled by its client", func(cancel context.CancelFunc, _ *pending) { cancel() }, codes.Canceled},
		{"its message late", func(_ context.CancelFunc, c *pending) { c.timer.Reset(0) }, codes.DeadlineExceeded},
		{"not ended", func(context.CancelFunc, *pending) {}, codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent, cancel := context.WithCancel(context.Background())
			defer cancel()
			ctx, err := s.tap(parent, &tap.Info{FullMethodName: info.FullMethod, Header: metadata.MD{}})
			if err != nil {
				t.Fatal(err)
			}
			c := ctx.Value(pendingKey{}).(*pending)
			tc.end(cancel, c)
			if tc.want != codes.OK {
				// Its end has given its place back (and stopped its timer).
				for end := time.Now().Add(10 * time.Second); s.anonHeld() > 0; time.Sleep(time.Millisecond) {
					if time.Now().After(end) {
						t.Fatal("the ended call's place was never given back")
					}
				}
			}
			_, err = s.admit(ctx, &pb.ServerLiveRequest{}, info, handler)
			if got := status.Code(err); got != tc.want {
				t.Fatalf("admit of a call %s: %v, want %v", tc.name, err, tc.want)
			}
			if n := s.anonHeld(); n != 0 {
				t.Fatalf("places held after the call: %d", n)
			}
		})
	}
}

// anonHeld is how many open methods' calls hold a place.
func (s *Server) anonHeld() int {
	s.anon.mu.Lock()
	defer s.anon.mu.Unlock()
	n := 0
	for _, k := range s.anon.n {
		n += k
	}
	return n
}
