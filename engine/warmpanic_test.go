package engine_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
)

// A deploy whose pre-warm panics in the device's Go code (Health, as a
// transport recovers it) gives back the slot the warm took: with
// max_instances 1 the next request runs. Before, the slot stayed held with
// no instance: every request waited out its deadline, and the reaper,
// reading an instance being made, never topped the function up.
func TestPrewarmPanicGivesBackItsSlot(t *testing.T) {
	dev := &testkit.PanicDevice{Device: device.NewHost(0)}
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{dev}, Timeout: 2 * time.Second})
	m := testkit.Manifest("a")
	m.MinInstances, m.MaxInstances = 1, 1
	raw, _, _, err := bundle.PackBytes(testkit.BundleDir(t, m, nil))
	if err != nil {
		t.Fatal(err)
	}
	dev.HealthBug.Store(true)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the deploy's pre-warm did not panic")
			}
		}()
		e.Control().Deploy(context.Background(), "a", bytes.NewReader(raw), false)
	}()
	if err := e.Invoke(context.Background(), "a", &call.Request{Input: []byte{1}}); err != nil {
		t.Fatalf("a request after the panicked pre-warm: %v", err)
	}
	if !e.BreakIdle("a") {
		t.Fatal("the request left no idle instance")
	}
	e.Reap(time.Now().Add(time.Minute))
	testkit.WaitFor(t, e, "a", "its top-up to min_instances 1", idle(1))
}

// idle is a testkit.WaitFor condition: n instances idle.
func idle(n int) func(api.FunctionInfo) bool {
	return func(fi api.FunctionInfo) bool { return fi.Idle == n }
}
