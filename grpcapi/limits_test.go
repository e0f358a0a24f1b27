package grpcapi_test

import (
	"context"
	"io"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/grpcapi"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
	"github.com/plover-run/plover/internal/testkit"
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

// A request message over --max-body is refused as HTTP refuses a body over
// it (413 too_large): InvalidArgument naming the size, the limit and the
// flag, counted as echo's refused request. It was gRPC-Go's own
// ResourceExhausted (the class of a busy server: retry), naming neither;
// that remains for a message more than 64 KiB over, which gRPC-Go refuses
// from its length before reading it.
func TestRequestOverMessageLimit(t *testing.T) {
	const limit = 4096
	f := serveOpts(t, nil, grpcapi.Options{MaxMessageBytes: limit})
	sized := func(size int) *pb.ModelInferRequest { // a raw echo request of size bytes
		for n := size; ; n-- {
			req := oneByte("echo")
			req.Inputs[0].Shape[0], req.RawInputContents[0] = int64(n), make([]byte, n)
			if proto.Size(req) == size {
				return req
			}
		}
	}
	for _, tc := range []struct {
		name string
		size int
		code codes.Code
		msg  string
	}{
		{"at the limit", limit, codes.OK, ""},
		{"a byte over", limit + 1, codes.InvalidArgument, "model echo: request message of 4097 bytes is over the server's limit of 4096 bytes (plover serve --max-body)"},
		{"64 KiB over", limit + 64<<10, codes.InvalidArgument, "request message of 69632 bytes is over the server's limit of 4096 bytes (plover serve --max-body)"},
		{"past what is read", limit + 64<<10 + 1, codes.ResourceExhausted, "grpc: received message larger than max"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.client.ModelInfer(ctxT(t), sized(tc.size))
			if st, _ := status.FromError(err); st.Code() != tc.code || !strings.Contains(st.Message(), tc.msg) {
				t.Fatalf("%v, want %v with %q", err, tc.code, tc.msg)
			}
		})
	}
	if got := testutil.ToFloat64(counter(t, f.reg, "echo", "413")); got != 2 {
		t.Errorf("echo's requests counted as 413: %v, want 2", got)
	}
}

// oneByte is a one-byte raw call to model.
func oneByte(model string) *pb.ModelInferRequest {
	return &pb.ModelInferRequest{ModelName: model, Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{1}}},
		RawInputContents: [][]byte{{1}}}
}

// withToken is ctx carrying tok in the authorization metadata.
func withToken(ctx context.Context, tok string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
}

