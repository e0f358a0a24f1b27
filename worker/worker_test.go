package worker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/internal/fakecuda"

	"golang.org/x/sys/unix"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/worker/contain"
	"github.com/plover-run/plover/worker/inside"
	"github.com/plover-run/plover/worker/wire"
)

// TestMain lets the test binary be its own worker: Options.Exe is
// os.Args[0], started as "<test binary> worker --device host ...", or a
// process holding memory (holdIfAsked).
func TestMain(m *testing.M) {
	holdIfAsked()
	inside.RunIfWorker()
	code := m.Run()
	fakecuda.Remove()
	os.Exit(code)
}

var spawner = contain.NewSpawner()

func newDevice(t testing.TB, standby int) *Device {
	t.Helper()
	d := NewDevice(Options{Exe: os.Args[0], Base: device.NewHost(0), Standby: standby, Landlock: true, StageDir: t.TempDir(), Spawner: spawner})
	t.Cleanup(func() { d.Close() })
	return d
}

// load loads the test kernels with m's chain into a worker.
func load(t testing.TB, d *Device, m *abi.Manifest) device.Program {
	t.Helper()
	dir := testkit.BundleDir(t, m, nil)
	p, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// loadHostile loads the hostile test bundle (internal/testkit/hostile.cu)
// into a worker, its chain the one kernel named.
func loadHostile(t testing.TB, d *Device, kernel string) (device.Program, *abi.Manifest) {
	t.Helper()
	m := testkit.Manifest("hostile")
	m.Library = "hostile.so"
	m.Chain = []abi.Launch{{Kernel: kernel, Grid: 1, Block: 1}}
	return loadSource(t, d, testkit.HostileSource(), m), m
}

func newInst(t testing.TB, p device.Program, m *abi.Manifest) device.Instance {
	t.Helper()
	in, err := p.NewInstance(device.InstanceConfig{MaxInput: m.MaxInputBytes, Tmp: m.TmpBytes, Out: m.OutBytes})
	if err != nil {
		t.Fatalf("new instance: %v", err)
	}
	t.Cleanup(in.Close)
	return in
}

func TestRunThroughWorker(t *testing.T) {
	d := newDevice(t, 1)
	m := testkit.Manifest("echo")
	m.Chain = []abi.Launch{{Kernel: "echo", Grid: 1, Block: 64}, {Kernel: "add_one", Grid: 1, Block: 1}}
	p := load(t, d, m)
	if got := d.MemInfo().Used; got != 0 {
		t.Errorf("after load without constants: Used = %d, want 0", got)
	}
	in := newInst(t, p, m)
	if got, want := d.MemInfo().Used, m.MaxInputBytes+m.TmpBytes+m.OutBytes; got != want {
		t.Errorf("after an instance: Used = %d, want %d", got, want)
	}
	echo, err := p.Entry("echo")
	if err != nil || echo != 0 {
		t.Fatalf("Entry(echo) = %d, %v; want 0 (the manifest chain's first kernel)", echo, err)
	}
	addOne, _ := p.Entry("add_one")
	for _, tc := range []struct {
		name  string
		input []byte
		out   int
	}{{"full", bytes.Repeat([]byte{7}, 256), 256}, {"short input", []byte("hello"), 256}, {"short output", []byte("abcdef"), 3}, {"empty", nil, 256}} {
		t.Run(tc.name, func(t *testing.T) {
			out := make([]byte, tc.out)
			r := &device.Run{Input: tc.input, Output: out, TmpLen: m.TmpBytes,
				Chain: []device.Step{{Entry: echo, Grid: 1, Block: 64}, {Entry: addOne, Grid: 1, Block: 1}}}
			if err := in.Run(r); err != nil {
				t.Fatal(err)
			}
			want := make([]byte, tc.out)
			copy(want, tc.input)
			for i := range want {
				want[i]++
			}
			if !bytes.Equal(out, want) {
				t.Errorf("output %v, want %v", out[:min(8, len(out))], want[:min(8, len(want))])
			}
		})
	}
	// An override kernel is resolved by the worker, once.
	fail, err := p.Entry("fail")
	if err != nil {
		t.Fatal(err)
	}
	err = in.Run(&device.Run{Output: make([]byte, 8), Chain: []device.Step{{Entry: fail, Grid: 1, Block: 1}}})
	var ke *device.KernelError
	if !errors.As(err, &ke) || !strings.Contains(ke.Msg, "asked to fail") {
		t.Errorf("fail kernel: %v, want a KernelError", err)
	}
	if _, err := p.Entry("no_such_kernel"); err == nil || !strings.Contains(err.Error(), "no_such_kernel") {
		t.Errorf("Entry(no_such_kernel) = %v", err)
	}
	in.Close()
	if got := d.MemInfo().Used; got != 0 {
		t.Errorf("after Close: Used = %d, want 0", got)
	}
}

func TestCrashAndDeadline(t *testing.T) {
	d := newDevice(t, 0)
	m := testkit.Manifest("slow")
	m.Chain = []abi.Launch{{Kernel: "sleep_ms", Grid: 2000, Block: 1}}
	p := load(t, d, m)
	in := newInst(t, p, m)
	steps := []device.Step{{Entry: 0, Grid: 2000, Block: 1}}

	t0 := time.Now()
	err := in.Run(&device.Run{Output: make([]byte, 8), Chain: steps, Deadline: t0.Add(100 * time.Millisecond)})
	if !errors.Is(err, device.ErrDeadline) {
		t.Fatalf("a 2 s chain with a 100 ms deadline: %v, want ErrDeadline", err)
	}
	if el := time.Since(t0); el > time.Second {
		t.Errorf("ErrDeadline after %v, want about 100 ms", el)
	}
	// The chain overruns by more than the grace: the worker is killed, and
	// the next run says so without having reached a worker.
	err = in.Run(&device.Run{Output: make([]byte, 8), Chain: steps, Deadline: time.Now().Add(5 * time.Second)})
	var pe *ProcessExit
	if !errors.As(err, &pe) || !pe.BeforeRun || !strings.Contains(pe.Reason, "deadline") {
		t.Fatalf("run after an overrun: %v, want a ProcessExit before the run naming the deadline", err)
	}
	if p.(*program).Alive() {
		t.Error("the program is still alive after its worker was killed")
	}
}

// A manifest may be up to 1 MiB (abi.ParseManifest); its load message
// is one SOCK_SEQPACKET message, which cannot be larger than the socket's
// send buffer (net.core.wmem_default, 208 KiB). Past that every load
// failed, the worker said to have closed its channel: a manifest with
// 220 KiB of build flags, or of tensors, could never run. Loaded in both
// scopes and run, as a function and as a tenant's.
func TestLargeManifestLoads(t *testing.T) {
	for _, tenant := range []bool{false, true} {
		d := NewDevice(Options{Exe: os.Args[0], Base: device.NewHost(0), TenantScope: tenant, Landlock: true, StageDir: t.TempDir(), Spawner: spawner})
		t.Cleanup(func() { d.Close() })
		m := testkit.Manifest("large")
		m.Build = &abi.Build{Sources: []string{"k.cu"}, CXXFlags: []string{"-DLONG=" + strings.Repeat("x", 300<<10)}}
		m.Tensors = &abi.Tensors{Inputs: abi.RawTensors.Inputs, Outputs: abi.RawTensors.Outputs}
		for i := range 2000 {
			m.Build.CXXFlags = append(m.Build.CXXFlags, fmt.Sprintf("-DX%d=<%d>", i, i)) // '<' marshals as \u003c
		}
		dir := testkit.BundleDir(t, m, nil)
		if fi, err := os.Stat(filepath.Join(dir, abi.ManifestFile)); err != nil || fi.Size() >= 1<<20 || fi.Size() < 300<<10 {
			t.Fatalf("manifest of %v bytes (%v), want one of 300 KiB..1 MiB", fi.Size(), err)
		}
		if _, err := bundle.ReadManifest(dir); err != nil {
			t.Fatalf("the manifest is not one a deploy takes: %v", err)
		}
		p, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m, Tenant: "t"})
		if err != nil {
			t.Fatalf("tenant scope %v: load of a %d-entry build manifest: %v", tenant, len(m.Build.CXXFlags), err)
		}
		in := newInst(t, p, m)
		out := make([]byte, m.OutBytes)
		if err := in.Run(&device.Run{Input: []byte("hi"), Output: out, Chain: []device.Step{{Entry: 0, Grid: 1, Block: 64}}, Deadline: time.Now().Add(5 * time.Second)}); err != nil || string(out[:2]) != "hi" {
			t.Fatalf("run: %v, %q", err, out[:2])
		}
		p.Close()
	}
}

