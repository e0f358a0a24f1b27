package engine_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
)

// slowReturnDevice is a host device whose memory, like a worker device's
// on a GPU, comes back after the server closes what held it: its WaitFree
// records what was asked and what the device held then, and answers err.
type slowReturnDevice struct {
	*device.Host
	mu    sync.Mutex
	needs []int64
	used  []int64 // the device's bytes in use at each call
	err   error
	gate  chan struct{} // non-nil: each call waits for it after recording
}

func (d *slowReturnDevice) WaitFree(ctx context.Context, room func() int64) error {
	need := room()
	d.mu.Lock()
	d.needs = append(d.needs, need)
	d.used = append(d.used, d.Host.MemInfo().Used)
	err, gate := d.err, d.gate
	d.mu.Unlock()
	if gate != nil {
		<-gate
	}
	return err
}

func (d *slowReturnDevice) asked() []int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]int64(nil), d.needs...)
}

// A load that evicted for its room waits for the room on the device itself
// (WaitFree) after the eviction and before it allocates anything; a wait
// cut by the request's deadline is a 504 that gives its reservation back.
// Before, it allocated at once: on a full GPU, before the victim's worker
// had let go of the memory, and failed.
func TestLoadWaitsForTheRoomItEvictedFor(t *testing.T) {
	ma, mb := testkit.Manifest("a"), testkit.Manifest("b")
	per := ma.MaxInputBytes + ma.TmpBytes + ma.OutBytes
	mb.Constants = "w.bin"
	const consts = 32 << 10
	dev := &slowReturnDevice{Host: device.NewHost(per + consts + 1024)} // room for a or b, not both
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{dev}})
	testkit.Deploy(t, e, testkit.BundleDir(t, ma, nil))
	testkit.Deploy(t, e, testkit.BundleDir(t, mb, make([]byte, consts)))

	invoke(t, e, "a", []byte{1})
	invoke(t, e, "b", []byte{1}) // evicts a
	dev.mu.Lock()
	needs, used := dev.needs, dev.used
	dev.mu.Unlock()
	if len(needs) != 2 || needs[0] != per || needs[1] != per+consts {
		t.Fatalf("WaitFree was asked for %v, want [%d %d] (a's instance; b's constants and instance)", needs, per, per+consts)
	}
	if used[1] != 0 {
		t.Fatalf("b's wait found %d bytes in use on the device, want 0: a evicted, b not yet allocated", used[1])
	}

	// a again, its wait cut by the deadline: a 504, nothing held after it.
	dev.mu.Lock()
	dev.err = context.DeadlineExceeded
	dev.mu.Unlock()
	err := e.Invoke(context.Background(), "a", &call.Request{Input: []byte{1}})
	if errdefs.KindOf(err) != errdefs.KindTimeout || !strings.Contains(err.Error(), "function a") || !strings.Contains(err.Error(), "gave back") {
		t.Fatalf("a whose wait for its room ran out: %v (kind %v), want a timeout naming a and the wait", err, errdefs.KindOf(err))
	}
	// Its client gone meanwhile: told as gone.
	dev.mu.Lock()
	dev.err = context.Canceled
	dev.mu.Unlock()
	if err := e.Invoke(context.Background(), "a", &call.Request{Input: []byte{1}}); errdefs.KindOf(err) != errdefs.KindGone {
		t.Fatalf("a whose client went during its wait: %v (kind %v), want gone", err, errdefs.KindOf(err))
	}
	dev.mu.Lock()
	dev.err = nil
	dev.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.Invoke(ctx, "a", &call.Request{Input: []byte{1}}); err != nil {
		t.Fatalf("a after its cut wait: %v (its reservation was kept)", err)
	}
}

// Two loads under way on one device wait for the room of both: the second
// one's wait asks for its bytes and the first one's, which are reserved
// and not yet allocated. Before, each asked for its own, and both went
// once the smaller part was back.
func TestLoadsWaitForTheRoomOfEveryReservation(t *testing.T) {
	ma, mb := testkit.Manifest("a"), testkit.Manifest("b")
	per := ma.MaxInputBytes + ma.TmpBytes + ma.OutBytes
	gate := make(chan struct{})
	dev := &slowReturnDevice{Host: device.NewHost(0), gate: gate}
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{dev}})
	testkit.Deploy(t, e, testkit.BundleDir(t, ma, nil))
	testkit.Deploy(t, e, testkit.BundleDir(t, mb, nil))
	errs := make(chan error, 2)
	for i, name := range []string{"a", "b"} {
		go func() { errs <- e.Invoke(context.Background(), name, &call.Request{Input: []byte{1}}) }()
		for deadline := time.Now().Add(10 * time.Second); len(dev.asked()) <= i; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("load %s never asked for its room", name)
			}
		}
	}
	close(gate)
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got := dev.asked(); got[0] != per || got[1] != 2*per {
		t.Fatalf("the two loads asked for %v, want [%d %d]: the second for both reservations", got, per, 2*per)
	}
}