// A token's place in its concurrency is held until the server's handler
// returns, as over HTTP (a client that hangs up mid-run keeps its place
// while the server runs its request): a client that cancels a call must
// not free its place while the server still runs it (it did, as soon as
// the stream's context ended, and a token limited to 1 had a second call
// admitted beside its first).
func TestCancelledCallKeepsItsPlaceWhileItRuns(t *testing.T) {
	f := serve(t, table{"one": {Name: "one", Scopes: auth.Invoke, Functions: []string{"*"}, Limits: auth.Limits{Concurrency: 1}}})
	ctx, cancel := context.WithCancel(withToken(context.Background(), "one"))
	done := make(chan error, 1)
	go func() { _, err := f.client.ModelInfer(ctx, oneByte("slow")); done <- err }() // slow runs 2 s
	testkit.WaitFor(t, f.e, "slow", "its run to start", testkit.Busy(1, 0))
	cancel()
	if err := <-done; status.Code(err) != codes.Canceled {
		t.Fatalf("the cancelled call: %v", err)
	}
	// The server learns of the cancel a moment after the client returns:
	// call again until the first call's run ends (slow idle again).
	again := withToken(ctxT(t), "one")
	for {
		_, err := f.client.ModelInfer(again, oneByte("echo"))
		fi, _ := f.e.Control().Function(context.Background(), "slow")
		if fi.Busy == 0 {
			return // the first call's run ended before any call was admitted
		}
		if err == nil {
			t.Fatalf("token with concurrency 1: a second call was admitted while its cancelled first call still runs on the server (slow busy %d)", fi.Busy)
		}
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("second call: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// rawCodec sends a []byte as the message itself: a malformed message, which
// the server fails to decode before any handler runs.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error)   { return v.([]byte), nil }
func (rawCodec) Unmarshal(_ []byte, _ any) error { return nil }
func (rawCodec) Name() string                    { return "proto" }

// Every way a call can end gives its place in the token's concurrency back
// once, and only once: after each of calls cancelled before their message,
// ended by the read timeout, malformed, over the message limit, refused by
// their handler (five times each), and cancelled while running and while
// queued (twice), the token has all its places, and no more.
func TestEndedCallsGiveTheirPlacesBack(t *testing.T) {
	const places = 3
	f := serveOpts(t, table{"three": {Name: "three", Scopes: auth.Invoke, Functions: []string{"*"}, Limits: auth.Limits{Concurrency: places}}},
		grpcapi.Options{ReadTimeout: 300 * time.Millisecond, MaxMessageBytes: 4096})
	ctx := withToken(ctxT(t), "three")
	// hold starts calls that send their headers (the tap takes their
	// places) and not yet their messages; ServerLive after them on the
	// one connection returns once the server has read their headers.
	hold := func(ctx context.Context) []grpc.ClientStream {
		var cs []grpc.ClientStream
		for range places {
			s, err := f.conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, pb.GRPCInferenceService_ModelInfer_FullMethodName)
			if err != nil {
				t.Fatal(err)
			}
			cs = append(cs, s)
		}
		if _, err := f.client.ServerLive(ctx, &pb.ServerLiveRequest{}); err != nil {
			t.Fatal(err)
		}
		return cs
	}
	// allBack waits until the token's full set of places is admitted at
	// once, and no call beside them; the server sees a call's end a moment
	// after its client does (until then a held call may be refused, and
	// the call beside them take a place freed since).
	allBack := func(after string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			held := hold(ctx)
			_, err := f.client.ModelInfer(ctx, oneByte("echo"))
			extra := err == nil
			if st, _ := status.FromError(err); !extra && (st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "concurrency")) {
				t.Fatalf("after %s: a call beside %d held ones: %v, want ResourceExhausted (concurrency)", after, places, err)
			}
			admitted := 0
			for _, cs := range held {
				err := cs.SendMsg(oneByte("echo"))
				if err == nil {
					cs.CloseSend()
				}
				if err == nil || err == io.EOF { // EOF: ended by the server, which RecvMsg says why
					err = cs.RecvMsg(&pb.ModelInferResponse{})
				}
				if err == nil {
					admitted++
				} else if status.Code(err) != codes.ResourceExhausted {
					t.Fatalf("after %s: a held call: %v", after, err)
				}
			}
			if admitted == places && extra {
				t.Fatalf("after %s: a call beside %d held ones was admitted: a place was given back twice", after, places)
			}
			if admitted == places {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("after %s: %d of %d concurrent calls admitted 10 s on: places leaked", after, admitted, places)
			}
		}
	}
	want := func(what string, err error, codes ...codes.Code) {
		t.Helper()
		for _, c := range codes {
			if status.Code(err) == c {
				return
			}
		}
		t.Fatalf("%s: %v, want %v", what, err, codes)
	}
	big := oneByte("echo")
	big.Inputs[0].Shape[0], big.RawInputContents[0] = 1<<20, make([]byte, 1<<20)
	for _, tc := range []struct {
		name string
		reps int
		end  func()
	}{
		{"calls cancelled before their messages", 5, func() {
			c, cancel := context.WithCancel(ctx)
			held := hold(c)
			cancel()
			for _, cs := range held {
				want("cancelled before its message", cs.RecvMsg(&pb.ModelInferResponse{}), codes.Canceled)
			}
		}},
		{"calls ended by the read timeout", 5, func() {
			for _, cs := range hold(ctx) {
				want("ended by the read timeout", cs.RecvMsg(&pb.ModelInferResponse{}), codes.Canceled, codes.DeadlineExceeded)
			}
		}},
		{"a malformed message", 5, func() {
			err := f.conn.Invoke(ctx, pb.GRPCInferenceService_ModelInfer_FullMethodName, []byte{0xff}, new([]byte), grpc.ForceCodec(rawCodec{}))
			want("malformed", err, codes.InvalidArgument)
		}},
		{"a message over gRPC-Go's receive limit", 5, func() {
			_, err := f.client.ModelInfer(ctx, big)
			want("over the receive limit", err, codes.ResourceExhausted)
		}},
		{"a call its handler refused", 5, func() {
			_, err := f.client.ModelInfer(ctx, oneByte("nosuch"))
			want("refused by its handler", err, codes.NotFound)
		}},
		// slow runs on for its 2 s after its calls are cancelled: twice only.
		{"calls cancelled while one runs and one queues", 2, func() {
			c, cancel := context.WithCancel(ctx)
			done := make(chan error, 2)
			go func() { _, err := f.client.ModelInfer(c, oneByte("slow")); done <- err }()
			testkit.WaitFor(t, f.e, "slow", "a call running", testkit.Busy(1, 0))
			go func() { _, err := f.client.ModelInfer(c, oneByte("slow")); done <- err }()
			testkit.WaitFor(t, f.e, "slow", "a call queued", testkit.Busy(1, 1))
			cancel()
			want("cancelled while it runs or queues", <-done, codes.Canceled)
			want("cancelled while it runs or queues", <-done, codes.Canceled)
			testkit.WaitFor(t, f.e, "slow", "its calls ended", testkit.Busy(0, 0))
		}},
	} {
		for range tc.reps {
			tc.end()
			allBack(tc.name)
		}
	}
}