// A stored manifest's batch.max_delay may be of any length (only a new
// one is held to abi.MaxDurationLen): time.ParseDuration takes any number
// of fraction digits. The worker never reads it; sent in the load
// message, a 300 KiB one made the message too large for its socket, and
// the load failed blaming the worker.
func TestLongMaxDelayLoads(t *testing.T) {
	d := newDevice(t, 0)
	m := testkit.BatchManifest("delay", 2, "0."+strings.Repeat("0", 300<<10)+"1s")
	dir := t.TempDir()
	testkit.BuildLib(t, testkit.BatchSource(), dir, m.Library)
	testkit.WriteManifest(t, dir, m)
	raw, err := os.ReadFile(filepath.Join(dir, abi.ManifestFile))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := abi.ParseStoredManifest(bytes.NewReader(raw)); err != nil {
		t.Fatalf("the manifest is not one a node loads: %v", err)
	}
	p, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m})
	if err != nil {
		t.Fatalf("load with a %d-byte max_delay: %v", len(m.Batch.MaxDelay), err)
	}
	defer p.Close()
	if len(m.Batch.MaxDelay) < 300<<10 {
		t.Errorf("the load changed the server's manifest: max_delay %q", m.Batch.MaxDelay)
	}
	in := newInst(t, p, m)
	out := make([]byte, m.OutBytes)
	input := []byte{41, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0}
	if err := in.Run(&device.Run{Input: input, Output: out, Items: 2, Chain: []device.Step{{Entry: 0, Grid: 1, Block: 1}}, Deadline: time.Now().Add(5 * time.Second)}); err != nil || out[0] != 42 || out[4] != 2 {
		t.Fatalf("run: %v, %v", err, out)
	}
}

