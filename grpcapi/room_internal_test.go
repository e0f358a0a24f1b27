package grpcapi

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/plover-run/plover/apierr"
	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/netguard"
)

// A call takes its ticket in the budget before gRPC-Go reads its message
// (the handler's dec): with the budget full, no message is read until
// there is room, and a call that finds none in time reads none.
func TestACallWaitsForRoomBeforeItsMessageIsRead(t *testing.T) {
	budget := netguard.NewBudget(1 << 20)
	srv := New(frontdoor.New(frontdoor.Config{}), Options{BodyBudget: budget})
	read := 0
	dec := func(any) error { read++; return nil }
	call := func(timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		_, err := inferHandler(srv, ctx, dec, func(context.Context, any, *grpc.UnaryServerInfo, grpc.UnaryHandler) (any, error) {
			return nil, badRequest("not run here")
		})
		return err
	}
	if !budget.TryAcquire(budget.Max()) {
		t.Fatal("the budget is not free")
	}
	if err := call(100 * time.Millisecond); status.Code(err) != codes.DeadlineExceeded || read != 0 {
		t.Fatalf("with the budget full: %v, its message read %d times; want DeadlineExceeded, none", err, read)
	}
	budget.Release(budget.Max())
	if err := call(10 * time.Second); err == nil || err.Error() != "not run here" || read != 1 || budget.InUse() != 0 {
		t.Fatalf("with room: %v, its message read %d times, %d bytes held after; want the handler's refusal, once, none", err, read, budget.InUse())
	}
}

// A call holds no room while its message has not come (a client that
// sends headers alone holds none), and none while it waits for room: two
// messages as large as the budget get it one after the other, neither
// holding part of what the other waits for.
func TestARoomHoldsNothingWhileItWaits(t *testing.T) {
	budget := netguard.NewBudget(1 << 20)
	srv := New(frontdoor.New(frontdoor.Config{}), Options{BodyBudget: budget})
	came, read := make(chan struct{}), make(chan struct{})
	go inferHandler(srv, context.Background(), func(any) error { close(came); <-read; return errors.New("cut") }, nil)
	<-came
	if n := budget.InUse(); n != 0 {
		t.Fatalf("a call whose message has not come holds %d bytes", n)
	}
	close(read)

	// rooms[1] holds 10 KiB, another call half the budget; then both rooms
	// want all of it, and the other call leaves. Had rooms[1] kept its
	// 10 KiB while it waits, neither could get the budget.
	ctx := context.Background()
	var rooms [2]room
	for i := range rooms {
		if err := rooms[i].await(ctx, budget); err != nil {
			t.Fatal(err)
		}
	}
	if err := rooms[1].resize(ctx, 10<<10); err != nil {
		t.Fatal(err)
	}
	if !budget.TryAcquire(512 << 10) {
		t.Fatal("no room for the other call")
	}
	done := make(chan int, 2)
	for i := range rooms {
		go func() {
			if err := rooms[i].resize(ctx, 2<<20); err != nil { // larger than the budget: all of it
				t.Error(err)
			}
			done <- i
		}()
	}
	for end := time.Now().Add(10 * time.Second); budget.InUse() != 512<<10; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("both rooms waiting: %d bytes held, want the other call's alone", budget.InUse())
		}
	}
	budget.Release(512 << 10)
	for range rooms {
		select {
		case i := <-done:
			if n := budget.InUse(); n != budget.Max() {
				t.Fatalf("room %d grew to the budget: %d bytes held in all, want %d", i, n, budget.Max())
			}
			rooms[i].release()
		case <-time.After(10 * time.Second):
			t.Fatalf("two rooms growing to the whole budget: neither got it in 10 s (%d bytes held)", budget.InUse())
		}
	}
	if n := budget.InUse(); n != 0 {
		t.Fatalf("%d bytes held after both gave their room back", n)
	}
}

// A wait for room that ends says why: the read timeout's where the message
// had not come within it, the call's deadline's (a client's own deadline
// resets its stream a little before the server's copy of it ends), its
// client's leaving, else the budget's.
func TestARefusedWaitSaysWhy(t *testing.T) {
	alive := context.Background()
	past, c1 := context.WithDeadline(alive, time.Now().Add(-time.Second))
	defer c1()
	near, c2 := context.WithDeadline(alive, time.Now().Add(10*time.Millisecond))
	c2() // reset by its client just before its deadline
	far, c3 := context.WithDeadline(alive, time.Now().Add(time.Hour))
	c3()
	noMessage, c4 := context.WithCancelCause(alive)
	c4(errNoMessage)
	for _, tc := range []struct {
		name string
		ctx  context.Context
		want codes.Code
		http int
	}{
		{"the read timeout", noMessage, codes.DeadlineExceeded, 408},
		{"its deadline", past, codes.DeadlineExceeded, 504},
		{"reset at its deadline", near, codes.DeadlineExceeded, 504},
		{"reset far from its deadline", far, codes.Canceled, 499},
		{"the budget", alive, codes.Unavailable, 503},
	} {
		st, _, _, _ := apierr.Classify(roomRefused(tc.ctx))
		if st.GRPC != tc.want || st.HTTP != tc.http {
			t.Errorf("%s: %v (%d), want %v (%d)", tc.name, st.GRPC, st.HTTP, tc.want, tc.http)
		}
	}
}
