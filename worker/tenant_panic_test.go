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

// targetBugDevice is the host device whose Target panics, while armed,
// when called from a frame named in (a bug in a device's Go code in a
// worker's start: "workerCommand", ".start(").
type targetBugDevice struct {
	device.Device
	in    string
	armed atomic.Bool
}

func (d *targetBugDevice) Target() string {
	if d.armed.Load() && strings.Contains(string(debug.Stack()), d.in) {
		panic("a device bug in Target")
	}
	return d.Device.Target()
}

// A load that starts its tenant's worker marks the start under way, and
// the tenant's other loads wait for it. Before the fix a panic in the start
// (recovered by the request's transport) left it marked for good: the
// tenant's every later load waited until its deadline, and the control
// channel and stage the start had made leaked.
func TestPanicInATenantsWorkerStartLeavesTheTenantUsable(t *testing.T) {
	base := &targetBugDevice{Device: device.NewHost(0), in: "workerCommand"}
	stages := t.TempDir()
	d := NewDevice(Options{Exe: os.Args[0], Base: base, Landlock: true, StageDir: stages, Spawner: spawner, TenantScope: true})
	t.Cleanup(func() { d.Close() })
	m := testkit.Manifest("f")
	dir := testkit.BundleDir(t, m, nil)
	sockets := openSockets(t)
	loadPanicking(t, d, base, device.ProgramSpec{Dir: dir, Manifest: m, Tenant: "a"})
	if left, _ := os.ReadDir(stages); len(left) != 0 {
		t.Errorf("the panicked start left %d stage directories", len(left))
	}
	if n := openSockets(t); n > sockets {
		t.Errorf("the panicked start left %d sockets open", n-sockets)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := d.Load(ctx, device.ProgramSpec{Dir: dir, Manifest: m, Tenant: "a"})
	if err != nil {
		t.Fatalf("the tenant's next load after a panic in its worker's start: %v", err)
	}
	p.Close()
}

// openSockets counts this process's open sockets.
func openSockets(t *testing.T) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, fd := range fds {
		if l, err := os.Readlink("/proc/self/fd/" + fd.Name()); err == nil && strings.HasPrefix(l, "socket:") {
			n++
		}
	}
	return n
}

// loadPanicking loads spec on d with base's bug armed, and fails the test
// unless the load panics (as the transport would recover it).
func loadPanicking(t *testing.T, d *Device, base *targetBugDevice, spec device.ProgramSpec) {
	t.Helper()
	base.armed.Store(true)
	defer base.armed.Store(false)
	defer func() {
		if recover() == nil {
			t.Fatal("the load did not panic")
		}
	}()
	d.Load(context.Background(), spec)
}