func TestConstructorCrashIsAProcessExit(t *testing.T) {
	d := newDevice(t, 1)
	m := testkit.Manifest("ctor")
	dir := t.TempDir()
	testkit.BuildLib(t, testkit.HostileCtorSource(), dir, m.Library)
	testkit.WriteManifest(t, dir, m)
	_, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m})
	var pe *ProcessExit
	if !errors.As(err, &pe) || !strings.Contains(pe.Reason, "SIGSEGV") || pe.During != "loading the bundle" {
		t.Fatalf("load of a crashing constructor: %v, want a ProcessExit naming SIGSEGV while loading", err)
	}
}

// TestConstructorCrashWithEscapedChild: a worker that dies while the
// server waits for its reply is found out at once, even when a child it
// forked out of its process group still holds its end of the channel.
func TestConstructorCrashWithEscapedChild(t *testing.T) {
	d := newDevice(t, 1)
	m := testkit.Manifest("escape")
	dir := t.TempDir()
	testkit.BuildLib(t, testkit.HostileCtorSource(), dir, m.Library, "-DPLOVER_CTOR_ESCAPE")
	testkit.WriteManifest(t, dir, m)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t0 := time.Now()
	_, err := d.Load(ctx, device.ProgramSpec{Dir: dir, Manifest: m})
	el := time.Since(t0)
	var pe *ProcessExit
	if !errors.As(err, &pe) || !strings.Contains(pe.Reason, "SIGSEGV") {
		t.Fatalf("load of a constructor that forks and crashes: %v, want a ProcessExit naming SIGSEGV", err)
	}
	child := escapedChild(t)
	if child == 0 {
		t.Fatal("the constructor's child is not running: the case tests nothing")
	}
	unix.Kill(child, unix.SIGKILL)
	// The child holds the channel for 20 s: an answer in a few seconds is
	// the worker's exit noticed, not the child's.
	if el > 10*time.Second {
		t.Errorf("the crash was reported after %v: the server waited for the child, not the worker", el)
	}
}

