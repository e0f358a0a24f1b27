package grpcapi_test

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/grpcapi"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
)

// A request message made of many small parts decodes to far more than its
// size (an empty input: 2 bytes sent, about 150 in memory; an INT64 zero:
// 1 and 8), and gRPC decodes it whole before any handler: the server checks
// the wire bytes first and refuses, as the client's fault and counted as
// the function's refused request, what would decode past its bounds, with
// the memory the message itself takes and no more. A 4 MiB message of
// empty inputs made the server allocate 308 MiB.
func TestInflatingRequestsAreRefusedBeforeTheyAreDecoded(t *testing.T) {
	const limit = 8 << 20
	f := serveOpts(t, nil, grpcapi.Options{MaxMessageBytes: limit})
	// Within the bounds, typed contents decode and run as before (and
	// typed, known by its success, is counted by name when refused).
	req := &pb.ModelInferRequest{ModelName: "typed", Inputs: []*pb.ModelInferRequest_InferInputTensor{
		{Name: "x", Datatype: "FP32", Shape: []int64{2, 2}, Contents: &pb.InferTensorContents{Fp32Contents: []float32{1, 2, 3, 4}}},
		{Name: "y", Datatype: "INT16", Shape: []int64{2}, Contents: &pb.InferTensorContents{IntContents: []int32{5, 6}}}}}
	if _, err := f.client.ModelInfer(ctxT(t), req); err != nil {
		t.Fatalf("a typed request within the bounds: %v", err)
	}
	head := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "typed")
	repeat := func(field []byte, size int) []byte { // head, then field until size bytes
		b := append([]byte(nil), head...)
		for len(b) < size {
			b = append(b, field...)
		}
		return b
	}
	emptyInput := protowire.AppendVarint(protowire.AppendTag(nil, 5, protowire.BytesType), 0)
	// One input whose contents are 6 MiB of INT64 zeros, packed: 48 MiB laid out.
	zeros := protowire.AppendBytes(protowire.AppendTag(nil, 3, protowire.BytesType), make([]byte, 6<<20))
	contents := protowire.AppendBytes(protowire.AppendTag(nil, 5, protowire.BytesType), zeros)
	int64Input := append(append([]byte(nil), head...), protowire.AppendBytes(protowire.AppendTag(nil, 5, protowire.BytesType), contents)...)
	for _, tc := range []struct {
		name    string
		msg     []byte
		code    codes.Code
		want    string
		counted string
	}{
		{"4 MiB of empty inputs", repeat(emptyInput, 4<<20), codes.InvalidArgument,
			`model "typed": the request message holds more than 16384 tensors, parameters and bytes_contents elements`, "400"},
		{"INT64 zeros widening past the limit", int64Input, codes.InvalidArgument,
			`model "typed": the request's shapes and typed contents come to 50331648 bytes in memory, over the server's limit of 8388608 bytes (plover serve --max-body)`, "413"},
		{"a truncated message", append(append([]byte(nil), head...), 0x2a, 0x10), codes.InvalidArgument,
			`model "typed": the request message is not a valid ModelInferRequest`, "400"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := testutil.ToFloat64(counter(t, f.reg, "typed", tc.counted))
			var m0, m1 runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&m0)
			err := f.conn.Invoke(ctxT(t), pb.GRPCInferenceService_ModelInfer_FullMethodName, tc.msg, new([]byte), grpc.ForceCodec(rawCodec{}))
			runtime.ReadMemStats(&m1)
			if st, _ := status.FromError(err); st.Code() != tc.code || !strings.Contains(st.Message(), tc.want) {
				t.Fatalf("%v, want %v with %q", err, tc.code, tc.want)
			}
			// The message is read and gathered once or twice by gRPC; its
			// decoded form would be 300 MiB and 48 MiB.
			if alloc := m1.TotalAlloc - m0.TotalAlloc; alloc > 4*uint64(len(tc.msg))+(4<<20) {
				t.Errorf("the call allocated %d MiB for a %d KiB message", alloc>>20, len(tc.msg)>>10)
			}
			if got := testutil.ToFloat64(counter(t, f.reg, "typed", tc.counted)) - before; got != 1 {
				t.Errorf("typed's requests counted as %s: %v more, want 1", tc.counted, got)
			}
		})
	}
}

