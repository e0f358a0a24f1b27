package engine_test

import (
	"context"
	"testing"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
)

// A panic between a request's take of an instance and its run closes the
// instance, as a panic in the run does: in the lookup of a chain
// override's kernels (a device's Go code), or in the device's health check
// of an idle instance taken. Before the fix only runOn guarded it: the
// instance was never put back nor closed (Closed 0), counted live for
// good, and the next request made another.
func TestPanicBeforeTheRunClosesTheInstance(t *testing.T) {
	for _, tc := range []struct {
		name string
		warm bool // an idle instance to take
		arm  func(d *testkit.PanicDevice, req *call.Request)
	}{
		{"chain lookup", false, func(_ *testkit.PanicDevice, req *call.Request) {
			req.Override = &call.Override{Chain: []abi.Launch{{Kernel: testkit.PanicKernel, Grid: 1, Block: 1}}, OutBytes: -1, TmpBytes: -1}
		}},
		{"idle instance's health", true, func(d *testkit.PanicDevice, _ *call.Request) { d.HealthBug.Store(true) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev := &testkit.PanicDevice{Device: device.NewHost(0)}
			e := testkit.Engine(t, engine.Config{Devices: []device.Device{dev}})
			testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
			if tc.warm {
				if err := e.Invoke(context.Background(), "echo", &call.Request{Input: []byte("x")}); err != nil {
					t.Fatal(err)
				}
			}
			req := &call.Request{Input: []byte("x")}
			tc.arm(dev, req)
			func() {
				defer func() {
					if recover() == nil {
						t.Fatal("the request did not panic")
					}
				}()
				e.Invoke(context.Background(), "echo", req)
			}()
			if made, closed := dev.Made.Load(), dev.Closed.Load(); made != 1 || closed != 1 {
				t.Fatalf("after the panic: %d instances made, %d closed; want the one taken closed", made, closed)
			}
			if err := e.Invoke(context.Background(), "echo", &call.Request{Input: []byte("x")}); err != nil {
				t.Fatalf("the next request: %v", err)
			}
		})
	}
}
