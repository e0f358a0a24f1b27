package worker

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/internal/fakecuda"
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
	for _, v := range []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=612MB"} {
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
	if !errors.As(err, &ke) || !strings.Contains(ke.Msg, "CUDA_ERROR_ILLEGAL_ADDRESS") || !errors.As(err, &pe) {
		t.Fatalf("a fault in plover_instance_init: %v, want a KernelError naming CUDA_ERROR_ILLEGAL_ADDRESS that ended the worker", err)
	}
	if p.(*program).Alive() {
		t.Error("the worker whose context faulted is still alive")
	}
	if err := d.Health(); err != nil {
		t.Errorf("device health after one worker's fault: %v", err)
	}
}
