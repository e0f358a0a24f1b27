package grpcapi_test

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/gate"
	"github.com/plover-run/plover/grpcapi"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/oip"
)

// bigSize is the tensor of the I/O tests: a 4 MiB body and answer.
const bigSize = 4 << 20

// serveBig serves, over gRPC behind tokens (nil: none), big (echo_exact of
// up to bigSize bytes), pbig (a pipeline of big) and small (echo), with the
// engine's metrics in the fixture's registry.
func serveBig(t *testing.T, tokens gate.Tokens) *fixture {
	return serveBigOpts(t, tokens, grpcapi.Options{})
}

// serveBigOpts is serveBig with more of the server's options.
func serveBigOpts(t *testing.T, tokens gate.Tokens, opts grpcapi.Options) *fixture {
	t.Helper()
	e := testkit.Engine(t, engine.Config{})
	m := testkit.Manifest("big")
	m.MaxInputBytes, m.OutBytes = bigSize, bigSize
	m.ZeroOut = new(bool)
	m.Chain = []abi.Launch{{Kernel: "echo_exact", Grid: 1, Block: 256}}
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	testkit.Deploy(t, e, testkit.PipelineDir(t, "pbig", "big"))
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("small"), nil))
	f := serveEngine(t, e, tokens, opts)
	f.reg.MustRegister(e.Collector())
	return f
}

// inferRaw calls model with one raw UINT8 input and wants it back.
func inferRaw(t *testing.T, f *fixture, model string, in []byte) {
	t.Helper()
	r, err := f.client.ModelInfer(ctxT(t), &pb.ModelInferRequest{ModelName: model,
		Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{int64(len(in))}}},
		RawInputContents: [][]byte{in}}, grpc.MaxCallRecvMsgSize(2*bigSize), grpc.MaxCallSendMsgSize(2*bigSize))
	if err != nil {
		t.Fatalf("ModelInfer %s: %v", model, err)
	}
	if out := r.GetRawOutputContents(); len(out) != 1 || !bytes.Equal(out[0][:len(in)], in) {
		t.Fatalf("ModelInfer %s: the answer is not the input back", model)
	}
}

// A large call puts its connection in its function's I/O turns; a small
// one does not, and a small one to another function takes it out. Calls go on through the turns whole (the 4 MiB answers,
// read ahead while the flow is alone), a small function's too.
func TestALargeCallPutsItsConnectionInTurns(t *testing.T) {
	f := serveBig(t, nil)
	small := bytes.Repeat([]byte{3}, 100)
	inferRaw(t, f, "small", small)
	if got := grpcapi.ConnFlows(f.srv); !slices.Equal(got, []string{""}) {
		t.Fatalf("after a small call the connections move in %q, want one in none", got)
	}
	big := make([]byte, bigSize)
	for i := range big {
		big[i] = byte(i * 7)
	}
	inferRaw(t, f, "big", big[:1<<20])
	if got := grpcapi.ConnFlows(f.srv); !slices.Equal(got, []string{"big"}) {
		t.Fatalf("after a 1 MiB call the connections move in %q, want one in big's turns", got)
	}
	for range 3 {
		inferRaw(t, f, "big", big)
		inferRaw(t, f, "small", small)
	}
	if got := grpcapi.ConnFlows(f.srv); !slices.Equal(got, []string{""}) {
		t.Fatalf("after a small call to another function the connections move in %q, want one in none", got)
	}
	inferRaw(t, f, "pbig", big[:bigSize/2])
	if got := grpcapi.ConnFlows(f.srv); !slices.Equal(got, []string{"pbig"}) {
		t.Fatalf("after a pipeline's large call the connections move in %q, want the pipeline's turns", got)
	}
}

// The server's time on a gRPC call's bytes (decoding its message and laying
// its tensors out, cutting and encoding its answer) is its function's
// io_seconds, as HTTP's decoding and encoding are: in the function's info
// (plover ls -o wide's IO) and in plover_io_seconds_total; a pipeline's under
// its own name.
func TestInferChargesIOSeconds(t *testing.T) {
	f := serveBig(t, nil)
	in := bytes.Repeat([]byte("plover"), bigSize/6)
	for _, model := range []string{"big", "pbig"} {
		t.Run(model, func(t *testing.T) {
			inferRaw(t, f, model, in)
			// The answer's encoding is charged before gRPC-Go writes it,
			// so before the client has it; polled, bounded, all the same.
			var info, metric float64
			for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
				fi, err := f.e.Control().Function(context.Background(), model)
				if err != nil {
					t.Fatal(err)
				}
				info = fi.IOSeconds
				metric = ioSecondsOf(t, f.reg, model)
				if info > 0 && metric > 0 {
					return
				}
			}
			t.Fatalf("after a %d-byte call over gRPC, %s's io_seconds is %v and plover_io_seconds_total %v: want the server's time on its bytes counted", len(in), model, info, metric)
		})
	}
}

