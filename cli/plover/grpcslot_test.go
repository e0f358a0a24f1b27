package main_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/plover-run/plover/grpcapi/inferencepb"
	"github.com/plover-run/plover/internal/testkit"
)

// A gRPC call's inputs are laid out in a worker's slot and its answer is
// cut from there (grpcapi's pinLanded). Against a real server with
// process isolation: clients of random sizes, some that cancel mid-call,
// and a worker killed in the middle; every OK is exactly its own call's
// bytes. Then 40 calls that leave their answers unread and cancel while
// the server writes them, more than a program has slots (32): were a slot
// whose answer was never read not given back, the calls after would find
// none and be copied twice (plover_payload_copied_bytes_total).
func TestGRPCAnswersFromTheSlotAreTheirOwn(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server with worker processes")
	}
	bin := buildPlover(t)
	srv := startIsoServer(t, bin, t.TempDir(), nil, "--isolation", "process", "--grpc-listen", "127.0.0.1:0", "--timeout", "20s", "--max-instances", "4")
	env := []string{"PLOVER_SERVER=" + srv.url}
	echoBigAs(t, bin, env, "big")
	conn, err := grpc.NewClient(grpcAddr(t, srv), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20), grpc.MaxCallSendMsgSize(16<<20)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	call := inferBig(pb.NewGRPCInferenceServiceClient(conn))

	t.Run("hostile mix", func(t *testing.T) {
		mixedClients(t, srv.url, "big", 11, func(rng *rand.Rand, cl, i int) (bool, string) {
			in := body(200+cl, i, 1+rng.IntN(3<<20))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			if rng.IntN(4) == 0 { // gives up mid-call: sending, running or reading
				ctx, cancel = context.WithTimeout(context.Background(), time.Duration(1+rng.IntN(20))*time.Millisecond)
			}
			resp, err := call(ctx, in)
			cancel()
			switch code := status.Code(err); {
			case err == nil:
				if e := ownAnswer(resp, in); e != nil {
					return false, e.Error()
				}
				return true, ""
			case code == codes.DeadlineExceeded || code == codes.Canceled,
				code == codes.Internal || code == codes.Unavailable: // the killed worker's calls
				return false, ""
			}
			return false, err.Error()
		})
	})

	t.Run("unread answers give their slots back", func(t *testing.T) {
		// A client window of 64 KiB, and no read: the server's write of a
		// 2 MiB answer waits on it until the call is cancelled.
		slow, err := grpc.NewClient(grpcAddr(t, srv), grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
		if err != nil {
			t.Fatal(err)
		}
		defer slow.Close()
		unreadCalls(t, slow, 40, true)
		landsOnce(t, srv.url, call)
	})
}

// inferBig calls "big" (echoBigAs) on c with one raw input.
func inferBig(c pb.GRPCInferenceServiceClient) func(context.Context, []byte) (*pb.ModelInferResponse, error) {
	return func(ctx context.Context, in []byte) (*pb.ModelInferResponse, error) {
		return c.ModelInfer(ctx, &pb.ModelInferRequest{ModelName: "big",
			Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{int64(len(in))}}},
			RawInputContents: [][]byte{in}})
	}
}

// ownAnswer says whether resp is "big"'s answer to in: in, exactly.
func ownAnswer(resp *pb.ModelInferResponse, in []byte) error {
	if raw := resp.GetRawOutputContents(); len(raw) != 1 || !bytes.Equal(raw[0], in) {
		return fmt.Errorf("OK with %d outputs, not its own %d bytes", len(raw), len(in))
	}
	return nil
}

// unreadCalls makes n calls of 2 MiB to "big" on conn, which leave their
// answers unread: with a client window of 64 KiB the server's write of
// each waits on it. Each is made once the one before had its answer's
// headers (its message on its way), and cancelled then if cancel is set,
// else at the test's end (a connection holds 32 calls at most).
func unreadCalls(t *testing.T, conn *grpc.ClientConn, n int, cancelEach bool) {
	t.Helper()
	in := body(300, 0, 2<<20)
	req := &pb.ModelInferRequest{ModelName: "big",
		Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{int64(len(in))}}},
		RawInputContents: [][]byte{in}}
	var cancels []context.CancelFunc
	t.Cleanup(func() {
		for _, c := range cancels {
			c()
		}
	})
	for i := range n {
		ctx, cancel := context.WithCancel(context.Background())
		cancels = append(cancels, cancel)
		s, err := conn.NewStream(ctx, &grpc.StreamDesc{}, "/inference.GRPCInferenceService/ModelInfer", grpc.MaxCallSendMsgSize(16<<20))
		if err == nil {
			err = s.SendMsg(req)
		}
		if err == nil {
			err = s.CloseSend()
		}
		if err == nil {
			_, err = s.Header()
		}
		if err != nil {
			t.Fatalf("unread call %d: %v", i, err)
		}
		if cancelEach {
			cancel()
		}
	}
}

