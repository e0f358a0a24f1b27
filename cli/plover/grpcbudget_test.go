package main_test

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/plover-run/plover/grpcapi/inferencepb"
)

// A gRPC call's message counts in --max-body-memory with HTTP's bodies,
// in a real server: beside an HTTP body that holds part of the budget, a
// call whose message does not fit in the rest waits 5 s and is refused
// Unavailable, naming the flag; once the body is gone the same call runs,
// and every byte of the budget comes back (plover_body_memory_bytes).
func TestGRPCMessagesShareTheBodyBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server with worker processes")
	}
	srv, ctx := bigServer(t, "process", "--max-body-memory", "1")
	held := func() float64 { return metric(t, srv.url, "plover_body_memory_bytes") }
	waitHeld := func(what string, ok func(float64) bool) {
		t.Helper()
		for end := time.Now().Add(10 * time.Second); !ok(held()); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("%s: plover_body_memory_bytes %v", what, held())
			}
		}
	}
	conn, err := grpc.NewClient(grpcAddr(t, srv), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	call := inferBig(pb.NewGRPCInferenceServiceClient(conn))
	in := body(303, 0, 900<<10)

	// The hog announces 4 MiB and sends 300 KiB: the server holds them
	// and the window it waits on, up to 364 KiB of the 1 MiB.
	hog, err := net.Dial("tcp", strings.TrimPrefix(srv.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer hog.Close()
	fmt.Fprintf(hog, "POST /v1/functions/big/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", 4<<20)
	hog.Write(make([]byte, 300<<10))
	waitHeld("the hog's 300 KiB", func(n float64) bool { return n >= 300<<10 })
	start := time.Now()
	_, err = call(ctx, in)
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "--max-body-memory") {
		t.Fatalf("a 900 KiB message beside an HTTP body holding 300 KiB of a 1 MiB budget: %v", err)
	}
	t.Logf("refused after %v", time.Since(start))
	hog.Close()
	waitHeld("the hog gone", func(n float64) bool { return n == 0 })
	resp, err := call(ctx, in)
	if err == nil {
		err = ownAnswer(resp, in)
	}
	if err != nil {
		t.Fatalf("the same call with the budget free: %v", err)
	}
	waitHeld("the call ended", func(n float64) bool { return n == 0 })
}