// Inputs past the model's max_input_bytes are refused (InvalidArgument,
// too_large: 413 in the metrics, as over HTTP) naming the input that
// passes it and the limit, before any is laid out; at the limit they run.
func TestInputsOverMaxInputBytes(t *testing.T) {
	f := serve(t, nil)
	// typed takes 64 KiB: x FP32 [2,2] (16 bytes), then y INT16 [-1].
	const fit = (1<<16 - 16) / 2 // y's elements at the limit
	x := fp32(1, 2, 3, 4)
	typedReq := func(n int) *pb.ModelInferRequest {
		return &pb.ModelInferRequest{ModelName: "typed", Inputs: []*pb.ModelInferRequest_InferInputTensor{
			{Name: "x", Datatype: "FP32", Shape: []int64{2, 2}, Contents: &pb.InferTensorContents{Fp32Contents: []float32{1, 2, 3, 4}}},
			{Name: "y", Datatype: "INT16", Shape: []int64{int64(n)}, Contents: &pb.InferTensorContents{IntContents: make([]int32, n)}}}}
	}
	rawReq := func(n int) *pb.ModelInferRequest {
		return &pb.ModelInferRequest{ModelName: "typed", Inputs: []*pb.ModelInferRequest_InferInputTensor{
			{Name: "x", Datatype: "FP32", Shape: []int64{2, 2}}, {Name: "y", Datatype: "INT16", Shape: []int64{int64(n)}}},
			RawInputContents: [][]byte{x, make([]byte, 2*n)}}
	}
	huge := rawReq(1)
	huge.Inputs[1].Shape[0] = 1 << 62
	one := oneByte("echo") // echo takes 64 KiB too
	one.Inputs[0].Shape[0], one.RawInputContents[0] = 1<<16+1, make([]byte, 1<<16+1)
	for _, tc := range []struct {
		name string
		req  *pb.ModelInferRequest
		msg  string // "": runs
	}{
		{"typed at the limit", typedReq(fit), ""},
		{"typed, the second input past it", typedReq(fit + 1), `input "y" (shape [32761] of INT16) brings the inputs to 65538 bytes; model typed takes at most 65536 (max_input_bytes)`},
		{"raw at the limit", rawReq(fit), ""},
		{"raw, the second input past it", rawReq(fit + 1), `input "y" (shape [32761] of INT16) brings the inputs to 65538 bytes; model typed takes at most 65536 (max_input_bytes)`},
		{"a single raw input past it", one, `input "INPUT0" (shape [65537] of UINT8) brings the inputs to 65537 bytes; model echo takes at most 65536`},
		// Its byte size past int64: as large, not malformed (a 400 before).
		{"a shape whose size overflows", huge, `input "y": shape [4611686018427387904] of INT16: its byte size overflows an int64`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.client.ModelInfer(ctxT(t), tc.req)
			if tc.msg == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tc.msg) {
				t.Fatalf("%v, want InvalidArgument with %q", err, tc.msg)
			}
		})
	}
	if got := testutil.ToFloat64(counter(t, f.reg, "typed", "413")); got != 3 {
		t.Errorf("typed's requests counted as 413: %v, want 3", got)
	}
}

// A typed input past max_input_bytes is refused before it is laid out:
// a 4 MiB message of int64_contents zeroes (one byte each on the wire)
// made the server build a 32 MiB input, through append's doublings, for a
// function that takes at most 1 KiB, and refuse it only then. The measure
// is the allocations (client and server run in this process) beyond what
// protobuf's decoding of the message itself costs (a []int64: 32 MiB).
func TestTypedInputOverMaxInputIsNotLaidOut(t *testing.T) {
	f := serve(t, nil)
	m := testkit.Manifest("small")
	m.MaxInputBytes = 1 << 10
	m.Tensors = &abi.Tensors{Inputs: []abi.Tensor{{Name: "x", Datatype: "INT64", Shape: []int64{-1}}}, Outputs: abi.RawTensors.Outputs}
	testkit.Deploy(t, f.e, testkit.BundleDir(t, m, nil))
	const n = 4 << 20
	req := &pb.ModelInferRequest{ModelName: "small", Inputs: []*pb.ModelInferRequest_InferInputTensor{
		{Name: "x", Datatype: "INT64", Shape: []int64{n}, Contents: &pb.InferTensorContents{Int64Contents: make([]int64, n)}}}}
	call := func() error { _, err := f.client.ModelInfer(ctxT(t), req); return err }
	if err := call(); status.Code(err) != codes.InvalidArgument { // warm: connection, pools
		t.Fatalf("%v, want InvalidArgument (too large)", err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	err := call()
	runtime.ReadMemStats(&after)
	if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "at most 1024") {
		t.Fatalf("%v, want InvalidArgument naming max_input_bytes", err)
	}
	decoded := uint64(n * 8) // the []int64 protobuf decodes the message into
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > decoded+decoded/2+8<<20 {
		t.Errorf("refusing a %d-element INT64 input to a function taking 1 KiB allocated %d MiB (client and server); protobuf's own decoding is %d MiB: the input was laid out before its size was checked",
			n, alloc>>20, decoded>>20)
	}
}
