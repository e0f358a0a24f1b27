package worker

import (
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
	if got := time.Duration(total.Load()); got > 0 {
		t.Fatalf("billed %v for 1000 sequential echo runs (the worker used %v of CPU over them)", got, end-start)
	}
}

// A chain past its request's deadline goes on using the CPU until its
// worker is killed (overrunGrace later): its run is charged its slot's time
// to the deadline, and what it used after is billed beside it, read from
// the dead worker's clock before the reap.
func TestCPUPastTheDeadlineIsBilled(t *testing.T) {
	d := newDevice(t, 1)
	p, m := loadHostile(t, d, "spin")
	total := billed(t, p)
	in, r := newInst(t, p, m), oneStep(t, p, m, "spin")
	r.Deadline = time.Now().Add(50 * time.Millisecond)
	if err := in.Run(r); err == nil {
		t.Fatal("a chain that spins forever ended by its deadline")
	}
	deadline := time.Now().Add(10 * time.Second)
	for total.Load() < int64(overrunGrace/2) {
		if time.Now().After(deadline) {
			t.Fatalf("billed %v in 10 s for a chain spinning %v past its deadline", time.Duration(total.Load()), overrunGrace)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