// escapedChild is the pid of a process named plover-escaped, or 0.
func escapedChild(t *testing.T) int {
	t.Helper()
	dirs, _ := filepath.Glob("/proc/[0-9]*/comm")
	for _, f := range dirs {
		if b, err := os.ReadFile(f); err == nil && strings.TrimSpace(string(b)) == "plover-escaped" {
			var pid int
			fmt.Sscanf(filepath.Base(filepath.Dir(f)), "%d", &pid)
			return pid
		}
	}
	return 0
}

// TestControlMessageOutOfTurn: a kernel that writes a forged reply on its
// worker's control channel. The server's next control call, soon or long
// after the last call's deadline passed, finds it waiting, ends the worker
// and says why, instead of reading the forgery as its answer (a kernel
// index of 0x7fffffff here).
func TestControlMessageOutOfTurn(t *testing.T) {
	for _, wait := range []time.Duration{0, 100 * time.Millisecond} {
		name := "at once"
		if wait > 0 {
			name = "after the last call's deadline"
		}
		t.Run(name, func(t *testing.T) {
			p, m := loadHostile(t, newDevice(t, 1), "ring_control")
			entry, err := p.Entry("ring_control")
			if err != nil {
				t.Fatal(err)
			}
			// The last control call before the ring, the instance's, has a
			// deadline (its request's plus a grace) 1 s from now; the
			// second case waits until it has passed.
			dl := time.Now().Add(time.Second)
			in, err := p.NewInstance(device.InstanceConfig{MaxInput: m.MaxInputBytes, Tmp: m.TmpBytes, Out: m.OutBytes,
				Deadline: dl.Add(-instanceGrace)})
			if err != nil {
				t.Fatal(err)
			}
			defer in.Close()
			out := make([]byte, m.OutBytes)
			if err := in.Run(&device.Run{Input: []byte("x"), Output: out, Chain: []device.Step{{Entry: entry, Grid: 1, Block: 1}}}); err != nil {
				t.Fatalf("ring_control's own run: %v", err)
			}
			if out[0] != 'x' {
				t.Fatalf("ring_control did not ring: %.40q", out)
			}
			if wait > 0 {
				time.Sleep(time.Until(dl) + wait)
			}
			i, err := p.Entry("echo")
			var pe *ProcessExit
			if !errors.As(err, &pe) || !strings.Contains(pe.Reason, "out of turn") {
				t.Fatalf("the next control call: kernel %#x, %v; want a ProcessExit saying the worker wrote out of turn", i, err)
			}
		})
	}
}

// A run reply too short to be one (bundle code wrote it on the instance's
// channel), an empty message included, ends the worker at once, for the
// run's program, as a reply out of turn does: the run fails within a
// moment saying why, not after the 2 s a channel that broke is given to
// show the worker's death (which does not come: the worker is well),
// reported as a broken channel; in a tenant's worker the program whose
// channel carried it is the one at fault, its sibling's loss collateral,
// not every program's crash. An empty message reads as 0 bytes, as the
// channel's end does: the server tells them apart by the end's state.
func TestShortRunReplyEndsWorkerForItsProgram(t *testing.T) {
	for _, tc := range []struct{ kernel, why string }{{"ring_short", "malformed reply"}, {"ring_empty", "empty message"}} {
		for _, scope := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s tenant scope %v", tc.kernel, scope), func(t *testing.T) {
				shortRunReply(t, tc.kernel, tc.why, scope)
			})
		}
	}
}

