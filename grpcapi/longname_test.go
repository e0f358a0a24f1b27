package grpcapi_test

import (
	"runtime"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/plover-run/plover/abi"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
	"github.com/plover-run/plover/internal/testkit"
)

// A model name may be as long as the body limit (256 MiB by default). One
// no function has is answered NotFound at a cost of a few copies of it,
// not a did-you-mean table of len(name) ints per function name (a 2 MiB
// name allocated 1.5 GB), and the message quotes its head only.
func TestLongModelNameRefusedInBoundedMemory(t *testing.T) {
	f := serve(t, nil) // echo, typed, slow
	testkit.Deploy(t, f.e, testkit.BundleDir(t, testkit.Manifest(strings.Repeat("q", abi.MaxNameLen)), nil))
	name := strings.Repeat("q", 1<<20)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := f.client.ModelMetadata(ctxT(t), &pb.ModelMetadataRequest{Name: name})
	runtime.ReadMemStats(&after)
	st := status.Convert(err)
	if st.Code() != codes.NotFound || !strings.Contains(st.Message(), `"`+name[:64]+`"...`) ||
		len(st.Message()) > 256 || strings.Contains(st.Message(), "did you mean") {
		t.Errorf("ModelMetadata(1 MiB name): %v %.200q, want NotFound quoting its first 64 bytes, no suggestion", st.Code(), st.Message())
	}
	// The client's message, the server's read of it and the name decoded
	// and kept for the error: a few MiB of the process's (client and
	// server) allocation, with room for what runs beside.
	n := after.TotalAlloc - before.TotalAlloc
	t.Logf("a 1 MiB name: %d KiB allocated", n>>10)
	if n > 32<<20 {
		t.Errorf("a 1 MiB name allocated %d MiB", n>>20)
	}
}

// A model_version, or a shape, may be as long as the body limit too: one
// of 1 MiB (a version of control bytes, each quoted as four; a shape of
// 1,048,576 dimensions) was echoed whole into the error, copied several
// times over (97 MB and 65 MB allocated; a review's probe). The message
// quotes a version's head, and a shape's first 8 dimensions and a count.
func TestLongFieldsRefusedInBoundedMemory(t *testing.T) {
	f := serve(t, nil) // echo, typed, slow
	version := strings.Repeat("\x01", 1<<20)
	raw := func(name, model, version string, shape []int64, contents []byte) *pb.ModelInferRequest {
		return &pb.ModelInferRequest{ModelName: model, ModelVersion: version,
			Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: name, Datatype: "UINT8", Shape: shape}},
			RawInputContents: [][]byte{contents}}
	}
	dims := make([]int64, 1<<20)
	typed := &pb.ModelInferRequest{ModelName: "typed",
		Inputs: []*pb.ModelInferRequest_InferInputTensor{
			{Name: "x", Datatype: "FP32", Shape: []int64{2, 2}}, {Name: "y", Datatype: "INT16", Shape: dims}},
		RawInputContents: [][]byte{make([]byte, 16), make([]byte, 2)}}
	for _, tc := range []struct {
		name string
		call func() error
		code codes.Code
		says string
	}{
		{"ModelInfer naming a 1 MiB version", func() error {
			_, err := f.client.ModelInfer(ctxT(t), raw("INPUT0", "echo", version, []int64{1}, []byte{1}))
			return err
		}, codes.NotFound, `\x01\x01`},
		{"ModelMetadata naming a 1 MiB version", func() error {
			_, err := f.client.ModelMetadata(ctxT(t), &pb.ModelMetadataRequest{Name: "echo", Version: version})
			return err
		}, codes.NotFound, `\x01\x01`},
		// The answer echoes the id: one near the send limit made an
		// answer past it, refused after the function ran.
		{"ModelInfer with a 1 MiB id", func() error {
			req := raw("INPUT0", "echo", "", []int64{1}, []byte{1})
			req.Id = strings.Repeat("i", 1<<20)
			_, err := f.client.ModelInfer(ctxT(t), req)
			return err
		}, codes.InvalidArgument, "id: 1048576 bytes"},
		{"a shape of 1,048,576 dimensions", func() error {
			_, err := f.client.ModelInfer(ctxT(t), typed)
			return err
		}, codes.InvalidArgument, "and 1048568 more"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			err := tc.call()
			runtime.ReadMemStats(&after)
			st := status.Convert(err)
			if st.Code() != tc.code || !strings.Contains(st.Message(), tc.says) || len(st.Message()) > 1024 {
				t.Errorf("%v, a message of %d bytes: %.300q; want %v saying %q in under 1 KiB", st.Code(), len(st.Message()), st.Message(), tc.code, tc.says)
			}
			// The client's message and the server's decoding of it: a
			// few copies of 1-8 MiB, with room for what runs beside.
			if n := after.TotalAlloc - before.TotalAlloc; n > 48<<20 {
				t.Errorf("allocated %d MiB", n>>20)
			}
		})
	}
}
