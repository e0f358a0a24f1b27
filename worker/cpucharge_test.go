package worker

import (
	"context"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/internal/testkit"
)

// billed hooks a program's bills (Bill) into a total, in ns.
func billed(t *testing.T, p device.Program) *atomic.Int64 {
	t.Helper()
	var total atomic.Int64
	p.(*program).Bill(func(d time.Duration) { total.Add(int64(d)) })
	return &total
}

// oneStep is a run of kernel alone on a 1-byte input.
func oneStep(t *testing.T, p device.Program, m *abi.Manifest, kernel string) *device.Run {
	t.Helper()
	entry, err := p.Entry(kernel)
	if err != nil {
		t.Fatal(err)
	}
	return &device.Run{Input: []byte("x"), Output: make([]byte, m.OutBytes), TmpLen: m.TmpBytes, Chain: []device.Step{{Entry: entry, Grid: 1, Block: 1}}}
}

// Threads a bundle leaves spinning after its run are its function's device
// time, billed with no run in flight; before, its one run's few
// milliseconds were all it was billed.
func TestThreadsLeftRunningAreBilled(t *testing.T) {
	d := newDevice(t, 1)
	p, m := loadHostile(t, d, "threads")
	total := billed(t, p)
	in, r := newInst(t, p, m), oneStep(t, p, m, "threads")
	if err := in.Run(r); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for total.Load() < int64(300*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("billed %v in 10 s beside 4 spinning threads (the run reported %v)", time.Duration(total.Load()), r.Timing.Busy)
		}
		p.(*program).p.look(false)
		time.Sleep(20 * time.Millisecond) // the threads' CPU to add up: a look, not a wait for state
	}
}

// A process a bundle starts is its function's work as a thread is: its
// CPU is billed beside its worker's. Before, it was not seen: a spinning
// child was billed nothing. (An orphaned one, under a contained server's
// PID namespace init or subreaper worker: cli/plover's isolation "spawn".)
func TestProcessesABundleStartsAreBilled(t *testing.T) {
	d := newDevice(t, 1)
	p, m := loadHostile(t, d, "spawn_spinner")
	total := billed(t, p)
	in, r := newInst(t, p, m), oneStep(t, p, m, "spawn_spinner")
	if err := in.Run(r); err != nil {
		t.Fatal(err)
	}
	if got := string(r.Output[:7]); got != "spawned" {
		t.Fatalf("spawn_spinner wrote %q", got)
	}
	deadline := time.Now().Add(10 * time.Second)
	for total.Load() < int64(200*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("billed %v in 10 s beside a spinning process its bundle started", time.Duration(total.Load()))
		}
		p.(*program).p.look(false)
		time.Sleep(20 * time.Millisecond) // the spinner's CPU to add up: a look, not a wait for state
	}
}

// A load's CPU past the one thread its control call is let go (threads a
// constructor starts) is its function's: billed to the worker's first
// program as it registers for bills. Before, Bill dropped it (a
// constructor spinning 4 threads for 250 ms of CPU each was billed 0).
func TestLoadCPUOfExtraThreadsIsBilled(t *testing.T) {
	d := newDevice(t, 1)
	spec := slowSpec(t, "spinload", "-DSLOW_MS=250", "-DSPIN_THREADS=4")
	t0 := time.Now()
	p, err := d.Load(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	wall := time.Since(t0)
	defer p.Close()
	total := billed(t, p) // as the engine does, right after Load
	w := p.(*program).p
	cpu, _ := w.cpuNow()
	w.look(true)
	got := time.Duration(total.Load())
	// The worker's start before its load (its runtime's) is in cpu too,
	// and is nobody's.
	if unbilled := cpu - wall - got; unbilled > 150*time.Millisecond {
		t.Fatalf("a load of %v wall, the worker's CPU %v: billed %v, %v of it beyond one thread to nobody", wall, cpu, got, unbilled)
	}
}

// A sequential client's runs, sent alone, have their worker poll for the
// next request between them: the platform's latency, not the function's
// work, and not billed (about 100 µs a CNN request on 2 CPUs, which doubled
// its bill). The client's think time between runs is a sleep: what the
// worker polls through.
func TestPollingBetweenRunsIsNotBilled(t *testing.T) {
	d := newDevice(t, 1)
	m := testkit.Manifest("echo")
	p := load(t, d, m)
	total := billed(t, p)
	in, r := newInst(t, p, m), oneStep(t, p, m, "echo")
	start, _ := p.(*program).p.cpuNow()
	for range 1000 {
		if err := in.Run(r); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Microsecond)
	}
	p.(*program).p.look(false)
	end, _ := p.(*program).p.cpuNow()
	// Without the allowance, 30 ms; a loaded machine's runs leave a
	// little more than their slack, now and then (7.1 ms in a CI run with
	// a review's probes beside it).
	if got := time.Duration(total.Load()); got > 10*time.Millisecond {
		t.Fatalf("billed %v for 1000 sequential echo runs (the worker used %v of CPU over them)", got, end-start)
	}
}

