package grpcapi_test

// Bug hunt (branch rC): each test here demonstrates a defect and fails on
// the code it was written against.

import (
	"runtime"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/plover-run/plover/abi"
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
