package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
)

// heldLoads is a device whose program loads say they began (entered) and
// wait for release.
type heldLoads struct {
	device.Device
	entered chan<- device.Device
	release <-chan struct{}
}

func (d *heldLoads) Load(ctx context.Context, spec device.ProgramSpec) (device.Program, error) {
	d.entered <- d
	<-d.release
	return d.Device.Load(ctx, spec)
}

// Two cold starts of one version on two devices load its program on both
// at once: one load per device at a time, not one per version. Before,
// the second request's load on the other device waited for the first's
// to end (one token per version).
func TestColdStartsOnTwoDevicesLoadAtOnce(t *testing.T) {
	entered, release := make(chan device.Device, 2), make(chan struct{})
	devs := []device.Device{
		&heldLoads{Device: device.NewHost(0), entered: entered, release: release},
		&heldLoads{Device: device.NewHost(0), entered: entered, release: release},
	}
	e := testkit.Engine(t, engine.Config{Devices: devs})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("a"), nil))
	done := make(chan error, 2)
	run := func() { done <- e.Invoke(context.Background(), "a", &call.Request{Input: []byte{1}}) }
	go run()
	first := <-entered
	go run() // its instance goes to the other device, whose room the first did not reserve
	select {
	case second := <-entered:
		if second == first {
			t.Errorf("both loads on one device")
		}
	case <-time.After(10 * time.Second):
		t.Errorf("the second cold start's load, on the other device, did not begin while the first's ran")
	}
	close(release)
	for range 2 {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}
