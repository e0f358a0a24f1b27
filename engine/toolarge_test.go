package engine_test

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
	"github.com/plover-run/plover/worker"
)

// A function whose constants and one instance's buffers are more than its
// device's whole memory can never run there. Its deploy is refused (422,
// naming the field) instead of taken and then answered 503 "idle functions
// hold too little" at every invoke, which a client retries forever; and a
// node whose device is smaller than the deploying node's answers its
// invokes 422 the same way.
func TestFunctionLargerThanItsDevice(t *testing.T) {
	const total = 1 << 20
	m := testkit.Manifest("big")
	per := m.MaxInputBytes + m.TmpBytes + m.OutBytes
	small := func(store objectstore.Store) *engine.Engine {
		return testkit.Engine(t, engine.Config{Store: store, Devices: []device.Device{device.NewHost(total)}})
	}
	deploy := func(e *engine.Engine, dir string) error {
		b, _, m, err := bundle.PackBytes(dir)
		if err != nil {
			t.Fatal(err)
		}
		_, err = e.Control().Deploy(context.Background(), m.Name, bytes.NewReader(b), false)
		return err
	}
	withConsts := func(n int64) string {
		mc := *m
		mc.Constants = "w.bin"
		return testkit.BundleDir(t, &mc, make([]byte, n))
	}
	buffers := *m
	buffers.MaxInputBytes = 2 * total
	for _, tt := range []struct {
		name, dir, field string
	}{
		{"constants over the device", withConsts(total + 1), "constants: w.bin is "},
		{"constants and one instance over it", withConsts(total - per + 1), "constants: w.bin is "},
		{"one instance over it", testkit.BundleDir(t, &buffers, nil), "max_input_bytes + tmp_bytes + out_bytes: one instance"},
	} {
		err := deploy(small(nil), tt.dir)
		if errdefs.KindOf(err) != errdefs.KindInvalid || !strings.HasPrefix(err.Error(), tt.field) || !strings.Contains(err.Error(), "1048576") {
			t.Errorf("%s: deploy answered %v (kind %v), want 422 starting %q and naming the device's 1048576 bytes", tt.name, err, errdefs.KindOf(err), tt.field)
		}
	}
	// On the host its constants live in its worker: more than its own
	// max_host_memory_mb would have the worker killed at every load. In
	// the server (--isolation none) nothing enforces the field: it runs.
	limited := *m
	limited.Constants, limited.MaxHostMemoryMB = "w.bin", 1
	limitedDir := testkit.BundleDir(t, &limited, make([]byte, 2<<20))
	wd := worker.NewDevice(worker.Options{Exe: os.Args[0], Base: device.NewHost(0), Landlock: true, StageDir: t.TempDir(), Spawner: spawner})
	t.Cleanup(func() { wd.Close() })
	err := deploy(testkit.Engine(t, engine.Config{Devices: []device.Device{wd}}), limitedDir)
	if errdefs.KindOf(err) != errdefs.KindInvalid || !strings.HasPrefix(err.Error(), "max_host_memory_mb: 1 MiB is less than the worker must hold") {
		t.Errorf("constants over max_host_memory_mb in a worker: deploy answered %v (kind %v), want 422 naming max_host_memory_mb", err, errdefs.KindOf(err))
	}
	shared, err := objectstore.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	inServer := testkit.Engine(t, engine.Config{Store: shared})
	if err := deploy(inServer, limitedDir); err != nil {
		t.Fatalf("constants over max_host_memory_mb in the server: %v", err)
	}
	invoke(t, inServer, "big", []byte{1})
	// Run on a node of workers, it is refused there (not loaded into a
	// worker its limit kills at every load).
	inWorkers := testkit.Engine(t, engine.Config{Store: shared, Devices: []device.Device{wd}})
	for range 2 {
		err = inWorkers.Invoke(context.Background(), "big", &call.Request{Input: []byte{1}})
		if errdefs.KindOf(err) != errdefs.KindInvalid || !strings.Contains(err.Error(), "max_host_memory_mb: 1 MiB is less than the worker must hold") {
			t.Errorf("invoke in a worker of a version deployed in the server: %v (kind %v), want 422 naming max_host_memory_mb", err, errdefs.KindOf(err))
		}
	}
	// One that just fits is deployed and runs.
	e := small(nil)
	if err := deploy(e, withConsts(total-per)); err != nil {
		t.Fatalf("a function that fits its device exactly: %v", err)
	}
	invoke(t, e, "big", []byte{1})

	// Deployed through a node with room, invoked on one without.
	store, err := objectstore.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	big := testkit.Engine(t, engine.Config{Store: store, Devices: []device.Device{device.NewHost(4 * total)}})
	if err := deploy(big, withConsts(2*total)); err != nil {
		t.Fatal(err)
	}
	other := small(store)
	err = other.Invoke(context.Background(), "big", &call.Request{Input: []byte{1}})
	if errdefs.KindOf(err) != errdefs.KindInvalid || !strings.Contains(err.Error(), "1048576") {
		t.Errorf("invoke on a node whose device is too small: %v (kind %v), want 422 naming the device's 1048576 bytes", err, errdefs.KindOf(err))
	}
}

// On a node with devices of several sizes a function goes to one whose
// whole memory can hold it, though a smaller one has more free: the
// larger one's idle functions are evicted for it, and it is not refused
// as too large for the device that happened to have the most free.
func TestFunctionGoesToADeviceLargeEnough(t *testing.T) {
	const mib = 1 << 20
	small, large := device.NewHost(mib), device.NewHost(3*mib)
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{small, large}})
	withConsts := func(name string, n int64) string {
		m := testkit.Manifest(name)
		m.Constants = "w.bin"
		return testkit.BundleDir(t, m, make([]byte, n))
	}
	testkit.Deploy(t, e, withConsts("filler", 2*mib)) // fits the large device only
	invoke(t, e, "filler", []byte{1})
	if free := large.MemInfo().Free; free >= small.MemInfo().Free {
		t.Fatalf("the large device has %d bytes free, the small %d: the case tests nothing", free, small.MemInfo().Free)
	}
	testkit.Deploy(t, e, withConsts("big", 2*mib))
	invoke(t, e, "big", []byte{1}) // on the large device, filler evicted
	if fi := info(t, e, "filler"); fi.Loaded {
		t.Errorf("filler still loaded: big did not take its room on the large device")
	}
}
