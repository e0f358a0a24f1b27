package engine_test

import (
	"context"
	"errors"
	"testing"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
)

// sick is a device with a sticky fault.
type sick struct{ device.Device }

func (sick) Health() error { return errors.New("a sticky fault") }

// A function only the node's larger device can hold, that device faulted:
// 503, no healthy device (it may recover, or the client may go to another
// node), not 422 from the smaller device that could never hold it, which
// a client takes as its bundle's fault and does not retry.
func TestTooSmallDeviceDoesNotHideAFaultedOne(t *testing.T) {
	const mib = 1 << 20
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{device.NewHost(mib), sick{device.NewHost(3 * mib)}}})
	m := testkit.Manifest("big")
	m.Constants = "w.bin"
	testkit.Deploy(t, e, testkit.BundleDir(t, m, make([]byte, 2*mib)))
	err := e.Invoke(context.Background(), "big", &call.Request{Input: []byte{1}})
	if k := errdefs.KindOf(err); k != errdefs.KindUnavailable {
		t.Fatalf("invoke with the only device large enough faulted: %v (kind %v), want unavailable (503)", err, k)
	}
}
