package grpcapi_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding/gzip"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/plover-run/plover/auth"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
)

// A gzip message is refused before it is inflated, on the methods open
// without a token and on inference alike: 200 KB of gzip inflated to the
// receive limit, 620 MB of the server's memory a call. The same calls
// uncompressed are answered.
func TestCompressedMessagesAreRefused(t *testing.T) {
	f := serve(t, table{"root": {Name: "root", Scopes: auth.Admin}})
	for _, tc := range []struct {
		name string
		call func(opts ...grpc.CallOption) error
	}{
		{"ServerLive, open", func(opts ...grpc.CallOption) error {
			// A field the message does not define, as the attack's: an
			// empty message goes uncompressed whatever the call says.
			req := &pb.ServerLiveRequest{}
			req.ProtoReflect().SetUnknown(protowire.AppendBytes(protowire.AppendTag(nil, 99, protowire.BytesType), make([]byte, 1<<20)))
			_, err := f.client.ServerLive(ctxT(t), req, opts...)
			return err
		}},
		{"ModelInfer", func(opts ...grpc.CallOption) error {
			ctx := metadata.AppendToOutgoingContext(ctxT(t), "authorization", "Bearer root")
			_, err := f.client.ModelInfer(ctx, &pb.ModelInferRequest{ModelName: "echo",
				Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{4}}},
				RawInputContents: [][]byte{make([]byte, 4)}}, opts...)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call(grpc.UseCompressor(gzip.Name))
			if st := status.Convert(err); err == nil || st.Code() != codes.Internal || !strings.Contains(st.Message(), "uncompressed") {
				t.Errorf("compressed: %v, want Internal asking for uncompressed messages", err)
			}
			if err := tc.call(); err != nil {
				t.Errorf("uncompressed: %v", err)
			}
		})
	}
}
