package worker

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/internal/fakecuda"
	"github.com/plover-run/plover/internal/racebuild"
	"github.com/plover-run/plover/internal/testkit"
)

// fakeGPU is the server's view of a CUDA device whose workers open the fake
// driver: the server itself holds no context.
type fakeGPU struct{}

func (fakeGPU) Target() string { return abi.TargetCUDA }
func (fakeGPU) Name() string   { return "fake GPU" }
func (fakeGPU) Load(context.Context, device.ProgramSpec) (device.Program, error) {
	return nil, errors.New("the server loads nothing itself")
}
func (fakeGPU) MemInfo() device.MemInfo { return device.MemInfo{Total: 1 << 30, Free: 1 << 30} }
func (fakeGPU) Health() error           { return nil }
func (fakeGPU) Close() error            { return nil }

// fakeCUDA is a Device whose workers run on the fake CUDA driver, and a
// CUDA-target bundle directory of the fake test kernels.
func fakeCUDA(t *testing.T) (*Device, string) {
	t.Helper()
	fakeDir, err := fakecuda.Shared()
	if err != nil {
		t.Skipf("cannot build the fake CUDA driver: %v", err)
	}
	bdir := t.TempDir()
	b, err := os.ReadFile(filepath.Join(fakeDir, "fakebundle.so"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bdir, "fakebundle.so"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	d := NewDevice(Options{Exe: os.Args[0], Base: fakeGPU{}, Driver: filepath.Join(fakeDir, "libfakecuda.so"),
		Standby: 1, Landlock: true, StageDir: t.TempDir(), Spawner: spawner})
	t.Cleanup(func() { d.Close() })
	return d, bdir
}

func fakeManifest(chain ...abi.Launch) *abi.Manifest {
	return &abi.Manifest{Name: "fake", ABI: abi.Major, Target: abi.TargetCUDA, Library: "fakebundle.so",
		MaxInputBytes: 64, TmpBytes: 64, OutBytes: 64, Chain: chain}
}

// TestCUDAWorkerFaultEndsOnlyItsWorker: on the fake driver, a CUDA bundle
// runs in a worker with a context of its own; a sticky fault fails that
// request naming the error and ends that worker, while the device stays
// healthy and the next worker runs the same bundle correctly.
func TestCUDAWorkerFaultEndsOnlyItsWorker(t *testing.T) {
	d, dir := fakeCUDA(t)
	m := fakeManifest(abi.Launch{Kernel: "pl_load", Grid: 1, Block: 64}, abi.Launch{Kernel: "pl_inc", Grid: 1, Block: 64},
		abi.Launch{Kernel: "pl_store", Grid: 1, Block: 64})
	run := func(p device.Program, in []byte) ([]byte, error) {
		inst, err := p.NewInstance(device.InstanceConfig{MaxInput: 64, Tmp: 64, Out: 64})
		if err != nil {
			t.Fatal(err)
		}
		defer inst.Close()
		out := make([]byte, 64)
		err = inst.Run(&device.Run{Input: in, Output: out, TmpLen: 64,
			Chain: []device.Step{{Entry: 0, Grid: 1, Block: 64}, {Entry: 1, Grid: 1, Block: 64}, {Entry: 2, Grid: 1, Block: 64}}})
		return out, err
	}
	want := make([]byte, 64)
	in := []byte("fake gpu")
	for i := range want {
		if i < len(in) {
			want[i] = in[i]
		}
		want[i]++
	}

	a, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if out, err := run(a, in); err != nil || !bytes.Equal(out, want) {
		t.Fatalf("chain through a CUDA worker: %v, %v; want %v", out[:8], err, want[:8])
	}
	fault, err := a.Entry("pl_fault")
	if err != nil {
		t.Fatal(err)
	}
	inst, err := a.NewInstance(device.InstanceConfig{MaxInput: 64, Tmp: 64, Out: 64})
	if err != nil {
		t.Fatal(err)
	}
	err = inst.Run(&device.Run{Output: make([]byte, 64), Chain: []device.Step{{Entry: fault, Grid: 1, Block: 1}}})
	inst.Close()
	var ke *device.KernelError
	var pe *ProcessExit
	if !errors.As(err, &ke) || !strings.Contains(ke.Msg, "CUDA_ERROR_ILLEGAL_ADDRESS") || !errors.As(err, &pe) {
		t.Fatalf("a sticky fault: %v, want a KernelError naming CUDA_ERROR_ILLEGAL_ADDRESS that ended the worker", err)
	}
	if a.(*program).Alive() {
		t.Error("the faulted worker is still alive")
	}
	if err := d.Health(); err != nil {
		t.Errorf("device health after a worker's fault: %v", err)
	}
	b, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m})
	if err != nil {
		t.Fatalf("a new worker after the fault: %v", err)
	}
	defer b.Close()
	if out, err := run(b, in); err != nil || !bytes.Equal(out, want) {
		t.Fatalf("chain on a fresh worker after the fault: %v, %v", out[:8], err)
	}
}

