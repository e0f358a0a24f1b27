package grpcapi

import (
	"testing"
	"time"

	"google.golang.org/grpc/peer"

	pb "github.com/plover-run/plover/grpcapi/inferencepb"
	"github.com/plover-run/plover/netguard"
)

// A large answer copied out of its function's output (a pipeline's, a
// typed one: no slot to write it from) holds its bytes of the body budget
// (--max-body-memory, HTTP's bodies' and answers' too) until gRPC-Go has
// written and freed it: a client that does not read it held the server's
// memory up to the write timeout, counted nowhere. A small one is not
// counted (32 a connection at most, README).
func TestACopiedAnswerHoldsTheBodyBudget(t *testing.T) {
	budget := netguard.NewBudget(1 << 20)
	srv := New(nil, Options{WriteTimeout: time.Minute, BodyBudget: budget})
	c := newCodec(srv)
	for _, tc := range []struct {
		name   string
		size   int
		counts bool
	}{{"64 KiB", 64 << 10, true}, {"2 MiB, past the whole budget", 2 << 20, true}, {"4 KiB", 4 << 10, false}} {
		t.Run(tc.name, func(t *testing.T) {
			sc, _ := connPair(t, &srv.conns)
			resp := &pb.ModelInferResponse{ModelName: "p", RawOutputContents: [][]byte{make([]byte, tc.size)}}
			call := &inferCall{io: inferIO{peer: &peer.Peer{Addr: sc.RemoteAddr(), LocalAddr: sc.LocalAddr()}}, resp: resp}
			out, err := c.Marshal(call)
			if err != nil {
				t.Fatal(err)
			}
			held := budget.InUse()
			if want := int64(out.Len()); tc.counts && held != want || !tc.counts && held != 0 {
				t.Errorf("an answer of %d bytes held by gRPC-Go holds %d bytes of the budget, want %d", out.Len(), held, want*int64(btoi(tc.counts)))
			}
			out.Free()
			if n := budget.InUse(); n != 0 {
				t.Errorf("once gRPC-Go freed the answer the budget counts %d bytes, want 0", n)
			}
		})
	}
}
