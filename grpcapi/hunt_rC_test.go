package grpcapi_test

// Bug hunt (branch rC): each test here demonstrates a defect and fails on
// the code it was written against.

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/grpcapi"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
	"github.com/plover-run/plover/internal/testkit"
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

// A token's concurrency bounds its requests on the server over HTTP until
// each handler returns (a client that hangs up mid-run keeps its place
// while the server still runs it). Over gRPC the place is given back the
// moment the client cancels (the tap's context.AfterFunc on the stream),
// while the server goes on running the call: a token limited to 1 has a
// second call admitted while its first still holds an instance.
func TestHuntCancelledCallGivesBackConcurrencyWhileStillRunning(t *testing.T) {
	f := serve(t, table{"one": {Name: "one", Scopes: auth.Invoke, Functions: []string{"*"}, Limits: auth.Limits{Concurrency: 1}}})
	infer := func(model string) *pb.ModelInferRequest {
		return &pb.ModelInferRequest{ModelName: model, Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{1}}},
			RawInputContents: [][]byte{{1}}}
	}
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer one"))
	done := make(chan error, 1)
	go func() { _, err := f.client.ModelInfer(ctx, infer("slow")); done <- err }() // slow runs 2 s
	testkit.WaitFor(t, f.e, "slow", "its run to start", testkit.Busy(1, 0))
	cancel()
	if err := <-done; status.Code(err) != codes.Canceled {
		t.Fatalf("the cancelled call: %v", err)
	}
	// The server learns of the cancel a moment after the client returns:
	// call again until the first call's run ends (slow idle again).
	for {
		_, err := f.client.ModelInfer(metadata.AppendToOutgoingContext(ctxT(t), "authorization", "Bearer one"), infer("echo"))
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

// Typed contents are laid out (layInputs appends every element, at its
// datatype's width) before anything compares the input with the
// function's max_input_bytes, which only the engine checks, after: a 4 MiB
// message of int64_contents zeroes (one byte each on the wire) makes the
// server build a 32 MiB input, through append's doublings, for a function
// that takes at most 1 KiB, and refuse it only then. HTTP bounds a body by
// the function's max_input_bytes before reading it (inputLimit). The
// measure is the server's allocations (it runs in this process) beyond
// what protobuf's decoding of the message itself costs (a []int64: 32 MiB).
func TestHuntTypedInputBuiltBeforeMaxInputCheck(t *testing.T) {
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