// TestCUDAWorkerUnderMPS: with MPS, the worker of a function with a
// gpu_share starts with it (and its memory budget) in its environment,
// before its device opens, and still runs the bundle.
func TestCUDAWorkerUnderMPS(t *testing.T) {
	fakeDir, err := fakecuda.Shared()
	if err != nil {
		t.Skipf("cannot build the fake CUDA driver: %v", err)
	}
	_, dir := fakeCUDA(t)
	d := NewDevice(Options{Exe: os.Args[0], Base: fakeGPU{}, Driver: filepath.Join(fakeDir, "libfakecuda.so"), Ordinal: 0,
		MPS: true, Landlock: true, StageDir: t.TempDir(), Spawner: spawner})
	defer d.Close()
	m := fakeManifest(abi.Launch{Kernel: "pl_load", Grid: 1, Block: 64})
	m.GPUShare = 40
	p, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m, MemoryBudget: 100 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	env, err := os.ReadFile("/proc/" + strconv.Itoa(p.(*program).PID()) + "/environ")
	if err != nil {
		t.Skipf("cannot read a worker's environment here: %v", err)
	}
	for _, v := range []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1124MB"} {
		if !bytes.Contains(env, []byte(v+"\x00")) {
			t.Errorf("worker environment lacks %s: %q", v, env)
		}
	}
	if _, err := p.Entry("pl_inc"); err != nil {
		t.Errorf("the MPS worker does not serve its bundle: %v", err)
	}
}

// TestDeviceUnhealthyWhenWorkersCannotOpenIt: one worker's failure is the
// worker's; workers failing to open the device in a row make it unhealthy,
// saying why, until one starts again.
func TestDeviceUnhealthyWhenWorkersCannotOpenIt(t *testing.T) {
	good, dir := fakeCUDA(t)
	d := NewDevice(Options{Exe: os.Args[0], Base: fakeGPU{}, Driver: "/nonexistent/libcuda.so.1",
		Landlock: true, StageDir: t.TempDir(), Spawner: spawner})
	defer d.Close()
	m := fakeManifest(abi.Launch{Kernel: "pl_load", Grid: 1, Block: 64})
	for i := 1; i <= startFailureLimit; i++ {
		_, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m})
		if err == nil {
			t.Fatal("a worker without a driver loaded a CUDA bundle")
		}
		// The worker's own reason reaches the error, not only the log.
		if !strings.Contains(err.Error(), "/nonexistent/libcuda.so.1") {
			t.Errorf("failed start: %v, want it to name the driver the worker could not load", err)
		}
		if err := d.Health(); (err == nil) != (i < startFailureLimit) {
			t.Fatalf("after %d failed starts: Health() = %v", i, err)
		}
	}
	if err := d.Health(); !errors.Is(err, device.ErrUnhealthy) || !strings.Contains(err.Error(), "could not open") ||
		!strings.Contains(err.Error(), "/nonexistent/libcuda.so.1") {
		t.Errorf("Health() = %v, want ErrUnhealthy saying the workers could not open it", err)
	}
	d.opts.Driver = good.opts.Driver // the device comes back
	p, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m})
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	if err := d.Health(); err != nil {
		t.Errorf("after a worker started again: Health() = %v", err)
	}
}

