package worker

import (
	"context"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/plover-run/plover/worker/wire"
)

// A call whose context ends just as its reply is read leaves a deadline
// of now to be set on the control channel by context.AfterFunc's own
// goroutine, which may run after the call has handed the channel on: the
// next call, with an hour left, then failed past "the request's deadline"
// and its worker was killed for it (a review's probe). The call waits for
// a deadline it began to set before it hands the channel on. The race is
// the Go scheduler's, so a run without the wait could pass; here it failed
// in each of four, within 3 to 295 rounds.
func TestALateCancelDoesNotReachTheNextCall(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "ctl")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	server, worker := conn(fds[0]), conn(fds[1])
	t.Cleanup(func() { server.Close(); worker.Close() })
	// exited: a failed call kills no process (there is none).
	p := &proc{exited: true, ctl: server, ctlTok: make(chan struct{}, 1), buf: make([]byte, 64)}
	g := &program{p: p, name: "fn"}
	// The worker answers each call; after a reply it was told to, it ends
	// that call's context.
	cancels := make(chan context.CancelFunc, 1)
	go func() {
		b := make([]byte, 4096)
		for {
			if _, err := worker.Read(b); err != nil {
				return
			}
			var cancel context.CancelFunc
			select {
			case cancel = <-cancels:
			default:
			}
			if _, err := worker.Write([]byte{1}); err != nil {
				return
			}
			if cancel != nil {
				cancel()
			}
		}
	}()
	end := time.Now().Add(5 * time.Second)
	for round := 0; round < 20000 && time.Now().Before(end); round++ {
		ctx, cancel := context.WithCancel(context.Background())
		cancels <- cancel
		if _, err := p.call(ctx, g, wire.Control{}, nil, "A"); err != nil {
			// Cut before its reply was read (the race's other outcome): a
			// worker's would be killed; here its reply, written before
			// the cancel, is taken off the channel.
			p.ctl.SetDeadline(time.Time{})
			if _, err := p.ctl.Read(p.buf); err != nil {
				t.Fatal(err)
			}
		}
		next, done := context.WithTimeout(context.Background(), time.Hour)
		_, err := p.call(next, g, wire.Control{}, nil, "B")
		done()
		if err != nil {
			t.Fatalf("round %d: a call with an hour left failed: %v", round, err)
		}
	}
}
