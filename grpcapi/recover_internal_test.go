package grpcapi

import (
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"

	"github.com/plover-run/plover/frontdoor"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
	"github.com/plover-run/plover/internal/testkit"
)

// panicCodec is a codec with a bug: it panics both ways.
type panicCodec struct{ encoding.CodecV2 }

func (panicCodec) Marshal(any) (mem.BufferSlice, error) { panic("a bug in Marshal") }
func (panicCodec) Unmarshal(mem.BufferSlice, any) error { panic("a bug in Unmarshal") }

// gRPC-Go runs the server's codec outside the interceptors (a request is
// decoded before them, its answer encoded after): a panic there is the
// codec's error, which gRPC answers Internal, logged as the others.
func TestCodecPanicIsAnError(t *testing.T) {
	var log testkit.LogBuffer
	c := recoveringCodec{panicCodec{}, frontdoor.New(frontdoor.Config{Log: slog.New(slog.NewTextHandler(&log, nil))})}
	_, merr := c.Marshal(&pb.ServerLiveResponse{})
	uerr := c.Unmarshal(nil, &pb.ModelInferRequest{})
	_, cerr := c.Marshal(&inferCall{resp: &pb.ModelInferResponse{}}) // named by its message on the wire
	for _, err := range []error{merr, uerr, cerr} {
		if st, _ := status.FromError(err); st.Code() != codes.Internal || st.Message() != frontdoor.PanicMessage {
			t.Errorf("a codec's panic: %v, want Internal: %s", err, frontdoor.PanicMessage)
		}
	}
	for _, want := range []string{`route="codec: encoding *inferencepb.ServerLiveResponse" panic="a bug in Marshal"`,
		`route="codec: decoding *inferencepb.ModelInferRequest" panic="a bug in Unmarshal"`,
		`route="codec: encoding *inferencepb.ModelInferResponse" panic="a bug in Marshal"`} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("the log lacks %s:\n%s", want, log.String())
		}
	}
}