// A device fault inside plover_instance_init ends the worker as one in a
// chain does: the instance's creation fails naming the CUDA error, the
// worker is gone (not kept with a poisoned context), and the device stays
// healthy.
func TestCUDAInstanceInitFaultEndsItsWorker(t *testing.T) {
	d, dir := fakeCUDA(t)
	m := fakeManifest(abi.Launch{Kernel: "pl_inc", Grid: 1, Block: 64})
	p, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	_, err = p.NewInstance(device.InstanceConfig{MaxInput: 64, Tmp: 13, Out: 64}) // 13: the fake bundle's hook faults
	var ke *device.KernelError
	var pe *ProcessExit
	if !errors.As(err, &ke) || !strings.Contains(ke.Msg, "CUDA_ERROR_ILLEGAL_ADDRESS") || !errors.As(err, &pe) || strings.Count(err.Error(), "kernel failed") != 1 {
		t.Fatalf("a fault in plover_instance_init: %v, want a KernelError naming CUDA_ERROR_ILLEGAL_ADDRESS, said once, that ended the worker", err)
	}
	if p.(*program).Alive() {
		t.Error("the worker whose context faulted is still alive")
	}
	if err := d.Health(); err != nil {
		t.Errorf("device health after one worker's fault: %v", err)
	}
}

// A device fault inside plover_load ends the worker as one in
// plover_instance_init does: the load fails naming the CUDA error, as the
// function's own kernel failure and the loss of its worker (which the
// engine counts towards its back-off). Before, the load's error was a plain
// one, neither: the engine answered 503 "cannot load" and never backed the
// function off, each request taking a fresh worker and CUDA context.
func TestCUDALoadFaultEndsItsWorker(t *testing.T) {
	d, dir := fakeCUDA(t)
	if err := os.WriteFile(filepath.Join(dir, "c15.bin"), make([]byte, 15), 0o644); err != nil {
		t.Fatal(err)
	}
	m := fakeManifest(abi.Launch{Kernel: "pl_inc", Grid: 1, Block: 64})
	m.Constants = "c15.bin" // 15 bytes: the fake bundle's plover_load faults
	_, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m})
	var ke *device.KernelError
	if !errors.As(err, &ke) || !strings.Contains(ke.Msg, "CUDA_ERROR_ILLEGAL_ADDRESS") || strings.Count(err.Error(), "kernel failed") != 1 {
		t.Fatalf("a fault in plover_load: %v, want a KernelError naming CUDA_ERROR_ILLEGAL_ADDRESS, said once", err)
	}
	if l, ok := device.AsLoss(err); !ok || l.Collateral() || l.ByServer() {
		t.Errorf("a fault in plover_load: %v, want the loss of its worker, its own", err)
	}
	if err := d.Health(); err != nil {
		t.Errorf("device health after one worker's fault: %v", err)
	}
}

// A device fault inside plover_instance_fini (ignored, as documented) still
// poisons the worker's context: the worker ends then, as after a faulting
// chain, rather than staying with a context that fails its sibling
// instances' next requests (and holds its memory until one comes). The
// sibling's next request finds the worker gone before it ran, which the
// engine runs again on a fresh worker.
func TestCUDAInstanceFiniFaultEndsItsWorker(t *testing.T) {
	d, dir := fakeCUDA(t)
	m := fakeManifest(abi.Launch{Kernel: "pl_load", Grid: 1, Block: 64}, abi.Launch{Kernel: "pl_store", Grid: 1, Block: 64})
	p, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	doomed, err := p.NewInstance(device.InstanceConfig{MaxInput: 64, Tmp: 14, Out: 64}) // 14: the fake bundle's fini faults
	if err != nil {
		t.Fatal(err)
	}
	hookFaultEndsWorker(t, p, "plover_instance_fini", doomed.Close)
}

