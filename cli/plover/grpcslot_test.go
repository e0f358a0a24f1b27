package main_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/plover-run/plover/grpcapi/inferencepb"
)

// A gRPC call's inputs are laid out in a worker's slot and its answer is
// written from there (grpcapi's pinLanded, slotOutputs). Against a real
// server with process isolation: clients of random sizes, some that cancel
// mid-call, and a worker killed in the middle; every OK is exactly its own
// call's bytes. Then 40 calls that leave their answers unread and cancel
// while the server writes them, more than a program has slots (32): were
// a slot whose answer was never written not given back, the calls after
// would find none and be copied (plover_payload_copied_bytes_total).
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
		if after := metric(t, srv.url, copied); after != before {
			t.Errorf("%s went from %v to %v over 3 calls after 40 unread answers: they were copied, as where the program's slots are all held", copied, before, after)
		}
	})
}