func shortRunReply(t *testing.T, kernel, why string, scope bool) {
	d := NewDevice(Options{Exe: os.Args[0], Base: device.NewHost(0), Landlock: true, StageDir: t.TempDir(),
		Spawner: spawner, TenantScope: scope})
	t.Cleanup(func() { d.Close() })
	m := crashManifest("hostile.so", kernel, 1)
	p := loadFor(t, d, "t", testkit.HostileSource(), m, nil).(*program)
	var sibling *program
	if scope {
		sibling = loadFor(t, d, "t", "", testkit.Manifest("sibling"), nil).(*program)
		if pidOf(sibling) != pidOf(p) {
			t.Fatal("the tenant's programs are not in one worker")
		}
	}
	t0 := time.Now()
	err := runOnce(t, p, m, []byte("x"), 10*time.Second)
	took := time.Since(t0)
	var pe *ProcessExit
	if !errors.As(err, &pe) || !pe.Killed || !strings.Contains(pe.Reason, why) {
		t.Errorf("the run: %v; want a ProcessExit saying the server stopped the worker (%s)", err, why)
	}
	if took > time.Second {
		t.Errorf("the run failed after %v: the server waited for a death, not ending the worker at once", took)
	}
	if sibling != nil {
		<-sibling.Exited()
		if ds := sibling.Death(); ds == nil || !ds.Collateral() {
			t.Errorf("the sibling's death: %v; want a collateral loss", ds)
		}
		if dp := p.Death(); dp == nil || dp.Collateral() {
			t.Errorf("the writer's death: %v; want its own loss", dp)
		}
	}
}

// An empty message on the control channel (plover_instance_init sent it
// ahead of the init's reply) is a forged reply too: the call fails at
// once, the worker ended for the program whose call it was, where read as
// the channel's end it was waited on for 2 s with the channel held, then
// killed naming no one (in a tenant's worker, every program's crash).
func TestEmptyControlReplyEndsWorkerForItsProgram(t *testing.T) {
	for _, scope := range []bool{false, true} {
		t.Run(fmt.Sprintf("tenant scope %v", scope), func(t *testing.T) {
			d := NewDevice(Options{Exe: os.Args[0], Base: device.NewHost(0), Landlock: true, StageDir: t.TempDir(),
				Spawner: spawner, TenantScope: scope})
			t.Cleanup(func() { d.Close() })
			mh := testkit.Manifest("hooks")
			mh.Library, mh.Chain = "hooks.so", []abi.Launch{{Kernel: "report", Grid: 1, Block: 1}}
			p := loadBuilt(t, d, mh, "-DEMPTY_INIT_MESSAGE").(*program)
			var sibling *program
			if scope {
				sibling = loadFor(t, d, "t", "", testkit.Manifest("sibling"), nil).(*program)
				if pidOf(sibling) != pidOf(p) {
					t.Fatal("the tenant's programs are not in one worker")
				}
			}
			t0 := time.Now()
			in, err := p.NewInstance(device.InstanceConfig{MaxInput: mh.MaxInputBytes, Tmp: mh.TmpBytes, Out: mh.OutBytes})
			took := time.Since(t0)
			if err == nil {
				in.Close()
				t.Fatal("an instance was made past an empty reply")
			}
			var pe *ProcessExit
			if !errors.As(err, &pe) || !pe.Killed || !strings.Contains(pe.Reason, "empty message on its control channel") {
				t.Errorf("the instance's creation: %v; want a ProcessExit saying the server stopped the worker for an empty message", err)
			}
			if took > time.Second {
				t.Errorf("the creation failed after %v: the server waited for a death, not ending the worker at once", took)
			}
			if sibling != nil {
				<-sibling.Exited()
				if ds := sibling.Death(); ds == nil || !ds.Collateral() {
					t.Errorf("the sibling's death: %v; want a collateral loss", ds)
				}
				if dp := p.Death(); dp == nil || dp.Collateral() {
					t.Errorf("the sender's death: %v; want its own loss", dp)
				}
			}
		})
	}
}

