package engine_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/fakecuda"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/pipeline"
)

// One engine over a GPU (the fake driver) and the host device runs each
// bundle on the device its target names, a pipeline's steps on both, and
// refuses a target it has no device for naming the ones it has.
func TestHostAndCUDASideBySide(t *testing.T) {
	dir, err := fakecuda.Shared()
	if err != nil {
		t.Skipf("cannot build the fake CUDA driver: %v", err)
	}
	gpu, err := device.OpenOne(device.KindCUDA, 0, 0, filepath.Join(dir, "libfakecuda.so"), nil)
	if err != nil {
		t.Fatal(err)
	}
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{gpu, device.NewHost(0)}})
	t.Cleanup(func() { gpu.Close() })
	if got := strings.Join(e.Targets(), ","); got != "cuda,host" {
		t.Fatalf("targets %s", got)
	}

	host := testkit.Manifest("on-host")
	host.OutBytes = 64
	testkit.Deploy(t, e, testkit.BundleDir(t, host, nil))
	gdir := t.TempDir()
	lib, err := os.ReadFile(filepath.Join(dir, "fakebundle.so"))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(gdir, "fakebundle.so"), lib, 0o644)
	testkit.WriteManifest(t, gdir, &abi.Manifest{Name: "on-gpu", ABI: abi.Major, Target: abi.TargetCUDA, Library: "fakebundle.so",
		MaxInputBytes: 64, TmpBytes: 64, OutBytes: 64, Chain: []abi.Launch{{Kernel: "pl_load", Grid: 1, Block: 64},
			{Kernel: "pl_inc", Grid: 1, Block: 64}, {Kernel: "pl_store", Grid: 1, Block: 64}}})
	fi := testkit.Deploy(t, e, gdir)
	if fi.Target != abi.TargetCUDA {
		t.Fatalf("on-gpu target %q", fi.Target)
	}
	pdir := t.TempDir()
	os.WriteFile(filepath.Join(pdir, abi.ManifestFile), []byte(`{"name": "mixed", "kind": "pipeline", "steps": ["on-host", "on-gpu"]}`), 0o644)
	testkit.Deploy(t, e, pdir)

	in := []byte("cpu then gpu")
	want := make([]byte, 64)
	copy(want, in)
	for i := range want {
		want[i]++
	}
	req := &call.Request{Input: in}
	if err := pipeline.New(e, nil).Invoke(context.Background(), "mixed", req); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(req.Output, want) {
		t.Fatalf("mixed = %v, want %v", req.Output[:16], want[:16])
	}
	_, devs := e.Health()
	for _, d := range devs {
		if d.MemUsed <= 0 {
			t.Errorf("device %s (%s) holds nothing after the pipeline ran on both", d.Name, d.Target)
		}
	}
}

// A node with the host device alone refuses a cuda bundle at deploy,
// naming what it runs.
func TestDeployRefusesAnotherTarget(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	m := testkit.Manifest("gpu-only")
	m.Target = abi.TargetCUDA
	dir := testkit.BundleDir(t, m, nil)
	b, _, _, err := bundle.PackBytes(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.Control().Deploy(context.Background(), "gpu-only", bytes.NewReader(b), false)
	if errdefs.KindOf(err) != errdefs.KindInvalid || !strings.Contains(err.Error(), `this node's devices run "host"`) {
		t.Fatalf("err = %v", err)
	}
}