// landsOnce makes 3 calls of 1 MiB and checks that each was laid out in a
// slot: a call laid out in its slot copies its input once (the slot's
// layout); one lent none, twice (into the run's slot and out), as where
// the program's slots are all held.
func landsOnce(t *testing.T, url string, call func(context.Context, []byte) (*pb.ModelInferResponse, error)) {
	t.Helper()
	copied := `plover_payload_copied_bytes_total{function="big"}`
	before := metric(t, url, copied)
	for i := range 3 {
		in := body(301, i, 1<<20)
		resp, err := call(context.Background(), in)
		if err == nil {
			err = ownAnswer(resp, in)
		}
		if err != nil {
			t.Fatalf("call %d after the unread ones: %v", i, err)
		}
	}
	if after := metric(t, url, copied); after-before != 3<<20 {
		t.Errorf("%s went from %v to %v over 3 calls of 1 MiB after the unread answers, want 3 MiB more: they were lent no slot", copied, before, after)
	}
}

// An answer is written from its slot, so a client that leaves it unread
// and keeps its call holds the slot: past --write-timeout its connection
// is closed (logged), and the slots come back. 40 such calls on two
// connections, more than a program's 32 slots: the calls after them still
// land.
func TestGRPCAnswersNotTakenCloseTheirConnection(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server with worker processes")
	}
	srv, ctx := bigServer(t, "process", "--write-timeout", "2s")
	unreadUntilClosed(ctx, t, srv, 2)
	conn := bigClient(t, srv)
	// The slots come back once what gRPC-Go held for the closed
	// connections is collected, which the server asks for: a line for
	// each connection says so, with no call made to make it collect.
	for back := 0; back < 2; back = strings.Count(srv.log.String(), "the answers not taken on a closed gRPC connection are freed") {
		if ctx.Err() != nil {
			t.Fatalf("%d of 2 connections' slots back 30 s after their answers were made", back)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, l := range strings.Split(srv.log.String(), "\n") {
		if strings.Contains(l, "not taken") {
			t.Log(l)
		}
	}
	call := inferBig(pb.NewGRPCInferenceServiceClient(conn))
	copied := `plover_payload_copied_bytes_total{function="big"}`
	for in := body(302, 0, 1<<20); ; {
		before := metric(t, srv.url, copied)
		resp, err := call(ctx, in)
		if err == nil {
			err = ownAnswer(resp, in)
		}
		if err != nil {
			t.Fatal(err)
		}
		if metric(t, srv.url, copied)-before == 1<<20 {
			break
		}
	}
	landsOnce(t, srv.url, call)
	if log := srv.log.String(); strings.Count(log, "closed a gRPC connection: an answer was not taken within the write timeout") != 2 {
		t.Errorf("want a line for each connection closed, saying why; the server's log:\n%s", log)
	}
}

// A large answer copied out of the function's output (no slot: here
// --isolation none) is bounded as one written from its slot: a client that
// leaves 20 such answers unread has its connection closed past
// --write-timeout (logged), the server frees them with no call made to
// make it collect, and calls go on.
func TestGRPCCopiedAnswersNotTakenCloseTheirConnection(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	srv, ctx := bigServer(t, "none", "--write-timeout", "2s")
	unreadUntilClosed(ctx, t, srv, 1)
	for !strings.Contains(srv.log.String(), "the answers not taken on a closed gRPC connection are freed") {
		if ctx.Err() != nil {
			t.Fatalf("the unread answers not freed 30 s after they were made; the server's log:\n%s", srv.log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	conn := bigClient(t, srv)
	in := body(304, 0, 1<<20)
	resp, err := inferBig(pb.NewGRPCInferenceServiceClient(conn))(ctx, in)
	if err == nil {
		err = ownAnswer(resp, in)
	}
	if err != nil {
		t.Fatalf("a call after the unread ones: %v", err)
	}
	if log := srv.log.String(); strings.Count(log, "closed a gRPC connection: an answer was not taken within the write timeout") != 1 {
		t.Errorf("want a line for the connection closed, saying why; the server's log:\n%s", log)
	}
}

// bigServer is a plover serve with --isolation iso, gRPC and flags, "big"
// deployed on it, and a context that ends 30 s into the test.
func bigServer(t *testing.T, iso string, flags ...string) (*isoServer, context.Context) {
	t.Helper()
	bin := buildPlover(t)
	srv := startIsoServer(t, bin, t.TempDir(), nil, append([]string{"--isolation", iso, "--grpc-listen", "127.0.0.1:0"}, flags...)...)
	echoBigAs(t, bin, []string{"PLOVER_SERVER=" + srv.url}, "big")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return srv, ctx
}

// unreadUntilClosed makes 20 calls that leave their answers unread on
// each of n connections of srv (a write timeout of 2 s), and waits until
// the server has closed them all.
func unreadUntilClosed(ctx context.Context, t *testing.T, srv *isoServer, n int) {
	t.Helper()
	slow := make([]*grpc.ClientConn, n)
	for i := range slow {
		c, err := grpc.NewClient(grpcAddr(t, srv), grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		unreadCalls(t, c, 20, false)
		slow[i] = c
	}
	for i, c := range slow {
		for st := c.GetState(); st == connectivity.Ready; st = c.GetState() {
			if !c.WaitForStateChange(ctx, st) {
				t.Fatalf("connection %d of 20 unread answers still %v 30 s after they were made, with a write timeout of 2 s", i, st)
			}
		}
	}
}

// bigClient is a connection to srv for calls of up to 16 MiB.
func bigClient(t *testing.T, srv *isoServer) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(grpcAddr(t, srv), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20), grpc.MaxCallSendMsgSize(16<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// Calls whose inputs were laid out in a slot of a worker that is then
// killed, while they wait behind its one instance, run on the worker that
// replaces it: unlike an HTTP body read into the slot, their inputs are
// still in their messages (the engine refuses the slot: the killed worker
// may have written into it). Only the call that was running fails.
func TestGRPCCallsInASlotOfAKilledWorkerRunOnTheNext(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server with worker processes")
	}
	bin := buildPlover(t)
	srv := startIsoServer(t, bin, t.TempDir(), nil, "--isolation", "process", "--grpc-listen", "127.0.0.1:0", "--timeout", "30s", "--max-instances", "1")
	run(t, bin, []string{"PLOVER_SERVER=" + srv.url}, "deploy", testkit.BundleDir(t, testkit.Slow("slow", 300), nil))
	conn, err := grpc.NewClient(grpcAddr(t, srv), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := pb.NewGRPCInferenceServiceClient(conn)
	in := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	call := func() error {
		resp, err := c.ModelInfer(context.Background(), &pb.ModelInferRequest{ModelName: "slow",
			Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{8}}},
			RawInputContents: [][]byte{in}})
		if err == nil && (len(resp.RawOutputContents) != 1 || !bytes.HasPrefix(resp.RawOutputContents[0], in)) { // echo: its input, then zeros
			err = fmt.Errorf("OK with %v, not its input", resp.RawOutputContents)
		}
		return err
	}
	if err := call(); err != nil { // loaded: its worker lends slots
		t.Fatal(err)
	}
	const calls = 6
	errs := make(chan error, calls)
	for range calls {
		go func() { errs <- call() }()
	}
	// One runs, the others wait for the one instance.
	waitMetric(t, srv.url, `plover_queue_depth{function="slow"}`, fmt.Sprint(calls-1), func(v float64) bool { return v == calls-1 })
	syscall.Kill(workerPID(t, srv.url, "slow"), syscall.SIGKILL)
	failed := 0
	for range calls {
		if err := <-errs; err != nil {
			failed++
			if code := status.Code(err); code != codes.Internal {
				t.Errorf("a call failed %v: only the running one should, Internal (its worker crashed)", err)
			}
		}
	}
	if failed > 1 {
		t.Errorf("%d of %d calls failed, want the running one at most", failed, calls)
	}
}