// A call's message is decoded before its token is checked for its model
// (gRPC-Go decodes before any interceptor): what that cost is charged only
// once the call is admitted, so a token that may not call a function
// cannot charge it (its io_seconds, its device share) with large messages.
func TestRefusedInferChargesNoOne(t *testing.T) {
	f := serveBig(t, table{"small-only": {Name: "small-only", Scopes: auth.Invoke, Functions: []string{"small"}}})
	ctx := metadata.AppendToOutgoingContext(ctxT(t), "authorization", "Bearer small-only")
	_, err := f.client.ModelInfer(ctx, &pb.ModelInferRequest{ModelName: "big",
		Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{bigSize}}},
		RawInputContents: [][]byte{make([]byte, bigSize)}}, grpc.MaxCallSendMsgSize(2*bigSize))
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("big with a token for small alone: %v, want PermissionDenied", err)
	}
	if s := ioSecondsOf(t, f.reg, "big"); s != 0 {
		t.Fatalf("a call refused big's token check charged big %v s of I/O", s)
	}
}

// A connection stayed in a function's turns until a call to another
// function was admitted: calls refused before admission (an unknown
// model, a token's refusal, a bad id) were read in the turns of the
// function the client had called once, large, and charged to it (a
// review's finding). A refused call now takes its connection out.
func TestARefusedCallTakesItsConnectionOutOfTurns(t *testing.T) {
	for _, tc := range []struct {
		name string
		req  func() *pb.ModelInferRequest
		code codes.Code
	}{
		{"unknown model", func() *pb.ModelInferRequest { return rawCall("nosuch", bigSize) }, codes.NotFound},
		{"not the token's", func() *pb.ModelInferRequest { return rawCall("small", bigSize) }, codes.PermissionDenied},
		{"an id over its bound", func() *pb.ModelInferRequest {
			r := rawCall("big", bigSize)
			r.Id = strings.Repeat("i", oip.MaxID+1)
			return r
		}, codes.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// nosuch is the token's, not the store's.
			f := serveBig(t, table{"big-only": {Name: "big-only", Scopes: auth.Invoke, Functions: []string{"big", "nosuch"}}})
			ctx := metadata.AppendToOutgoingContext(ctxT(t), "authorization", "Bearer big-only")
			call := func(r *pb.ModelInferRequest) error {
				_, err := f.client.ModelInfer(ctx, r, grpc.MaxCallSendMsgSize(2*bigSize), grpc.MaxCallRecvMsgSize(2*bigSize))
				return err
			}
			if err := call(rawCall("big", bigSize)); err != nil {
				t.Fatal(err)
			}
			if got := grpcapi.ConnFlows(f.srv); !slices.Equal(got, []string{"big"}) {
				t.Fatalf("after a large call to big the connections move in %q, want one in big's turns", got)
			}
			// The first refused call's message is read before it is
			// refused, in big's turns: the ones after it are not.
			if err := call(tc.req()); status.Code(err) != tc.code {
				t.Fatalf("%v, want %v", err, tc.code)
			}
			if got := grpcapi.ConnFlows(f.srv); !slices.Equal(got, []string{""}) {
				t.Fatalf("after a refused call the connections move in %q, want one in none", got)
			}
			before := ioSecondsOf(t, f.reg, "big")
			for range 5 {
				if err := call(tc.req()); status.Code(err) != tc.code {
					t.Fatalf("%v, want %v", err, tc.code)
				}
			}
			if after := ioSecondsOf(t, f.reg, "big"); after != before {
				t.Fatalf("5 refused calls of %d bytes charged big %.6f s of I/O", bigSize, after-before)
			}
		})
	}
}

// rawCall is a call to model with one raw UINT8 input of n bytes.
func rawCall(model string, n int) *pb.ModelInferRequest {
	return &pb.ModelInferRequest{ModelName: model,
		Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{int64(n)}}},
		RawInputContents: [][]byte{make([]byte, n)}}
}

// ioSecondsOf is plover_io_seconds_total{function=name} as reg gathers it.
func ioSecondsOf(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	return counterValue(t, reg, "plover_io_seconds_total", map[string]string{"function": name})
}

// A gRPC call touches its function's I/O flow, as an HTTP request does: a
// light function's small call is about, so another function's piece moves
// beside it (a turn of Config.Piece bytes), not as though it had the
// server's I/O to itself (alonePieces of them). A touch counts for the I/O
// scheduler's Recent (sched.DefaultRecent): tried until one turn begins within it.
func TestInferTouchesItsFlow(t *testing.T) {
	f := serveBig(t, nil)
	other := f.e.IO("big")
	alone := func() int {
		tn, err := other.Turn(context.Background(), time.Now().Add(10*time.Second), nil, false)
		if err != nil {
			t.Fatal(err)
		}
		defer tn.Done()
		return tn.Piece()
	}
	full := alone()
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); {
		inferRaw(t, f, "small", []byte{1, 2, 3})
		if alone() < full {
			return
		}
	}
	t.Fatalf("big's turns are of %d bytes after small's calls over gRPC, as though big had the server's I/O to itself: small's calls touch no flow", full)
}