// hookFaultEndsWorker runs a chain (pl_load, pl_store) on an instance of
// sibling, then close, which runs a hook that faults the device in
// sibling's worker: the worker must end, and the instance's next request
// find it gone before it ran (the engine runs it again elsewhere).
func hookFaultEndsWorker(t *testing.T, sibling device.Program, hook string, close func()) {
	t.Helper()
	inst, err := sibling.NewInstance(device.InstanceConfig{MaxInput: 64, Tmp: 64, Out: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close()
	run := func() error {
		return inst.Run(&device.Run{Input: []byte("sibling"), Output: make([]byte, 64), TmpLen: 64,
			Chain: []device.Step{{Entry: 0, Grid: 1, Block: 64}, {Entry: 1, Grid: 1, Block: 64}}})
	}
	if err := run(); err != nil {
		t.Fatal(err)
	}
	close()
	select {
	case <-sibling.(*program).p.done:
	case <-time.After(10 * time.Second):
		t.Errorf("the worker whose context %s faulted is still alive 10 s later", hook)
	}
	err = run()
	if l, ok := device.AsLoss(err); !ok || !(l.RanNowhere() || l.Collateral()) {
		t.Errorf("the sibling's next request: %v, want it lost with the worker before it ran, not run on its poisoned context", err)
	}
}

// In a tenant's worker, a device fault inside one program's plover_unload
// ends the worker then: its siblings' next requests find it gone before
// they ran (lost with it, run again on a fresh worker), rather than failing
// on the poisoned context as their own faults.
func TestCUDAUnloadFaultEndsTenantWorker(t *testing.T) {
	fakeDir, err := fakecuda.Shared()
	if err != nil {
		t.Skipf("cannot build the fake CUDA driver: %v", err)
	}
	_, dir := fakeCUDA(t)
	if err := os.WriteFile(filepath.Join(dir, "c13.bin"), make([]byte, 13), 0o644); err != nil {
		t.Fatal(err)
	}
	d := NewDevice(Options{Exe: os.Args[0], Base: fakeGPU{}, Driver: filepath.Join(fakeDir, "libfakecuda.so"),
		Landlock: true, StageDir: t.TempDir(), Spawner: spawner, TenantScope: true})
	defer d.Close()
	chain := []abi.Launch{{Kernel: "pl_load", Grid: 1, Block: 64}, {Kernel: "pl_store", Grid: 1, Block: 64}}
	ma := fakeManifest(chain...)
	ma.Name, ma.Constants = "unloadfault", "c13.bin" // 13 bytes: the fake bundle's plover_unload faults
	mb := fakeManifest(chain...)
	mb.Name = "sibling"
	a, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: ma, Tenant: "t"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: mb, Tenant: "t"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if pa, pb := a.(*program).PID(), b.(*program).PID(); pa != pb {
		t.Fatalf("the tenant's programs run in workers %d and %d, want one", pa, pb)
	}
	hookFaultEndsWorker(t, b, "plover_unload", func() { a.Close() })
}

// An MPS client the server terminated (CUDA_ERROR_MPS_CLIENT_TERMINATED:
// "to continue using CUDA, the process must be terminated and relaunched")
// ends its worker as an illegal address does: the request fails naming it,
// and the next one runs on a fresh worker instead of meeting the same error.
// So does an MPS server lost under a worker (it died, restarts, or
// recovers from a fault: 805-809), which the driver does not call sticky
// but which every later call meets again: a worker that stayed answered
// each request 500 kernel_failed.
func TestCUDAMPSClientTerminatedEndsItsWorker(t *testing.T) {
	for _, c := range []struct {
		code int
		name string
	}{{810, "CUDA_ERROR_MPS_CLIENT_TERMINATED"}, {805, "CUDA_ERROR_MPS_CONNECTION_FAILED"},
		{806, "CUDA_ERROR_MPS_RPC_FAILURE"}, {807, "CUDA_ERROR_MPS_SERVER_NOT_READY"}} {
		code, name := c.code, c.name
		t.Run(name, func(t *testing.T) {
			d, dir := pinCUDA(t, 0, nil, "FAKECUDA_FAULT="+strconv.Itoa(code)) // what pl_fault's kernel leaves
			m := fakeManifest(abi.Launch{Kernel: "pl_load", Grid: 1, Block: 64}, abi.Launch{Kernel: "pl_store", Grid: 1, Block: 64})
			p, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			fault, err := p.Entry("pl_fault")
			if err != nil {
				t.Fatal(err)
			}
			inst, err := p.NewInstance(device.InstanceConfig{MaxInput: 64, Tmp: 64, Out: 64})
			if err != nil {
				t.Fatal(err)
			}
			defer inst.Close()
			err = inst.Run(&device.Run{Output: make([]byte, 64), TmpLen: 64, Chain: []device.Step{{Entry: fault, Grid: 1, Block: 1}}})
			var ke *device.KernelError
			var pe *ProcessExit
			if !errors.As(err, &ke) || !strings.Contains(ke.Msg, name) || !errors.As(err, &pe) {
				t.Errorf("%s: %v, want a KernelError naming it that ended the worker", name, err)
			}
			if p.(*program).Alive() {
				err := inst.Run(&device.Run{Input: []byte("next"), Output: make([]byte, 64), TmpLen: 64,
					Chain: []device.Step{{Entry: 0, Grid: 1, Block: 64}, {Entry: 1, Grid: 1, Block: 64}}})
				t.Errorf("the worker is still alive; its next request: %v", err)
			}
			if err := d.Health(); err != nil {
				t.Errorf("device health after one worker's %s: %v", name, err)
			}
		})
	}
}

// A lost MPS server met inside a hook (plover_load's) ends the worker as
// one met by a run does: the load fails naming it, as the loss of its
// worker.
func TestCUDAMPSLostInAHookEndsItsWorker(t *testing.T) {
	d, dir := pinCUDA(t, 0, nil, "FAKECUDA_FAULT=806") // what plover_load's faulting kernel leaves
	if err := os.WriteFile(filepath.Join(dir, "c15.bin"), make([]byte, 15), 0o644); err != nil {
		t.Fatal(err)
	}
	m := fakeManifest(abi.Launch{Kernel: "pl_inc", Grid: 1, Block: 64})
	m.Constants = "c15.bin" // 15 bytes: the fake bundle's plover_load faults
	_, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m})
	var ke *device.KernelError
	if !errors.As(err, &ke) || !strings.Contains(ke.Msg, "CUDA_ERROR_MPS_RPC_FAILURE") {
		t.Fatalf("CUDA_ERROR_MPS_RPC_FAILURE in plover_load: %v, want a KernelError naming it", err)
	}
	if l, ok := device.AsLoss(err); !ok || l.Collateral() || l.ByServer() {
		t.Errorf("CUDA_ERROR_MPS_RPC_FAILURE in plover_load: %v, want the loss of its worker, its own", err)
	}
	if err := d.Health(); err != nil {
		t.Errorf("device health after one worker's lost MPS server: %v", err)
	}
}

