package worker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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
	return tenantCUDAWith(t, dirs, "")
}

// tenantCUDAWith is tenantCUDA with FAKEBUNDLE_HOLD set to hold in its
// workers (the fake bundle's way to hold a run or a load in host code,
// with a file outside the stage), and so without Landlock; hold "": none.
func tenantCUDAWith(t *testing.T, dirs int, hold string) (*Device, []string) {
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
	opts := Options{Exe: os.Args[0], Base: fakeGPU{}, Driver: filepath.Join(fakeDir, "libfakecuda.so"),
		Landlock: hold == "", StageDir: t.TempDir(), Spawner: spawner, TenantScope: true}
	if hold != "" {
		opts.env = []string{"FAKEBUNDLE_HOLD=" + hold}
	}
	d := NewDevice(opts)
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
// retried, its back-off counting another function's fault; and a fault in
// plover_load named no one (the load's program was gone from the worker's
// list when its death was judged), its error neither its kernel's nor a
// loss (the engine answered 503 and never backed the function off).
func TestTenantCUDAFaultNamesItsProgram(t *testing.T) {
	for _, where := range []string{"run", "plover_instance_init", "plover_instance_fini", "plover_load"} {
		t.Run(where, func(t *testing.T) {
			d, dirs := tenantCUDA(t, 2)
			ma := fakeManifest(abi.Launch{Kernel: "pl_load", Grid: 1, Block: 64}, abi.Launch{Kernel: "pl_store", Grid: 1, Block: 64})
			ma.Name = "faulty"
			mb := fakeManifest(abi.Launch{Kernel: "pl_nap", Grid: 1, Block: 64})
			mb.Name = "sibling"
			b := loadDir(t, d, "t", dirs[1], mb, nil).(*program)
			var a *program // loaded below, but for the row whose load faults
			if where != "plover_load" {
				a = loadDir(t, d, "t", dirs[0], ma, nil).(*program)
				if a.PID() != b.PID() {
					t.Fatalf("the tenant's programs run in workers %d and %d, want one", a.PID(), b.PID())
				}
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
			case "plover_load":
				if werr := os.WriteFile(filepath.Join(dirs[0], "c15.bin"), make([]byte, 15), 0o644); werr != nil {
					t.Fatal(werr)
				}
				ma.Constants = "c15.bin" // 15 bytes: the fake bundle's plover_load faults
				_, err = d.Load(context.Background(), device.ProgramSpec{Dir: dirs[0], Manifest: ma, Tenant: "t"})
			}
			if where != "plover_instance_fini" {
				var ke *device.KernelError
				if lost, shared := collateral(err); !errors.As(err, &ke) || !lost || shared {
					t.Fatalf("the faulting %s: %v (lost %v, collateral %v), want its kernel error and its own loss", where, err, lost, shared)
				}
			}
			select {
			case <-b.p.done:
			case <-time.After(10 * time.Second):
				t.Fatal("the worker whose context faulted is still alive 10 s later")
			}
			if a != nil {
				if l := a.Death(); l == nil || l.Collateral() {
					t.Errorf("the faulting program's death: %v, want its own", l)
				}
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

// mappedCopies is how many files named like file are mapped in process
// pid: the copies of a bundle's library loaded there.
func mappedCopies(t *testing.T, pid int, file string) int {
	t.Helper()
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatalf("the worker's mappings: %v", err)
	}
	seen := map[string]bool{}
	for _, l := range strings.Split(string(maps), "\n") {
		if i := strings.IndexByte(l, '/'); i >= 0 && strings.Contains(l[i:], file) {
			seen[l[i:]] = true
		}
	}
	return len(seen)
}

// A CUDA library is never unmapped, and each load of one into a tenant's
// worker maps a copy of its own: a function scaling to zero and back
// beside siblings that keep the worker alive left a copy at each cycle,
// until the worker passed its memory limit and died with them. Now the
// worker takes no new load once stuckCopies such copies are left (the
// function's next load starts another worker, which ends with it), keeps
// serving its siblings, counts each copy in its memory limit meanwhile,
// and ends with its last sibling. Before, 10 cycles left 11 copies mapped.
func TestTenantCUDAReloadsAreBounded(t *testing.T) {
	d, dirs := tenantCUDA(t, 3)
	mk := func(name string) *abi.Manifest {
		m := fakeManifest(abi.Launch{Kernel: "pl_load", Grid: 1, Block: 64}, abi.Launch{Kernel: "pl_store", Grid: 1, Block: 64})
		m.Name, m.MaxHostMemoryMB = name, 64
		return m
	}
	run := func(what string, p device.Program, m *abi.Manifest) {
		t.Helper()
		in, err := p.NewInstance(device.InstanceConfig{MaxInput: 64, Tmp: 64, Out: 64})
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		defer in.Close()
		out := make([]byte, 64)
		if err := in.Run(&device.Run{Input: []byte(what), Output: out, TmpLen: 64,
			Chain: []device.Step{{Entry: 0, Grid: 1, Block: 64}, {Entry: 1, Grid: 1, Block: 64}}}); err != nil || string(out[:len(what)]) != what {
			t.Fatalf("%s: %v, output %q", what, err, out[:len(what)])
		}
	}
	keep, other := mk("keep"), mk("other")
	kp, err := d.Load(context.Background(), device.ProgramSpec{Dir: dirs[0], Manifest: keep, Tenant: "t"})
	if err != nil {
		t.Fatal(err)
	}
	op, err := d.Load(context.Background(), device.ProgramSpec{Dir: dirs[1], Manifest: other, Tenant: "t"})
	if err != nil {
		t.Fatal(err)
	}
	w := kp.(*program).p
	if pidOf(op) != w.pid {
		t.Fatal("the tenant's siblings are not in one worker")
	}
	const cycles = 10
	for i := 1; i <= cycles; i++ {
		cyc := mk("cycles")
		p, err := d.Load(context.Background(), device.ProgramSpec{Dir: dirs[2], Manifest: cyc, Tenant: "t"})
		if err != nil {
			t.Fatalf("cycle %d: %v", i, err)
		}
		in := pidOf(p) == w.pid
		run(fmt.Sprintf("cycle %d", i), p, cyc)
		p.Close()
		run(fmt.Sprintf("keep after cycle %d", i), kp, keep)
		// The siblings' two, and the cycling function's copies left.
		if n, most := mappedCopies(t, w.pid, "fakebundle.so"), 2+stuckCopies; n > most {
			t.Fatalf("after cycle %d: %d copies of the library mapped in the siblings' worker, want %d at most", i, n, most)
		}
		if in != (i <= stuckCopies) {
			t.Fatalf("cycle %d loaded in the siblings' worker: %v, want %v (%d copies left there before)", i, in, i <= stuckCopies, i-1)
		}
		if i > stuckCopies {
			waitFor(t, "the cycling function's worker to end with it", func() bool { return procCount(d) == 1 })
		}
	}
	if n := mappedCopies(t, w.pid, "fakebundle.so"); n != 2+stuckCopies {
		t.Errorf("%d copies of the library mapped in the siblings' worker, want %d", n, 2+stuckCopies)
	}
	// Each copy left counts in the worker's memory limit, beside the
	// siblings' own.
	if got, want := w.memLimit.Load(), int64(2+stuckCopies)*64<<20; got != want {
		t.Errorf("the siblings' worker's memory limit: %d MiB, want %d MiB", got>>20, want>>20)
	}
	// Retired, it ends with its last program, not its first.
	op.Close()
	run("keep after its sibling's unload", kp, keep)
	if !w.alive() {
		t.Fatal("the retired worker ended with one of its two programs")
	}
	kp.Close()
	select {
	case <-w.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the retired worker outlived its last program")
	}
}

// A sibling's control call that meets the sticky error another program's
// kernel left, in the driver calls around its hooks (an instance's
// buffers, a load's constants and stream, an unload's frees) before that
// program's run returned, ran nothing that could have made it: the worker
// names the program whose kernel faulted, not the sibling. Before, the
// control loop named whichever call met the fault on a device it had found
// healthy: the sibling lost the worker as its own crash (its request
// failed with the other's CUDA error, its back-off counting it) and the
// program at fault was retried as a bystander.
func TestTenantCUDAControlCallMeetingAnothersFaultClaimsNothing(t *testing.T) {
	// A load meeting the fault before its hook ran is device's
	// TestFakeFaultMetBeforeItsOwnCodeIsNotItsOwn; the worker judges its
	// reply as it does these.
	for _, call := range []string{"creating an instance", "unloading"} {
		t.Run(call, func(t *testing.T) {
			hold := filepath.Join(t.TempDir(), "hold")
			d, dirs := tenantCUDAWith(t, 2, hold)
			t.Cleanup(func() { os.Remove(hold) }) // before the device's close: a run held lets go
			ma := fakeManifest(abi.Launch{Kernel: "pl_fault", Grid: 1, Block: 1}, abi.Launch{Kernel: "pl_hold", Grid: 20000, Block: 1})
			ma.Name = "faulty"
			mb := fakeManifest(abi.Launch{Kernel: "pl_load", Grid: 1, Block: 64}, abi.Launch{Kernel: "pl_store", Grid: 1, Block: 64})
			mb.Name = "sibling"
			a := loadDir(t, d, "t", dirs[0], ma, nil).(*program)
			b := loadDir(t, d, "t", dirs[1], mb, nil).(*program)
			if a.PID() != b.PID() {
				t.Fatalf("the tenant's programs run in workers %d and %d, want one", a.PID(), b.PID())
			}
			in := newInst(t, a, ma)
			done := make(chan error, 1)
			go func() {
				// pl_fault's kernel poisons the context; pl_hold keeps the
				// run in host code until the file goes: the fault is there,
				// its run not yet returned to claim it.
				done <- in.Run(&device.Run{Output: make([]byte, 64), TmpLen: 64,
					Chain: []device.Step{{Entry: 0, Grid: 1, Block: 1}, {Entry: 1, Grid: 20000, Block: 1}}, Deadline: time.Now().Add(time.Minute)})
			}()
			waitFor(t, "the faulting run to hold in host code", func() bool { _, err := os.Stat(hold); return err == nil })
			asked := b.callEnded.Load()
			answered := make(chan error, 1)
			go func() {
				switch call {
				case "creating an instance":
					_, err := b.NewInstance(device.InstanceConfig{MaxInput: 64, Tmp: 64, Out: 64})
					answered <- err
				case "unloading":
					answered <- b.Close()
				}
			}()
			// Its reply came (the worker exits once it claimed, or gave up
			// on a claim): the faulting run may return now, and claims.
			waitFor(t, "the sibling's call to be answered", func() bool { return b.callEnded.Load() != asked })
			os.Remove(hold)
			err := <-answered
			t.Logf("the sibling's %s: %v", call, err)
			var ke *device.KernelError
			if err := <-done; !errors.As(err, &ke) {
				t.Errorf("the faulting run: %v, want its kernel error", err)
			} else if lost, shared := collateral(err); !lost || shared {
				t.Errorf("the faulting run: %v (lost %v, collateral %v), want its own loss", err, lost, shared)
			}
			select {
			case <-a.p.done:
			case <-time.After(10 * time.Second):
				t.Fatal("the worker whose context faulted is still alive 10 s later")
			}
			if l := a.Death(); l == nil || l.Collateral() {
				t.Errorf("the faulting program's death: %v, want its own", l)
			}
			if lost, shared := collateral(err); lost && !shared {
				t.Errorf("the sibling's %s: %v, lost as its own crash; want the loss collateral", call, err)
			}
			if call != "unloading" {
				if l := b.Death(); l == nil || !l.Collateral() {
					t.Errorf("the sibling's death: %v, want a collateral loss", l)
				}
			}
			if n := churnDeaths(d, "t"); n != 0 {
				t.Errorf("the tenant's back-off counted %d deaths, want none: the program at fault was named", n)
			}
		})
	}
}

// A hook still in host code after it faulted the device claims the fault
// once it returns, and the worker waits for that claim: a sibling's run
// that met the fault before its own chain launched (no claim of its own)
// loses the worker as collateral. Before, the worker waited for chains in
// flight only, exited 100 ms after the sibling's reply with no claim, and
// the server blamed every program: the sibling's request failed with the
// other's CUDA error, its crash counted.
func TestTenantCUDAFaultingHookIsWaitedFor(t *testing.T) {
	hold := filepath.Join(t.TempDir(), "faulted")
	d, dirs := tenantCUDAWith(t, 2, hold)
	mb := fakeManifest(abi.Launch{Kernel: "pl_load", Grid: 1, Block: 64}, abi.Launch{Kernel: "pl_store", Grid: 1, Block: 64})
	mb.Name = "sibling"
	b := loadDir(t, d, "t", dirs[1], mb, nil).(*program)
	in := newInst(t, b, mb)
	if err := os.WriteFile(filepath.Join(dirs[0], "c16.bin"), make([]byte, 16), 0o644); err != nil {
		t.Fatal(err)
	}
	ma := fakeManifest(mb.Chain...)
	ma.Name, ma.Constants = "faulty", "c16.bin" // 16 bytes: plover_load faults, then stays 300 ms
	loaded := make(chan error, 1)
	go func() {
		_, err := d.Load(context.Background(), device.ProgramSpec{Dir: dirs[0], Manifest: ma, Tenant: "t"})
		loaded <- err
	}()
	waitFor(t, "plover_load to fault", func() bool { _, err := os.Stat(hold); return err == nil })
	rerr := in.Run(&device.Run{Input: []byte("x"), Output: make([]byte, 64), TmpLen: 64,
		Chain: []device.Step{{Entry: 0, Grid: 1, Block: 64}, {Entry: 1, Grid: 1, Block: 64}}, Deadline: time.Now().Add(time.Minute)})
	if lost, shared := collateral(rerr); !lost || !shared {
		t.Errorf("the sibling's run: %v (lost %v, collateral %v), want a collateral loss", rerr, lost, shared)
	}
	lerr := <-loaded
	var ke *device.KernelError
	if lost, shared := collateral(lerr); !errors.As(lerr, &ke) || !lost || shared {
		t.Errorf("the faulting load: %v (lost %v, collateral %v), want its kernel error and its own loss", lerr, lost, shared)
	}
	if n := churnDeaths(d, "t"); n != 0 {
		t.Errorf("the tenant's back-off counted %d deaths, want none: the program at fault was named", n)
	}
}