// TestZeroOutThroughWorker: the run message carries zero_out, so a short
// request after a long one on a worker's instance sees zeros, not the long
// one's bytes (the chain writes only as many bytes as its input has).
func TestZeroOutThroughWorker(t *testing.T) {
	d := newDevice(t, 0)
	m := testkit.Manifest("partial")
	m.Constants, m.OutBytes = "zeros.bin", 64
	m.Chain = []abi.Launch{{Kernel: "add_constants", Grid: 1, Block: 1}}
	dir := testkit.BundleDir(t, m, make([]byte, 64))
	p, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	in := newInst(t, p, m)
	steps := []device.Step{{Entry: 0, Grid: 1, Block: 1}}
	out := make([]byte, 64)
	if err := in.Run(&device.Run{Input: bytes.Repeat([]byte{0xAA}, 64), Output: out, Chain: steps, ZeroOut: true}); err != nil {
		t.Fatal(err)
	}
	for _, zero := range []bool{true, false} {
		if err := in.Run(&device.Run{Input: []byte{7}, Output: out, Chain: steps, ZeroOut: zero}); err != nil {
			t.Fatal(err)
		}
		if got := out[1]; (got == 0) != zero {
			t.Errorf("ZeroOut %v: out[1] = %#x after a request of 0xAA bytes", zero, got)
		}
		if err := in.Run(&device.Run{Input: bytes.Repeat([]byte{0xAA}, 64), Output: out, Chain: steps}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSlotIsSealed: whoever holds the slot's memfd (the worker) can neither
// shrink nor grow it, nor lift the seals; it can still write through a
// shared mapping.
func TestSlotIsSealed(t *testing.T) {
	fd, slot, err := newSlot(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	defer unix.Munmap(slot)
	for _, size := range []int64{0, 1 << 20} {
		if err := unix.Ftruncate(fd, size); err != unix.EPERM {
			t.Errorf("ftruncate to %d: %v, want EPERM", size, err)
		}
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_WRITE); err != unix.EPERM {
		t.Errorf("adding a seal: %v, want EPERM (sealed)", err)
	}
	theirs, err := unix.Mmap(fd, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatalf("a second shared, writable mapping: %v", err)
	}
	defer unix.Munmap(theirs)
	theirs[100] = 42
	if slot[100] != 42 {
		t.Error("a write through the other mapping is not seen in the server's")
	}
}

// TestWorkerEnvironment: a worker's environment is PATH and nothing of the
// server's; under MPS it also carries the function's limits, set before
// its device opens.
func TestWorkerEnvironment(t *testing.T) {
	t.Setenv("AWS_SECRET_ACCESS_KEY", "server-secret")
	m := testkit.Manifest("mps")
	m.GPUShare = 25
	for _, tc := range []struct {
		name string
		mps  bool
		want []string
	}{
		{"plain", false, []string{"PATH=/usr/local/bin:/usr/bin:/bin"}},
		{"mps", true, []string{"PATH=/usr/local/bin:/usr/bin:/bin", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
			"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1026MB"}}, // 2 MiB of buffers + 1 GiB for the context
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := NewDevice(Options{Exe: os.Args[0], Base: device.NewHost(0), Standby: 1, MPS: tc.mps, StageDir: t.TempDir(), Spawner: spawner})
			defer d.Close()
			dir := testkit.BundleDir(t, m, nil)
			p, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m, MemoryBudget: 2 << 20})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", p.(*program).PID()))
			if err != nil {
				t.Skipf("cannot read a worker's environment here: %v", err)
			}
			got := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
			if strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Errorf("worker environment %q, want %q", got, tc.want)
			}
		})
	}
}

