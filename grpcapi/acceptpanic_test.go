package grpcapi_test

import (
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/plover-run/plover/netguard"
)

// panicAlways's Accept panics at every call, before the inner accept (as
// a bug in the handshake tracking's listener would).
type panicAlways struct{ net.Listener }

func (panicAlways) Accept() (net.Conn, error) { panic("a bug in Accept") }

// A gRPC server whose every accept panics, recovered, still stops: Stop
// waits for Serve to return, and Serve's listener retried the panics for
// ever, closed or not, the shutdown with it (even after a second signal).
func TestStopEndsAServerWhoseAcceptPanics(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var panics atomic.Int32
	gs := grpc.NewServer()
	go gs.Serve(netguard.Recovered(panicAlways{ln}, func(any) { panics.Add(1) }))
	for end := time.Now().Add(5 * time.Second); panics.Load() < 2; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("Serve's accepts did not panic")
		}
	}
	stopped := make(chan struct{})
	go func() { gs.Stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("Stop had not returned 5 s later")
	}
}