// pinCUDA is a fake CUDA device whose workers' driver gets env, and a
// bundle of the fake kernels: pl_copy's output is its input.
func pinCUDA(t *testing.T, limit int64, log *slog.Logger, env ...string) (*Device, string) {
	t.Helper()
	good, dir := fakeCUDA(t)
	d := NewDevice(Options{Exe: os.Args[0], Base: fakeGPU{}, Driver: good.opts.Driver, Standby: 1, Landlock: true,
		StageDir: t.TempDir(), Spawner: spawner, PinLimit: limit, Log: log, env: env,
		sampling: sampling{statsEvery: 50 * time.Millisecond, statsIdle: 50 * time.Millisecond, pssEvery: time.Hour, pssIdle: time.Hour}})
	t.Cleanup(func() { d.Close() })
	return d, dir
}

// loadCopy loads m (pl_copy's chain) into one of d's workers with an
// instance of its sizes; both end with the test.
func loadCopy(t *testing.T, d *Device, dir string, m *abi.Manifest) (device.Program, device.Instance) {
	t.Helper()
	p, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	inst, err := p.NewInstance(device.InstanceConfig{MaxInput: m.MaxInputBytes, Tmp: 64, Out: m.OutBytes})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(inst.Close)
	return p, inst
}

// copyRun runs pl_copy on in: a body in slot s (nil: ordinary memory);
// it returns the output and the bytes copied on the host.
func copyRun(t *testing.T, p device.Program, in device.Instance, s device.Slot, body []byte) ([]byte, int64) {
	t.Helper()
	entry, err := p.Entry("pl_copy")
	if err != nil {
		t.Fatal(err)
	}
	r := &device.Run{Input: body, Output: make([]byte, 64), Chain: []device.Step{{Entry: entry, Grid: 1, Block: 64}}}
	if s != nil {
		n := copy(s.Input(), body)
		r.Input, r.Output, r.Slot = s.Input()[:n], s.Output()[:64], s
	}
	if err := in.Run(r); err != nil {
		t.Fatal(err)
	}
	return bytes.Clone(r.Output[:len(body)]), r.Timing.Copied
}