// A chain past its request's deadline is charged the CPU it used until
// then, not the device time the engine's reused device.Run held from the
// run before (an echo's microseconds: a chain could spin every thread to
// its deadline for nothing), and the CPU it goes on using until its worker
// is killed (overrunGrace later) is billed beside it, read from the dead
// worker's clock before the reap.
func TestCPUPastTheDeadlineIsBilled(t *testing.T) {
	d := newDevice(t, 1)
	p, m := loadHostile(t, d, "spin")
	total := billed(t, p)
	in, r := newInst(t, p, m), oneStep(t, p, m, "echo")
	if err := in.Run(r); err != nil {
		t.Fatal(err)
	}
	echo := r.Timing.Busy
	r.Chain = oneStep(t, p, m, "spin").Chain
	r.Deadline = time.Now().Add(100 * time.Millisecond)
	if err := in.Run(r); err == nil {
		t.Fatal("a chain that spins forever ended by its deadline")
	}
	if r.Timing.Busy < 10*time.Millisecond {
		t.Errorf("a chain spinning 100 ms to its deadline was charged %v (the echo before it %v)", r.Timing.Busy, echo)
	}
	deadline := time.Now().Add(10 * time.Second)
	for total.Load() < int64(10*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("billed %v in 10 s for a chain spinning %v past its deadline", time.Duration(total.Load()), overrunGrace)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// In a tenant's worker, threads one function left spinning are billed
// while a sibling loads: a control call is one thread's work, and only as
// much CPU as one thread could use in its time goes to nobody. Before, all
// the worker's CPU during a call did (a slow load covered the spinning).
func TestIdleCPUDuringASiblingsLoadIsBilled(t *testing.T) {
	d := tenantDevice(t)
	m := testkit.Manifest("a")
	m.Library = "hostile.so"
	m.Chain = []abi.Launch{{Kernel: "threads", Grid: 1, Block: 1}}
	dir := t.TempDir()
	testkit.BuildLib(t, testkit.HostileSource(), dir, m.Library)
	testkit.WriteManifest(t, dir, m)
	a, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m, Tenant: "t"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	total := billed(t, a)
	if err := newInst(t, a, m).Run(oneStep(t, a, m, "threads")); err != nil {
		t.Fatal(err)
	}
	pr := a.(*program).p
	pr.look(true)
	before := time.Duration(total.Load())
	c0, _ := pr.cpuNow()
	t0 := time.Now()
	b, err := d.Load(context.Background(), slowSpec(t, "b", "-DSLOW_MS=1000"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	pr.look(true)
	c1, _ := pr.cpuNow()
	// The load's thread may take its wall time of it; on a loaded machine
	// the spinning threads may get less than a CPU more, and the bill can
	// be nothing.
	got, want := time.Duration(total.Load())-before, c1-c0-time.Since(t0)-50*time.Millisecond
	t.Logf("the worker used %v of CPU during its sibling's %v load, 4 threads spinning; billed %v", c1-c0, time.Since(t0), got)
	if got < want {
		t.Fatalf("billed %v, want at least %v", got, want)
	}
}

// A panic in a bill sent as a run begins (the scheduler's code; the
// transport recovers it) leaves no run counted: neither in the CPU tally,
// where the worker's idle CPU (here 4 spinning threads) was then billed to
// nobody for good, nor on the device, where its runs in flight decide the
// reply polling.
func TestPanicInABillAsARunBeginsLeavesNoRun(t *testing.T) {
	d := newDevice(t, 1)
	p, m := loadHostile(t, d, "threads")
	var total atomic.Int64
	var armed atomic.Bool
	p.(*program).Bill(func(d time.Duration) {
		if armed.Load() && strings.Contains(string(debug.Stack()), "runBegan") {
			panic("a bug in the scheduler's charge")
		}
		total.Add(int64(d))
	})
	in, r := newInst(t, p, m), oneStep(t, p, m, "threads")
	if err := in.Run(r); err != nil {
		t.Fatal(err)
	}
	pr := p.(*program).p
	c0, _ := pr.cpuNow()
	for c, _ := pr.cpuNow(); c-c0 < 10*time.Millisecond; c, _ = pr.cpuNow() {
		time.Sleep(time.Millisecond) // the spinning threads' CPU, over minBill
	}
	armed.Store(true)
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the run whose bill panicked did not panic")
			}
		}()
		in.Run(r)
	}()
	armed.Store(false)
	pr.cpu.mu.Lock()
	runs := pr.cpu.runs
	pr.cpu.mu.Unlock()
	if runs != 0 || d.running.Load() != 0 || pr.runs.Load() != 0 {
		t.Fatalf("after the panic: the tally counts %d runs, the device %d, the worker %d; want none", runs, d.running.Load(), pr.runs.Load())
	}
}

// childrenOf counts the processes whose parent is pid.
func childrenOf(pid int) int {
	ents, _ := os.ReadDir("/proc")
	n := 0
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			n++
		}
	}
	return n
}

