package grpcapi_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

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

	for _, tc := range []struct {
		name     string
		free     int64 // of the budget left to the call
		deadline time.Duration
		want     codes.Code
	}{
		{"full: waits before its message is read, to its deadline", 0, 300 * time.Millisecond, codes.DeadlineExceeded},
		{"full: waits before its message is read, 5 s", 0, 0, codes.Unavailable},
		{"64 KiB free, its message does not fit: waits once it is read, to its deadline", 100 << 10, 300 * time.Millisecond, codes.DeadlineExceeded},
		{"64 KiB free, its message does not fit: waits once it is read, 5 s", 100 << 10, 0, codes.Unavailable},
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
			// echo refuses 150 KiB (over its max_input_bytes) once it is
			// read and fits.
			_, err := f.client.ModelInfer(ctx, sized("echo", 150<<10))
			if status.Code(err) != tc.want || (tc.want == codes.Unavailable && !strings.Contains(err.Error(), "--max-body-memory")) {
				t.Fatalf("a call beside a budget with %d bytes free: %v, want %v", tc.free, err, tc.want)
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