// On CUDA a worker pins every slot it maps, whole: the pinned bytes are
// counted per device and bound the pool slots (PinLimit), and a worker's
// slots, resident however little a request touched, are left out of its
// max_host_memory_mb (three 32 MiB slots against 80 MiB here, where the
// fake driver's device buffers are 32 MiB of the worker's own memory). Pinned
// memory is given back with its worker.
func TestCUDASlotsPinnedAndBounded(t *testing.T) {
	if racebuild.Enabled {
		t.Skip("the race detector's memory passes the 80 MiB limit this test gives the worker, which then kills it")
	}
	const slot = 32 << 20
	d, dir := pinCUDA(t, 3*slot, nil)
	m := fakeManifest(abi.Launch{Kernel: "pl_copy", Grid: 1, Block: 64})
	m.MaxInputBytes, m.OutBytes, m.MaxHostMemoryMB = slot/2, slot/2, 80
	p, inst := loadCopy(t, d, dir, m)
	if got := d.Pinning(); got.Bytes != slot || got.Refused != 0 || got.Limit != 3*slot {
		t.Fatalf("after an instance: %+v, want its slot's %d bytes pinned", got, slot)
	}
	lent := lendAll(p.(device.Lender), m)
	if len(lent) != 2 || d.Pinning().Bytes != 3*slot {
		t.Fatalf("lent %d pool slots with %+v pinned; want 2, the bound met", len(lent), d.Pinning())
	}
	body := []byte("in a pinned slot")
	if out, copied := copyRun(t, p, inst, lent[0], body); copied != 0 || !bytes.Equal(out, body) {
		t.Fatalf("in a pinned pool slot: output %q, %d bytes copied on the host; want the body, none", out, copied)
	}
	for _, s := range lent {
		s.Release()
	}
	// The three slots are resident (pinned): once a sample shows them,
	// the memory limit was checked against that sample.
	g := p.(*program)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if s := g.p.sample.Load(); s != nil && s.rss >= 3*slot {
			break
		}
		if !g.Alive() {
			t.Fatalf("the worker was killed for its slots: %v", g.Death())
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pinned slots never showed resident: %+v", g.p.sample.Load())
		}
	}
	for range 2 { // and the next sample's check
		at := g.p.sample.Load().at
		for g.p.sample.Load().at == at && g.Alive() {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if !g.Alive() {
		t.Fatalf("the worker was killed for the server's slots: %v", g.Death())
	}
	if out, _ := copyRun(t, p, inst, nil, body); !bytes.Equal(out, body) {
		t.Fatalf("output %q", out)
	}
	inst.Close()
	p.Close()
	for deadline := time.Now().Add(5 * time.Second); d.Pinning().Bytes != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after the worker ended: %+v, want nothing pinned", d.Pinning())
		}
	}
}

// A pin the driver refuses is counted and logged, once a worker, and runs
// on that slot are staged through the instance's buffers, their copies
// counted, with the same output: not copied by the driver from pageable
// memory unseen. The slots still count at their size against the device's
// pinned memory: that they are not pinned is the worker's word, which
// bundle code could forge (TestPinCountIsNotTheWorkersWord).
func TestCUDAPinRefusedIsCountedAndStaged(t *testing.T) {
	var buf testkit.LogBuffer
	d, dir := pinCUDA(t, 0, slog.New(slog.NewTextHandler(&buf, nil)), "FAKECUDA_REGISTER_ERROR=2")
	m := fakeManifest(abi.Launch{Kernel: "pl_copy", Grid: 1, Block: 64})
	p, inst := loadCopy(t, d, dir, m)
	s, ok := p.(device.Lender).Lend(m.MaxInputBytes, m.OutBytes)
	if !ok {
		t.Fatal("no pool slot lent")
	}
	defer s.Release()
	body := []byte("staged")
	if out, copied := copyRun(t, p, inst, s, body); copied != int64(len(body))+64 || !bytes.Equal(out, body) {
		t.Fatalf("in a pool slot the driver refused: output %q, %d bytes copied on the host; want the body, %d", out, copied, len(body)+64)
	}
	// Its own slot refused too: the server copies in and out, and so
	// does the worker, through its staging.
	if out, copied := copyRun(t, p, inst, nil, body); copied != 2*(int64(len(body))+64) || !bytes.Equal(out, body) {
		t.Fatalf("in its own slot: output %q, %d bytes copied; want the body, %d", out, copied, 2*(len(body)+64))
	}
	if got, slot := d.Pinning(), device.SlotSize(m.MaxInputBytes, m.OutBytes); got.Refused != 2 || got.Bytes != 2*slot {
		t.Fatalf("Pinning() = %+v, want 2 refused, both slots counted (%d bytes)", got, 2*slot)
	}
	if log := buf.String(); strings.Count(log, "refused to pin a slot") != 1 || !strings.Contains(log, "CUDA_ERROR_OUT_OF_MEMORY") ||
		!strings.Contains(log, "function=fake") {
		t.Fatalf("log: %q; want one line naming the function and the driver's error", log)
	}
}

