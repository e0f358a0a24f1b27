package worker

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/worker/contain"
)

// A worker under MPS must reach its control daemon's pipe directory
// through its Landlock rules, or the CUDA driver quietly runs it without
// MPS. A bundle's read of a file there (the hostile read_file kernel)
// stands in for the driver's open of the daemon's pipes: allowed with
// Options.MPS, refused without.
func TestMPSWorkerReachesThePipeDirectory(t *testing.T) {
	if contain.LandlockABI() < 1 {
		t.Skip("no Landlock on this kernel")
	}
	pipes := t.TempDir()
	probe := filepath.Join(pipes, "control_pipe")
	const content = "mps-probe"
	if err := os.WriteFile(probe, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	// The server passes its CUDA_MPS_PIPE_DIRECTORY to an MPS worker
	// (mpsEnv); the worker's rules read it there.
	t.Setenv("CUDA_MPS_PIPE_DIRECTORY", pipes)
	for _, tc := range []struct {
		mps  bool
		want string
	}{{true, content}, {false, "ERR EACCES"}} {
		d := NewDevice(Options{Exe: os.Args[0], Base: device.NewHost(0), Landlock: true, StageDir: t.TempDir(), Spawner: spawner, MPS: tc.mps})
		t.Cleanup(func() { d.Close() })
		p, m := loadHostile(t, d, "read_file")
		r := oneStep(t, p, m, "read_file")
		r.Input = []byte(probe)
		if err := newInst(t, p, m).Run(r); err != nil {
			t.Fatalf("MPS %v: %v", tc.mps, err)
		}
		got := r.Output[:max(0, bytes.IndexByte(r.Output, 0))]
		if string(got) != tc.want {
			t.Errorf("MPS %v: read_file %s gave %q, want %q", tc.mps, probe, got, tc.want)
		}
	}
}
