package grpcapi_test

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/grpcapi"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/netguard"
)

// ModelInfer's messages count in the request bytes held in memory
// (--max-body-memory) with HTTP's bodies: a call holds its message's size
// while it runs; with the budget full it waits before its message is read,
// and one whose message then does not fit waits for the rest; either wait
// ends at the call's deadline (DeadlineExceeded) or after 5 s
// (Unavailable, naming the flag). Every byte comes back as calls end.
func TestMessagesCountInTheBodyBudget(t *testing.T) {
	budget := netguard.NewBudget(1 << 20)
	f := serveOpts(t, nil, grpcapi.Options{BodyBudget: budget})
	sized := func(model string, n int) *pb.ModelInferRequest {
		return &pb.ModelInferRequest{ModelName: model, Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{int64(n)}}},
			RawInputContents: [][]byte{make([]byte, n)}}
	}
	empty := func(what string) {
		t.Helper()
		for end := time.Now().Add(10 * time.Second); budget.InUse() != 0; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("%s: %d bytes of the budget still held", what, budget.InUse())
			}
		}
	}

	if _, err := f.client.ModelInfer(ctxT(t), sized("echo", 100)); err != nil {
		t.Fatal(err)
	}
	// A running call holds its message's size, not its ticket.
	in := sized("slow", 60000) // slow runs 2 s
	done := make(chan error, 1)
	go func() { _, err := f.client.ModelInfer(ctxT(t), in); done <- err }()
	testkit.WaitFor(t, f.e, "slow", "its run to start", testkit.Busy(1, 0))
	if got, want := budget.InUse(), int64(proto.Size(in)); got != want {
		t.Fatalf("a running call of a %d-byte message holds %d bytes of the budget", want, got)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	empty("the call ended")

	// Each refusal is counted once: one before its message was read under
	// _unknown, its model not known; one after it under the model's (its
	// series made by its first call, above). A client's deadline resets
	// its stream: where that reached the server more than 25 ms before the
	// server's own copy of the deadline (its headers slow to come), the
	// server counts a client gone (499), not a deadline (504).
	deadline := []string{"504", "499"}
	for _, tc := range []struct {
		name     string
		free     int64 // of the budget left to the call
		deadline time.Duration
		want     codes.Code
		counted  string   // plover_requests_total's function label
		codes    []string // its code label: one of them
	}{
		{"full: waits before its message is read, to its deadline", 0, 300 * time.Millisecond, codes.DeadlineExceeded, "_unknown", deadline},
		{"full: waits before its message is read, 5 s", 0, 0, codes.Unavailable, "_unknown", []string{"503"}},
		{"64 KiB free, its message does not fit: waits once it is read, to its deadline", 100 << 10, 300 * time.Millisecond, codes.DeadlineExceeded, "echo", deadline},
		{"64 KiB free, its message does not fit: waits once it is read, 5 s", 100 << 10, 0, codes.Unavailable, "echo", []string{"503"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			held := budget.Max() - tc.free
			if err := budget.Acquire(ctxT(t), held); err != nil { // the call before may still hold it a moment
				t.Fatalf("the budget is not free: %v", err)
			}
			defer budget.Release(held)
			ctx := ctxT(t)
			if tc.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.deadline)
				defer cancel()
			}
			counted := func() (n float64) {
				for _, code := range tc.codes {
					c, _ := testkit.Counter(t, f.reg, "plover_requests_total", map[string]string{"function": tc.counted, "code": code})
					n += c
				}
				return n
			}
			before := counted()
			// echo refuses 150 KiB (over its max_input_bytes) once it is
			// read and fits.
			_, err := f.client.ModelInfer(ctx, sized("echo", 150<<10))
			if status.Code(err) != tc.want || (tc.want == codes.Unavailable && !strings.Contains(err.Error(), "--max-body-memory")) {
				t.Fatalf("a call beside a budget with %d bytes free: %v, want %v", tc.free, err, tc.want)
			}
			// A client's deadline ends its call as the server's copy of it
			// ends the wait: the count may come a little after, and the
			// budget is held until it has (given back first, it would let
			// the call go on).
			for end := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				n := counted()
				if n == before+1 {
					break
				}
				if n > before+1 || time.Now().After(end) {
					t.Fatalf("plover_requests_total{function=%q,code in %v} went from %v to %v, want one more", tc.counted, tc.codes, before, n)
				}
			}
		})
		empty("the call was refused")
	}
	// With room again, the same calls run (or are refused for their size).
	if _, err := f.client.ModelInfer(ctxT(t), sized("echo", 60000)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.client.ModelInfer(ctxT(t), sized("echo", 150<<10)); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a message over echo's max_input_bytes with room in the budget: %v", err)
	}
	empty("every call ended")
}

// What gRPC-Go takes in of a call before its handler asks for the
// message is outside --max-body-memory; the stream's flow-control window
// bounds it to 64 KiB. With the budget full the handler does not ask, so
// a client sending a 1 MiB message gets no more than that window onto the
// server before its call ends at its deadline; with room, the same
// message is read whole at once.
func TestACallSendsOneWindowBeforeItsMessageIsAskedFor(t *testing.T) {
	budget := netguard.NewBudget(1 << 20)
	e := testkit.Engine(t, engine.Config{MaxInstances: 1})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	var read atomic.Int64
	f := serveEngine(t, e, nil, grpcapi.Options{BodyBudget: budget}, func(ln net.Listener) net.Listener { return countingListener{ln, &read} })
	if _, err := f.client.ServerLive(ctxT(t), &pb.ServerLiveRequest{}); err != nil { // the connection set up
		t.Fatal(err)
	}
	in := &pb.ModelInferRequest{ModelName: "echo", Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{1 << 20}}},
		RawInputContents: [][]byte{make([]byte, 1<<20)}}

	if err := budget.Acquire(ctxT(t), budget.Max()); err != nil {
		t.Fatal(err)
	}
	before := read.Load()
	ctx, cancel := context.WithTimeout(ctxT(t), time.Second)
	defer cancel()
	if _, err := f.client.ModelInfer(ctx, in); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a call beside a full budget: %v, want DeadlineExceeded", err)
	}
	budget.Release(budget.Max())
	// The window, and its frames' and the call's headers.
	if got, most := read.Load()-before, int64(64<<10+8<<10); got > most {
		t.Fatalf("a call of a 1 MiB message whose handler had not asked for it sent %d bytes onto the server, over %d", got, most)
	}

	before = read.Load()
	if _, err := f.client.ModelInfer(ctxT(t), in); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a message over echo's max_input_bytes with room in the budget: %v", err)
	}
	if got := read.Load() - before; got < 1<<20 {
		t.Fatalf("a call of a 1 MiB message refused for its size once read: %d bytes read", got)
	}
}

// countingListener counts the bytes read from its connections, whose
// sockets the server may still wait on itself.
type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countingConn{c, l.n}, nil
}

type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

func (c countingConn) SyscallConn() (syscall.RawConn, error) {
	return c.Conn.(syscall.Conn).SyscallConn()
}
