package engine_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/evict"
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

// panicSecondPick is LRU until armed, then panics at its second pick.
type panicSecondPick struct{ n, armed atomic.Int32 }

func (p *panicSecondPick) Pick(idle []evict.Idle) int {
	if p.armed.Load() == 1 && p.n.Add(1) == 2 {
		panic("evictor bug on its second pick")
	}
	return evict.LRU{}.Pick(idle)
}

// A panic in the Evictor after it has taken a victim (its second pick):
// the victim taken is still closed and its memory given back. It was left
// taken and never closed, and the function needing the room could never
// load again ("idle functions hold too little"), as lasting as the lock
// the ledger's defer freed (a review).
func TestEvictorPanicAfterATakeFreesTheVictim(t *testing.T) {
	ma := testkit.Manifest("a")
	ma.Constants = "w.bin"
	per := ma.MaxInputBytes + ma.TmpBytes + ma.OutBytes
	host := device.NewHost(per + 64<<10 + 2048)
	ev := &panicSecondPick{}
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{host}, Evictor: ev})
	testkit.Deploy(t, e, testkit.BundleDir(t, ma, make([]byte, 64<<10)))
	mb := testkit.Manifest("b")
	mb.Constants = "w.bin"
	testkit.Deploy(t, e, testkit.BundleDir(t, mb, make([]byte, 32<<10)))
	invoke(t, e, "a", []byte{1})
	ev.armed.Store(1)
	func() {
		defer func() { recover() }() // as a transport recovers it
		e.Invoke(context.Background(), "b", &call.Request{Input: []byte{1}})
	}()
	ev.armed.Store(0)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := e.Invoke(ctx, "b", &call.Request{Input: []byte{1}})
	if err != nil {
		t.Fatalf("b cannot load after the evictor's panic: %v", err)
	}
}
