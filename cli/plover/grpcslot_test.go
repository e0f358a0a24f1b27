package main_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
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
	c := pb.NewGRPCInferenceServiceClient(conn)
	call := func(ctx context.Context, in []byte) (*pb.ModelInferResponse, error) {
		return c.ModelInfer(ctx, &pb.ModelInferRequest{ModelName: "big",
			Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{int64(len(in))}}},
			RawInputContents: [][]byte{in}})
	}
	own := func(resp *pb.ModelInferResponse, in []byte) error {
		if raw := resp.GetRawOutputContents(); len(raw) != 1 || !bytes.Equal(raw[0], in) {
			return fmt.Errorf("OK with %d outputs, not its own %d bytes", len(raw), len(in))
		}
		return nil
	}

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
				if e := own(resp, in); e != nil {
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
		in := body(300, 0, 2<<20)
		req := &pb.ModelInferRequest{ModelName: "big",
			Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{int64(len(in))}}},
			RawInputContents: [][]byte{in}}
		for i := range 40 {
			ctx, cancel := context.WithCancel(context.Background())
			s, err := slow.NewStream(ctx, &grpc.StreamDesc{}, "/inference.GRPCInferenceService/ModelInfer", grpc.MaxCallSendMsgSize(16<<20))
			if err == nil {
				err = s.SendMsg(req)
			}
			if err == nil {
				err = s.CloseSend()
			}
			if err == nil {
				_, err = s.Header() // the answer's headers: its message is on its way
			}
			cancel()
			if err != nil {
				t.Fatalf("unread call %d: %v", i, err)
			}
		}
		// A call laid out in its slot copies its input once (the slot's
		// layout); one lent none, twice (into the run's slot and out).
		copied := `plover_payload_copied_bytes_total{function="big"}`
		before := metric(t, srv.url, copied)
		for i := range 3 {
			in := body(301, i, 1<<20)
			resp, err := call(context.Background(), in)
			if err == nil {
				err = own(resp, in)
			}
			if err != nil {
				t.Fatalf("call %d after the unread ones: %v", i, err)
			}
		}
		if after := metric(t, srv.url, copied); after-before != 3<<20 {
			t.Errorf("%s went from %v to %v over 3 calls of 1 MiB after 40 unread answers, want 3 MiB more: they were lent no slot, as where the program's slots are all held", copied, before, after)
		}
	})
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