// BenchmarkRoundTrip is one request through a worker: the cost isolation
// adds to a hot request, with a chain that does almost nothing.
func BenchmarkRoundTrip(b *testing.B) {
	d := newDevice(b, 0)
	m := testkit.Manifest("echo")
	benchRoundTrip(b, load(b, d, m), m)
}

// benchRoundTrip times runs of a one-step chain on an instance of p.
func benchRoundTrip(b *testing.B, p device.Program, m *abi.Manifest) {
	in := newInst(b, p, m)
	r := &device.Run{Input: make([]byte, 64), Output: make([]byte, m.OutBytes), TmpLen: m.TmpBytes,
		Chain: []device.Step{{Entry: 0, Grid: 1, Block: 64}}}
	b.ReportAllocs()
	for b.Loop() {
		r.Deadline = time.Now().Add(time.Second)
		if err := in.Run(r); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSpawn is a worker's start, from exec to ready (contained,
// device open, libraries preloaded, Landlock applied): what a cold start
// pays when no standby worker is left. "lean" is cmd/plover-worker, what a
// server runs; "full" is a binary that links everything else too (this
// test binary, as the plover binary would); "lean-pidns" is lean in a PID
// namespace of its own, as a server with CAP_SYS_ADMIN starts it (its
// end, the namespace's, is in the loop too).
func BenchmarkSpawn(b *testing.B) {
	lean := filepath.Join(b.TempDir(), "plover-worker")
	if out, err := exec.Command("go", "build", "-o", lean, "../cmd/plover-worker").CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	ns := contain.NewSpawner()
	defer ns.Close()
	inNS, _ := ns.Contain(true)
	for _, exe := range []struct {
		name, path string
		sp         *contain.Spawner
	}{{"lean", lean, spawner}, {"full", os.Args[0], spawner}, {"lean-pidns", lean, ns}} {
		b.Run(exe.name, func(b *testing.B) {
			if exe.sp == ns && inNS != contain.PIDNamespace {
				b.Skip("no PID namespaces here")
			}
			d := NewDevice(Options{Exe: exe.path, Base: device.NewHost(0), Landlock: true, StageDir: b.TempDir(), Spawner: exe.sp})
			defer d.Close()
			for b.Loop() {
				p, err := d.spawn(context.Background(), 1)
				if err != nil {
					b.Fatal(err)
				}
				p.kill("benchmark")
				<-p.done
			}
		})
	}
}

// A worker binary of another build is refused at its start, by the
// protocol in its ready message, with what to do.
func TestSpawnRefusesAnotherProtocol(t *testing.T) {
	for _, tc := range []struct{ name, ready, want string }{
		{"newer", fmt.Sprintf(`R\x01\x00\x00\x00\x00\x%02x`, wire.Protocol+1), fmt.Sprintf("speaks worker protocol %d, this server %d", wire.Protocol+1, wire.Protocol)},
		{"older", `R\x01\x00\x00\x00\x00`, "speaks worker protocol an older one"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			exe := filepath.Join(t.TempDir(), "plover-worker")
			// One write of the whole message: one SOCK_SEQPACKET message.
			script := "#!/bin/bash\nprintf '" + tc.ready + "' >&3\nsleep 10\n"
			if err := os.WriteFile(exe, []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
			d := NewDevice(Options{Exe: exe, Base: device.NewHost(0), StageDir: t.TempDir(), Spawner: spawner})
			defer d.Close()
			_, err := d.spawn(context.Background(), 1)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "install plover and plover-worker from one build") {
				t.Fatalf("spawn: %v, want %q", err, tc.want)
			}
		})
	}
}
