package engine_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/evict"
	"github.com/plover-run/plover/internal/testkit"
)

// pickOnce picks, with LRU, what its first pick finds (whole functions
// only, with wholeFirst), then nothing: a policy that gives up midway, as
// evict.Evictor allows (-1).
type pickOnce struct {
	wholeFirst bool
	picks      atomic.Int32
}

func (p *pickOnce) Pick(idle []evict.Idle) int {
	if p.picks.Add(1) > 1 {
		return -1
	}
	if p.wholeFirst {
		for i, c := range idle {
			if !c.Instance {
				return i
			}
		}
		return -1
	}
	return evict.LRU{}.Pick(idle)
}

// A reservation refused after the Evictor picked some victims takes none
// of them: the idle instance picked goes back to its pool, warm. Before,
// it was closed anyway, for a load that did not happen (review G, LOW 6).
func TestRefusedReservationKeepsTheInstancesPicked(t *testing.T) {
	per := instanceBytesOf(testkit.Manifest("x"))
	host := device.NewHost(2*per + per/2)
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{host}, Evictor: &pickOnce{}})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("a"), nil))
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("b"), nil))
	mc := testkit.Manifest("c")
	mc.MaxInputBytes += per // needs both idle instances' memory
	testkit.Deploy(t, e, testkit.BundleDir(t, mc, nil))
	invoke(t, e, "a", []byte{1})
	invoke(t, e, "b", []byte{1})
	if err := e.Invoke(context.Background(), "c", &call.Request{Input: []byte{1}}); err == nil {
		t.Fatal("c ran: its Evictor gave up after one pick")
	}
	if a, b := info(t, e, "a").Idle, info(t, e, "b").Idle; a != 1 || b != 1 {
		t.Fatalf("after c's refused reservation: a %d, b %d idle instances; want both kept", a, b)
	}
	invoke(t, e, "a", []byte{1}) // the instance given back still runs
	invoke(t, e, "b", []byte{1})
}

// A whole function the Evictor picks is unloaded only once the room is
// certain: a reservation refused after picking it leaves it loaded.
func TestRefusedReservationKeepsTheFunctionPicked(t *testing.T) {
	ma := testkit.Manifest("a")
	ma.Constants = "w.bin"
	per := instanceBytesOf(ma)
	host := device.NewHost(per + 64<<10 + 2048) // a's instance and constants, and a little
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{host}, Evictor: &pickOnce{wholeFirst: true}})
	testkit.Deploy(t, e, testkit.BundleDir(t, ma, make([]byte, 64<<10)))
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("b"), nil))
	invoke(t, e, "a", []byte{1})
	if !e.BreakIdle("a") { // a loaded with no instance: evictable whole
		t.Fatal("a has no idle instance")
	}
	invoke(t, e, "b", []byte{1}) // its instance where a's was; idle after
	mc := testkit.Manifest("c")
	mc.MaxInputBytes += 32 << 10 // needs a's constants and b's instance
	testkit.Deploy(t, e, testkit.BundleDir(t, mc, nil))
	if err := e.Invoke(context.Background(), "c", &call.Request{Input: []byte{1}}); err == nil {
		t.Fatal("c ran: its Evictor gave up after one pick")
	}
	if fi := info(t, e, "a"); !fi.Loaded {
		t.Error("a was unloaded for c's reservation, which was refused")
	}
	if fi := info(t, e, "b"); fi.Idle != 1 {
		t.Errorf("b has %d idle instances after c's refused reservation, want 1", fi.Idle)
	}
}
