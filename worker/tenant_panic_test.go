package worker

import (
	"context"
	"os"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/internal/testkit"
)

// nameBugDevice is the host device whose Name panics while armed (a bug
// in a device's Go code).
type nameBugDevice struct {
	device.Device
	armed atomic.Bool
}

func (d *nameBugDevice) Name() string {
	if d.armed.Load() {
		panic("a device bug in Name")
	}
	return d.Device.Name()
}

// A cold load places its program in its tenant's worker under the
// device's lock (placeTenant), where a tenant whose workers keep dying is
// refused in a message naming the device. Before the fix a panic there,
// recovered by the transport (the load runs in the request's goroutine),
// left the lock held: every later load of any tenant, a worker's start and
// its reaping hung.
func TestPlaceTenantPanicLeavesDeviceUsable(t *testing.T) {
	base := &nameBugDevice{Device: device.NewHost(0)}
	d := NewDevice(Options{Exe: os.Args[0], Base: base, Landlock: true, StageDir: t.TempDir(), Spawner: spawner, TenantScope: true})
	t.Cleanup(func() { d.Close() })
	d.mu.Lock()
	d.churn["a"] = &tenantChurn{until: time.Now().Add(time.Hour)} // its workers kept dying
	d.mu.Unlock()
	m := testkit.Manifest("f")
	dir := testkit.BundleDir(t, m, nil)
	base.armed.Store(true)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the load did not panic")
			}
			if st := string(debug.Stack()); !strings.Contains(st, "placeTenant") {
				t.Fatalf("the panic was not placeTenant's:\n%s", st)
			}
		}()
		d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m, Tenant: "a"})
	}()
	base.armed.Store(false)
	done := make(chan error, 1)
	go func() {
		p, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m, Tenant: "b"})
		if err == nil {
			p.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("another tenant's load after the panic: %v", err)
		}
	case <-time.After(10 * time.Second):
		held := !d.mu.TryLock()
		d.mu.Unlock() // ours, or the one the panic left: the cleanup's Close takes it
		t.Fatalf("another tenant's load still hangs after 10 s (the device's lock held: %v)", held)
	}
}
