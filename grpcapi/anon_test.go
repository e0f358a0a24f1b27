package grpcapi_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/plover-run/plover/auth"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
)

// What a client without a token can make a server with tokens read and
// hold. The methods open without one (ServerLive, ServerReady,
// ServerMetadata) take empty messages, yet gRPC-Go reads one of up to the
// message limit before any handler: one client holds at most 4 such calls
// at once, each ended when its message has not come within a second (it
// held calls for the read timeout, 60 s, and without a count before). A
// token changes nothing there: a known one is held to the same bound (were
// it exempt, the bound would tell whether a token is known, untraced).
func TestOpenMethodCallsWithoutATokenAreBounded(t *testing.T) {
	f := serve(t, table{"root": {Name: "root", Scopes: auth.Admin}})
	ctx := ctxT(t)
	// Calls whose headers come and whose message never does.
	var held []grpc.ClientStream
	for range 4 {
		cs, err := f.conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, pb.GRPCInferenceService_ServerLive_FullMethodName)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, cs)
	}
	// A known token is answered as an unknown one and none are: refused.
	for _, authz := range []string{"Bearer root", "Bearer guess"} {
		withToken := metadata.AppendToOutgoingContext(ctx, "authorization", authz)
		if _, err := f.client.ServerLive(withToken, &pb.ServerLiveRequest{}); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("an open call with %q beside four held: %v, want ResourceExhausted as without a token", authz, err)
		}
	}
	// The fifth without a token, sent whole, waits for none of them:
	// refused at once while they are held, answered once the server has
	// ended them.
	start := time.Now()
	refused := false
	for {
		_, err := f.client.ServerLive(ctx, &pb.ServerLiveRequest{})
		if err == nil {
			break
		}
		if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "at most 4 calls") {
			t.Fatalf("a fifth open call beside four held: %v, want ResourceExhausted naming the bound", err)
		}
		refused = true
		if time.Since(start) > 10*time.Second {
			t.Fatal("four calls without their messages still held 10 s on")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !refused {
		t.Error("a fifth open call beside four held was answered: want it refused while they are held")
	}
	for i, cs := range held {
		var resp pb.ServerLiveResponse
		if err := cs.RecvMsg(&resp); status.Code(err) != codes.Canceled {
			t.Errorf("held call %d: %v, want it ended by the server (Canceled) for want of its message", i, err)
		}
	}
}

// A call's header list is bounded as HTTP bounds a request's headers: a
// call without a token and with 1 MiB of metadata is refused for its size
// (gRPC-Go's default bound is 16 MiB, read whole before the tap refuses a
// missing token), and a call with a token and ordinary metadata passes.
func TestHeaderListIsBounded(t *testing.T) {
	f := serve(t, table{"root": {Name: "root", Scopes: auth.Admin}})
	ctx := metadata.AppendToOutgoingContext(ctxT(t), "x-pad", strings.Repeat("a", 1<<20))
	_, err := f.client.ModelInfer(ctx, &pb.ModelInferRequest{ModelName: "echo"})
	if code := status.Code(err); code == codes.Unauthenticated || code == codes.OK {
		t.Fatalf("a call without a token with 1 MiB of metadata: %v, want it refused for its headers' size", err)
	}
	ctx = metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer root", "traceparent", "00-"+strings.Repeat("1", 32)+"-"+strings.Repeat("2", 16)+"-01")
	if _, err := f.client.ServerMetadata(ctx, &pb.ServerMetadataRequest{}); err != nil {
		t.Fatalf("a call with ordinary metadata: %v", err)
	}
}
