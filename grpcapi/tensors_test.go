package grpcapi_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/plover-run/plover/grpcapi/inferencepb"
)

// A typed input whose contents hold elements in a field other than its
// datatype's is refused, naming the input and the field, even when its own
// field's count is right: only that field is laid out, so the others'
// elements were dropped unannounced.
func TestTypedContentsInAnotherFieldAreRefused(t *testing.T) {
	f := serve(t, nil)
	echo := func(c *pb.InferTensorContents) *pb.ModelInferRequest {
		return &pb.ModelInferRequest{ModelName: "echo", Inputs: []*pb.ModelInferRequest_InferInputTensor{
			{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{2}, Contents: c}}}
	}
	typed := func(x, y *pb.InferTensorContents) *pb.ModelInferRequest {
		return &pb.ModelInferRequest{ModelName: "typed", Inputs: []*pb.ModelInferRequest_InferInputTensor{
			{Name: "x", Datatype: "FP32", Shape: []int64{2, 2}, Contents: x},
			{Name: "y", Datatype: "INT16", Shape: []int64{1}, Contents: y}}}
	}
	four := &pb.InferTensorContents{Fp32Contents: []float32{1, 2, 3, 4}}
	for _, tc := range []struct {
		name string
		req  *pb.ModelInferRequest
		code codes.Code
		msg  string // in the message; "" for OK
	}{
		{"its own field alone", echo(&pb.InferTensorContents{UintContents: []uint32{1, 2}}), codes.OK, ""},
		{"fp64 beside a right uint count", echo(&pb.InferTensorContents{UintContents: []uint32{1, 2}, Fp64Contents: []float64{9, 9, 9}}),
			codes.InvalidArgument, `input "INPUT0": contents hold 3 elements in fp64_contents, not the field for UINT8 (uint_contents)`},
		{"bool beside a right uint count", echo(&pb.InferTensorContents{UintContents: []uint32{1, 2}, BoolContents: []bool{true}}),
			codes.InvalidArgument, `input "INPUT0": contents hold 1 elements in bool_contents, not the field for UINT8 (uint_contents)`},
		{"uint64 beside a right uint count", echo(&pb.InferTensorContents{UintContents: []uint32{1, 2}, Uint64Contents: []uint64{7}}),
			codes.InvalidArgument, `input "INPUT0": contents hold 1 elements in uint64_contents, not the field for UINT8 (uint_contents)`},
		{"bytes beside a right uint count", echo(&pb.InferTensorContents{UintContents: []uint32{1, 2}, BytesContents: [][]byte{[]byte("x")}}),
			codes.InvalidArgument, `input "INPUT0": contents hold 1 elements in bytes_contents, not the field for UINT8 (uint_contents)`},
		{"the second input's stray field", typed(four, &pb.InferTensorContents{IntContents: []int32{5}, Int64Contents: []int64{5}}),
			codes.InvalidArgument, `input "y": contents hold 1 elements in int64_contents, not the field for INT16 (int_contents)`},
		{"fp64 beside a right fp32 count", typed(&pb.InferTensorContents{Fp32Contents: []float32{1, 2, 3, 4}, Fp64Contents: []float64{1}}, &pb.InferTensorContents{IntContents: []int32{5}}),
			codes.InvalidArgument, `input "x": contents hold 1 elements in fp64_contents, not the field for FP32 (fp32_contents)`},
		// A wrong count with a stray field still says where the elements went.
		{"stray field and no elements of its own", echo(&pb.InferTensorContents{IntContents: []int32{1, 2}}),
			codes.InvalidArgument, `input "INPUT0": contents hold 0 elements in uint_contents, the field for UINT8; the shape holds 2 (int_contents holds 2, not the field for UINT8)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			_, err := f.client.ModelInfer(ctx, tc.req)
			st, _ := status.FromError(err)
			if st.Code() != tc.code || !strings.Contains(st.Message(), tc.msg) {
				t.Fatalf("%v %q, want %v with %q", st.Code(), st.Message(), tc.code, tc.msg)
			}
		})
	}
}
