package grpcapi_test

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/gate"
	"github.com/plover-run/plover/grpcapi"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/reqmetrics"
)

// A call whose handling panics (a bug), unary or streaming, is answered
// Internal with a message that tells nothing of the panic; the panic is
// logged once, with its method, model and stack, and counted in
// plover_panics_total; the server goes on serving. gRPC-Go recovers no
// panic: one ended the process, every tenant's requests with it.
func TestPanicIsAnsweredInternal(t *testing.T) {
	var log testkit.LogBuffer
	reg := prometheus.NewRegistry()
	door := frontdoor.New(frontdoor.Config{Runner: testkit.PanicRunner{}, Metrics: reqmetrics.New(reg),
		Log: slog.New(slog.NewTextHandler(&log, nil))})
	gs := grpcapi.New(door, grpcapi.Options{}).GRPC()
	// A streaming method, which the service has none of, made to panic.
	gs.RegisterService(&grpc.ServiceDesc{ServiceName: "test.Panics", HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{StreamName: "Stream", ServerStreams: true, Handler: func(any, grpc.ServerStream) error {
			panic("a bug in a stream")
		}}}}, struct{}{})
	conn := dial(t, gs)
	c, ctx := pb.NewGRPCInferenceServiceClient(conn), ctxT(t)

	for i, tc := range []struct {
		name, method, panicked, model string
		call                          func() error
	}{
		{"unary", "inference.GRPCInferenceService/ServerReady", "a bug in Health", "", func() error {
			_, err := c.ServerReady(ctx, &pb.ServerReadyRequest{})
			return err
		}},
		{"unary with a model", "inference.GRPCInferenceService/ModelMetadata", "a bug in Pin", "m", func() error {
			_, err := c.ModelMetadata(ctx, &pb.ModelMetadataRequest{Name: "m"})
			return err
		}},
		{"infer", "inference.GRPCInferenceService/ModelInfer", "a bug in Land", "m", func() error {
			_, err := c.ModelInfer(ctx, &pb.ModelInferRequest{ModelName: "m"})
			return err
		}},
		{"infer of a version", "inference.GRPCInferenceService/ModelInfer", "a bug in Pin", "m", func() error {
			// A version named is pinned, and lent no slot (pinLanded).
			_, err := c.ModelInfer(ctx, &pb.ModelInferRequest{ModelName: "m", ModelVersion: "1"})
			return err
		}},
		{"stream", "test.Panics/Stream", "a bug in a stream", "", func() error {
			cs, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, "/test.Panics/Stream")
			if err != nil {
				return err
			}
			cs.CloseSend()
			return cs.RecvMsg(new(pb.ServerLiveResponse))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			st, _ := status.FromError(err)
			if st.Code() != codes.Internal || st.Message() != frontdoor.PanicMessage {
				t.Fatalf("%s: %v, want Internal: %s", tc.method, err, frontdoor.PanicMessage)
			}
			if r, err := c.ServerLive(ctx, &pb.ServerLiveRequest{}); err != nil || !r.Live {
				t.Fatalf("the next call, ServerLive: %v %v", r, err)
			}
			lines := testkit.PanicLines(log.String())
			if len(lines) != i+1 {
				t.Fatalf("%d panics, %d lines logged:\n%s", i+1, len(lines), log.String())
			}
			line := lines[i]
			for _, want := range []string{"transport=grpc", "route=/" + tc.method + " ", "panic=\"" + tc.panicked + "\"", "stack=", `\npanic({`} {
				if !strings.Contains(line, want) {
					t.Errorf("the log line lacks %s: %s", want, line)
				}
			}
			if has := strings.Contains(line, "function="); has != (tc.model != "") || tc.model != "" && !strings.HasSuffix(line, " function="+tc.model) {
				t.Errorf("the log line should name model %q: %s", tc.model, line)
			}
		})
	}
	if got := [2]float64{testkit.Panics(t, reg, "grpc"), testkit.Panics(t, reg, "http")}; got != [2]float64{5, 0} {
		t.Errorf("plover_panics_total after 5 panics over gRPC: grpc, http %v, want 5, 0", got)
	}
	// The infers, a function's requests, are 500s in plover_requests_total
	// too (under _unknown: m has no series of its own); the others are not.
	if n, _ := testkit.Counter(t, reg, "plover_requests_total", map[string]string{"function": "_unknown", "code": "500"}); n != 2 {
		t.Errorf(`plover_requests_total{function="_unknown",code="500"} %v, want 2 (the infers)`, n)
	}
}

// panicTokens is a token table with a bug: looking a token up panics.
type panicTokens struct{}

func (panicTokens) Lookup([]byte) *auth.Principal { panic("a bug in Lookup") }

// The tap, which checks a call's token on its headers before any
// interceptor, in the connection's own goroutine, is recovered too: the
// call is answered Internal, the panic logged, and the connection serves
// the next call.
func TestTapPanicIsAnsweredInternal(t *testing.T) {
	var log testkit.LogBuffer
	door := frontdoor.New(frontdoor.Config{Runner: testkit.PanicRunner{}, Gate: gate.New(panicTokens{}, nil),
		Log: slog.New(slog.NewTextHandler(&log, nil))})
	gs := grpcapi.New(door, grpcapi.Options{}).GRPC()
	conn := dial(t, gs)
	c, ctx := pb.NewGRPCInferenceServiceClient(conn), ctxT(t)
	_, err := c.ModelMetadata(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer some-token"), &pb.ModelMetadataRequest{Name: "m"})
	if st, _ := status.FromError(err); st.Code() != codes.Internal || st.Message() != frontdoor.PanicMessage {
		t.Fatalf("ModelMetadata, its token's lookup panicking: %v, want Internal: %s", err, frontdoor.PanicMessage)
	}
	if r, err := c.ServerLive(ctx, &pb.ServerLiveRequest{}); err != nil || !r.Live {
		t.Fatalf("the next call, ServerLive (no token): %v %v", r, err)
	}
	lines := testkit.PanicLines(log.String())
	if len(lines) != 1 || !strings.Contains(lines[0], `panic="a bug in Lookup"`) || !strings.Contains(lines[0], "route=/inference.GRPCInferenceService/ModelMetadata ") {
		t.Fatalf("want one line about the tap's panic:\n%s", log.String())
	}
}