// A panic in the base device's code as a worker starts (the transport
// recovers it) comes before the process does: read after it started, it
// left the process unreaped and its pipes open.
func TestPanicAsAWorkerStartsLeavesNoProcess(t *testing.T) {
	base := &targetBugDevice{Device: device.NewHost(0), in: ".start("}
	d := NewDevice(Options{Exe: os.Args[0], Base: base, Landlock: true, StageDir: t.TempDir(), Spawner: spawner, TenantScope: true})
	t.Cleanup(func() { d.Close() })
	m := testkit.Manifest("f")
	dir := testkit.BundleDir(t, m, nil)
	before := childrenOf(os.Getpid())
	loadPanicking(t, d, base, device.ProgramSpec{Dir: dir, Manifest: m, Tenant: "a"})
	if after := childrenOf(os.Getpid()); after != before {
		t.Fatalf("%d child processes after the panicked start, %d before", after, before)
	}
}

// The CPU of a worker's offspring is billed by its rises. A read below the
// baseline once (a child reaped between the reads of its parent and of
// itself, its time in neither) leaves the baseline, so that the child is
// not billed again when its time shows in its parent's; below it twice
// (time lost for good: SIGCHLD ignored) it is the new baseline.
func TestOffspringBilledByRisesOnce(t *testing.T) {
	const ms = time.Millisecond
	var c cpuTally
	for _, tt := range []struct {
		name string
		kids time.Duration
		bill time.Duration
	}{
		{"the first read: the baseline", 100 * ms, 0},
		{"a child's work", 150 * ms, 50 * ms},
		{"the child reaped between two reads: its 40 ms in neither", 110 * ms, 0},
		{"its time in its parent's now, and 5 ms more work", 155 * ms, 5 * ms},
		{"a child's time lost for good", 120 * ms, 0},
		{"still lost: the new baseline", 121 * ms, 0},
		{"work from there", 130 * ms, 9 * ms},
	} {
		if got := c.offspringAt(tt.kids); got != tt.bill {
			t.Errorf("%s (%v): billed %v, want %v", tt.name, tt.kids, got, tt.bill)
		}
	}
}