// A refused request whose call ends before its handler runs (a second
// message on a unary call) leaves nothing behind once it is collected: the
// server kept each such refusal for good (20 calls with 1 MiB names held
// 40 MiB after GC, when the name was kept whole).
func TestRefusedCallsEndedEarlyLeaveNothing(t *testing.T) {
	f := serveOpts(t, nil, grpcapi.Options{MaxMessageBytes: 4 << 20})
	msg := append(protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "typed"), 0xff) // malformed after the name
	for range 20 {
		cs, err := f.conn.NewStream(ctxT(t), &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, pb.GRPCInferenceService_ModelInfer_FullMethodName, grpc.ForceCodec(rawCodec{}))
		if err != nil {
			t.Fatal(err)
		}
		cs.SendMsg(msg)
		cs.SendMsg(msg) // a unary call's second message: the call ends before its interceptor
		cs.CloseSend()
		if err := cs.RecvMsg(new([]byte)); status.Code(err) == codes.OK {
			t.Fatal("a unary call with two messages succeeded")
		}
	}
	if n := grpcapi.RefusalsHeld(f.srv); n == 0 {
		t.Fatal("no refusal held before a GC: the calls did not end before their interceptor, and the test shows nothing")
	}
	for deadline := time.Now().Add(10 * time.Second); grpcapi.RefusalsHeld(f.srv) > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("%d refusals of ended calls still held after 10 s of GCs", grpcapi.RefusalsHeld(f.srv))
		}
		runtime.GC()
		time.Sleep(10 * time.Millisecond) // cleanups run after a GC, on a goroutine of their own
	}
}

// A message the wire walk passes but protobuf refuses (a malformed
// parameter entry, a name that is not UTF-8) is the client's fault too:
// InvalidArgument, not gRPC-Go's Internal.
func TestMalformedRequestsAreInvalidArguments(t *testing.T) {
	f := serveOpts(t, nil, grpcapi.Options{})
	head := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "typed")
	for _, tc := range []struct {
		name string
		msg  []byte
	}{
		{"a malformed parameter entry", protowire.AppendBytes(protowire.AppendTag(append([]byte(nil), head...), 4, protowire.BytesType), []byte{0xff})},
		{"a model name not UTF-8", protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), []byte{0xff, 0xfe})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := f.conn.Invoke(ctxT(t), pb.GRPCInferenceService_ModelInfer_FullMethodName, tc.msg, new([]byte), grpc.ForceCodec(rawCodec{}))
			if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "the request message is not a valid ModelInferRequest") {
				t.Fatalf("%v, want InvalidArgument: not a valid ModelInferRequest", err)
			}
		})
	}
}

// A malformed ModelReady or ModelMetadata message is the client's fault,
// InvalidArgument naming the message, as ModelInfer's is: gRPC-Go answers
// a codec's error Internal, a server's fault that an operator's alerts
// watch. The token is still asked first.
func TestMalformedMetadataCallsAreInvalidArgument(t *testing.T) {
	f := serve(t, table{"reader": {Name: "reader", Scopes: auth.Read, Functions: []string{"*"}},
		"cnn-reader": {Name: "cnn-reader", Scopes: auth.Read, Functions: []string{"cnn"}}})
	badUTF8 := []byte{0x0a, 0x02, 0xff, 0xfe} // name: not UTF-8
	cut := []byte{0x0a, 0x05, 'a'}            // name: 5 bytes said, 1 sent
	for _, tc := range []struct {
		method, what string
		msg          []byte
	}{
		{pb.GRPCInferenceService_ModelReady_FullMethodName, "ModelReadyRequest", badUTF8},
		{pb.GRPCInferenceService_ModelReady_FullMethodName, "ModelReadyRequest", cut},
		{pb.GRPCInferenceService_ModelMetadata_FullMethodName, "ModelMetadataRequest", badUTF8},
		{pb.GRPCInferenceService_ModelMetadata_FullMethodName, "ModelMetadataRequest", cut},
	} {
		for _, token := range []string{"reader", "cnn-reader"} { // a token of some functions: not a store-wide 403
			err := f.conn.Invoke(withToken(ctxT(t), token), tc.method, tc.msg, new([]byte), grpc.ForceCodec(rawCodec{}))
			if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "not a valid "+tc.what) {
				t.Errorf("%s with % x, token %s: %v, want InvalidArgument naming %s", tc.method, tc.msg, token, err, tc.what)
			}
		}
		err := f.conn.Invoke(ctxT(t), tc.method, tc.msg, new([]byte), grpc.ForceCodec(rawCodec{}))
		if status.Code(err) != codes.Unauthenticated {
			t.Errorf("%s with % x and no token: %v, want Unauthenticated", tc.method, tc.msg, err)
		}
	}
}
