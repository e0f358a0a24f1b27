package engine_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
)

// memInfoBugDevice panics in the countdown'th MemInfo call from when it is
// set (a bug in a device's Go code).
type memInfoBugDevice struct {
	device.Device
	countdown atomic.Int32
}

func (d *memInfoBugDevice) MemInfo() device.MemInfo {
	if d.countdown.Add(-1) == 0 {
		panic("a device bug in MemInfo")
	}
	return d.Device.MemInfo()
}

// A cold load reserves its memory under the ledger's lock, asking the
// device's MemInfo and the Evictor there. Before the fix a panic in either,
// recovered by the transport, left the lock held: every later load, of any
// function, hung in reserve past its request's deadline.
func TestLoadPanicInReserveLeavesLedgerUsable(t *testing.T) {
	dev := &memInfoBugDevice{Device: device.NewHost(0)}
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{dev}})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("f"), nil))
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("g"), nil))
	// A cold request asks MemInfo to pick a device, then to reserve.
	dev.countdown.Store(2)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the cold request did not panic")
			}
		}()
		e.Invoke(context.Background(), "f", &call.Request{Input: []byte("x")})
	}()
	if n := dev.countdown.Load(); n != 0 {
		t.Fatalf("MemInfo's countdown is at %d: the panic was not reserve's", n)
	}
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		done <- e.Invoke(ctx, "g", &call.Request{Input: []byte("x")})
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("another function's cold request after the panic: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("another function's cold request (1 s deadline) still hangs after 5 s: the ledger's lock is held by the recovered panic")
	}
}
