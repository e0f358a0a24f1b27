package grpcapi_test

import (
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/plover-run/plover/grpcapi"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
)

// A gRPC client refused its connection reads why, as the call's status,
// its message encoded as grpc-message carries it; a client that does not
// speak HTTP/2, or says nothing, is closed, the silent one at the
// deadline.
func TestRefuseSaysWhy(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const why = "the server has its maximum of open connections (--max-conns); 100% full, ümlaut kept"
	const within = 2 * time.Second
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go grpcapi.Refuse(c, why, time.Now().Add(within))
		}
	}()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = pb.NewGRPCInferenceServiceClient(conn).ServerLive(ctxT(t), &pb.ServerLiveRequest{})
	if st, _ := status.FromError(err); st.Code() != codes.Unavailable || st.Message() != why {
		t.Fatalf("a refused call: %v; want Unavailable saying %q", err, why)
	}
	for _, hello := range []string{"GET / HTTP/1.1\r\nHost: x\r\n\r\n", ""} {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte(hello))
		start := time.Now()
		c.SetReadDeadline(start.Add(5 * within))
		b, err := io.ReadAll(c)
		if took := time.Since(start); len(b) != 0 || took > 2*within {
			t.Errorf("a client that sent %q read %q (%v) and was closed after %v; want nothing, closed by %v", hello, b, err, took.Round(time.Millisecond), within)
		}
		c.Close()
	}
}

// A refused client's frame is read at most at HTTP/2's initial frame size:
// a header claiming 16 MiB made Refuse allocate that much for 9 bytes
// sent, 32 refusals at once half a GiB.
func TestRefuseReadsNoLargeFrame(t *testing.T) {
	srv, cli := net.Pipe()
	go io.Copy(io.Discard, cli) // the server's settings
	go func() {
		cli.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
		cli.Write([]byte{0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 1}) // DATA on stream 1, 16 MiB - 1 claimed
	}()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	grpcapi.Refuse(srv, "full", time.Now().Add(5*time.Second))
	runtime.ReadMemStats(&after)
	cli.Close()
	if got := after.TotalAlloc - before.TotalAlloc; got > 1<<20 {
		t.Fatalf("a refusal allocated %d bytes for a frame header claiming 16 MiB; want at most 1 MiB", got)
	}
}