// A discarded slot (its request's run panicked in the server) gives its
// pinned bytes back as soon as its worker is done with it, not when its
// program unloads: the worker unregisters and unmaps it, and the device's
// budget (PinLimit) makes room for another slot. Before, every panic on a
// warm function kept a slot pinned for the program's life, and enough of
// them left the device's pinned budget to none.
func TestCUDADiscardedSlotGivesBackItsPin(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  bool // a run on the slot ended (its reply read) before the discard
	}{{"after its run", true}, {"before any run", false}} {
		t.Run(tc.name, func(t *testing.T) {
			m := fakeManifest(abi.Launch{Kernel: "pl_copy", Grid: 1, Block: 64})
			slot := device.SlotSize(m.MaxInputBytes, m.OutBytes)
			d, dir := pinCUDA(t, 3*slot, nil)
			p, inst := loadCopy(t, d, dir, m)
			lender := p.(device.Lender)
			lent := lendAll(lender, m)
			pid := p.(*program).p.pid
			maps := slotMaps(t, pid)
			if len(lent) != 2 || d.Pinning().Bytes != 3*slot {
				t.Fatalf("lent %d pool slots with %+v pinned; want 2, the bound met", len(lent), d.Pinning())
			}
			if tc.run {
				copyRun(t, p, inst, lent[0], []byte("then the server panicked"))
			}
			lent[0].Discard()
			waitFor(t, "the discarded slot's pin to come back", func() bool { return d.Pinning().Bytes == 2*slot })
			waitFor(t, "the worker to unmap the discarded slot", func() bool { return slotMaps(t, pid) == maps-1 })
			s, ok := lender.Lend(m.MaxInputBytes, m.OutBytes)
			if !ok {
				t.Fatalf("no slot lent in the room the discarded one gave back (%+v)", d.Pinning())
			}
			body := []byte("in the new slot")
			if out, copied := copyRun(t, p, inst, s, body); copied != 0 || !bytes.Equal(out, body) {
				t.Fatalf("in the new slot: output %q, %d bytes copied; want the body, none", out, copied)
			}
			s.Release()
			lent[1].Release()
		})
	}
}

// TestCUDAWorkerCopyPiece: Options.CopyPiece reaches the worker's device
// (its command line's --copy-piece): on a fake driver that refuses an
// async copy above 64 KiB, a run of 1 MiB and 123 bytes each way fails
// with whole copies and comes out exact in 64 KiB pieces.
func TestCUDAWorkerCopyPiece(t *testing.T) {
	fakeDir, err := fakecuda.Shared()
	if err != nil {
		t.Skipf("cannot build the fake CUDA driver: %v", err)
	}
	_, dir := fakeCUDA(t)
	const n = 1<<20 + 123
	tests := []struct {
		name  string
		piece int64
		fails string // "": the run succeeds
	}{
		{"whole copies", 0, "cuMemcpyHtoDAsync_v2"},
		{"64 KiB pieces", 64 << 10, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := NewDevice(Options{Exe: os.Args[0], Base: fakeGPU{}, Driver: filepath.Join(fakeDir, "libfakecuda.so"),
				Landlock: true, StageDir: t.TempDir(), Spawner: spawner, CopyPiece: tt.piece,
				env: []string{"FAKECUDA_MAX_COPY=" + strconv.Itoa(64<<10)}})
			defer d.Close()
			m := fakeManifest(abi.Launch{Kernel: "pl_copy", Grid: 1, Block: 256})
			m.MaxInputBytes, m.TmpBytes, m.OutBytes = n, 0, n
			p, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			inst, err := p.NewInstance(device.InstanceConfig{MaxInput: n, Out: n})
			if err != nil {
				t.Fatal(err)
			}
			defer inst.Close()
			in := make([]byte, n)
			for i := range in {
				in[i] = byte(i*7 + i>>16)
			}
			out := make([]byte, n)
			err = inst.Run(&device.Run{Input: in, Output: out, Chain: []device.Step{{Entry: 0, Grid: 1, Block: 256}}})
			if tt.fails != "" {
				if err == nil || !strings.Contains(err.Error(), tt.fails) {
					t.Fatalf("run: %v, want an error naming %s", err, tt.fails)
				}
				return
			}
			if err != nil {
				t.Fatalf("run: %v", err)
			}
			if !bytes.Equal(out, in) {
				t.Fatal("the output is not the input")
			}
		})
	}
}
