package worker

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/internal/fakecuda"
)

// tenantCUDA is a tenant-scope Device whose workers run on the fake CUDA
// driver, and a directory holding the fake bundle's library, for dirs
// bundle directories of their own (each its own copy of the file).
func tenantCUDA(t *testing.T, dirs int) (*Device, []string) {
	t.Helper()
	fakeDir, err := fakecuda.Shared()
	if err != nil {
		t.Skipf("cannot build the fake CUDA driver: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(fakeDir, "fakebundle.so"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for range dirs {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "fakebundle.so"), b, 0o644); err != nil {
			t.Fatal(err)
		}
		out = append(out, dir)
	}
	d := NewDevice(Options{Exe: os.Args[0], Base: fakeGPU{}, Driver: filepath.Join(fakeDir, "libfakecuda.so"),
		Landlock: true, StageDir: t.TempDir(), Spawner: spawner, TenantScope: true})
	t.Cleanup(func() { d.Close() })
	return d, out
}

// A device fault in a tenant's worker (a sticky CUDA error, which poisons
// the one context every program there shares) is the fault of the program
// whose run or hook met it, which the worker names as it exits: that one
// loses the worker as its own crash; a sibling loses it as collateral,
// retried and not counted, its run in flight and its idle instance alike,
// and the tenant's back-off does not count the death. Before, the exit
// (status 71, no signal) blamed every program, the sibling's requests not
// retried, its back-off counting another function's fault.
func TestTenantCUDAFaultNamesItsProgram(t *testing.T) {
	for _, where := range []string{"run", "plover_instance_init", "plover_instance_fini"} {
		t.Run(where, func(t *testing.T) {
			d, dirs := tenantCUDA(t, 2)
			ma := fakeManifest(abi.Launch{Kernel: "pl_load", Grid: 1, Block: 64}, abi.Launch{Kernel: "pl_store", Grid: 1, Block: 64})
			ma.Name = "faulty"
			mb := fakeManifest(abi.Launch{Kernel: "pl_nap", Grid: 1, Block: 64})
			mb.Name = "sibling"
			a := loadDir(t, d, "t", dirs[0], ma, nil).(*program)
			b := loadDir(t, d, "t", dirs[1], mb, nil).(*program)
			if a.PID() != b.PID() {
				t.Fatalf("the tenant's programs run in workers %d and %d, want one", a.PID(), b.PID())
			}
			idle := newInst(t, b, mb)
			busy := newInst(t, b, mb)
			inFlight := make(chan error, 1)
			go func() {
				// Napping 5 s in host code, in no kernel: the fault comes meanwhile.
				inFlight <- busy.Run(&device.Run{Output: make([]byte, 64), TmpLen: 64,
					Chain: []device.Step{{Entry: 0, Grid: 5000, Block: 64}}, Deadline: time.Now().Add(time.Minute)})
			}()
			waitFor(t, "the sibling's run in flight", func() bool { return b.runs.Load() > 0 })

			var err error
			switch where {
			case "run":
				fault, ferr := a.Entry("pl_fault")
				if ferr != nil {
					t.Fatal(ferr)
				}
				in := newInst(t, a, ma)
				err = in.Run(&device.Run{Output: make([]byte, 64), Chain: []device.Step{{Entry: fault, Grid: 1, Block: 1}},
					Deadline: time.Now().Add(time.Minute)})
			case "plover_instance_init":
				_, err = a.NewInstance(device.InstanceConfig{MaxInput: 64, Tmp: 13, Out: 64}) // 13: the fake bundle's hook faults
			case "plover_instance_fini":
				in, ierr := a.NewInstance(device.InstanceConfig{MaxInput: 64, Tmp: 14, Out: 64}) // 14: its fini faults
				if ierr != nil {
					t.Fatal(ierr)
				}
				if rerr := in.Run(&device.Run{Input: []byte("x"), Output: make([]byte, 64), TmpLen: 14,
					Chain: []device.Step{{Entry: 0, Grid: 1, Block: 64}, {Entry: 1, Grid: 1, Block: 64}}}); rerr != nil {
					t.Fatal(rerr)
				}
				in.Close()
			}
			if where != "plover_instance_fini" {
				var ke *device.KernelError
				if lost, shared := collateral(err); !errors.As(err, &ke) || !lost || shared {
					t.Fatalf("the faulting %s: %v (lost %v, collateral %v), want its kernel error and its own loss", where, err, lost, shared)
				}
			}
			select {
			case <-a.p.done:
			case <-time.After(10 * time.Second):
				t.Fatal("the worker whose context faulted is still alive 10 s later")
			}
			if l := a.Death(); l == nil || l.Collateral() {
				t.Errorf("the faulting program's death: %v, want its own", l)
			}
			if l := b.Death(); l == nil || !l.Collateral() {
				t.Errorf("the sibling's death: %v, want a collateral loss (lost by another function)", l)
			}
			if lost, shared := collateral(<-inFlight); !lost || !shared {
				t.Errorf("the sibling's run in flight: lost %v, collateral %v; want a collateral loss (run again)", lost, shared)
			}
			err = idle.Run(&device.Run{Output: make([]byte, 64), TmpLen: 64, Chain: []device.Step{{Entry: 0, Grid: 1, Block: 64}}})
			if l, ok := device.AsLoss(err); !ok || !(l.RanNowhere() || l.Collateral()) {
				t.Errorf("the sibling's idle instance's next run: %v, want a loss before it ran or a collateral one", err)
			}
			if n := churnDeaths(d, "t"); n != 0 {
				t.Errorf("the tenant's back-off counted %d deaths, want none: the program at fault was named", n)
			}
		})
	}
}
