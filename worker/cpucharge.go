package worker

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/worker/wire"
)

// A host worker's device time is CPU time, and its runs report their own
// (device.Host.ChargeProcessCPU: the process's CPU over each run, split
// among the runs in flight). What no run reports went unbilled: threads a
// bundle leaves running between runs (four spinning threads took two CPUs
// for good at a few milliseconds billed), a run's report cut short (tenant
// code can write its own reply). So the server reads each host worker's
// CPU clock itself, from outside the process, and bills its programs what
// the process used beyond what its runs reported, less the worker's own
// polling for a next request after a run it was sent alone (at most
// wire.SpinMax a run: a sequential client's CNN requests spent about 100
// µs each so, which the server's polling for its reply spends too, and
// neither is the function's work). It looks only at a moment when no run
// is in flight on the worker, when every run before has reported, so that
// no run's CPU is billed twice; a worker always busy is billed at its first
// idle moment, what it owes by then in one charge. A forked child's CPU is
// not the process's and is not seen (README: Isolation).

// chargeEvery is how often, in watch ticks, a worker's CPU is looked at:
// a clock read a worker a second, whatever the node holds.
const chargeEvery = 10

// minBill is the least CPU billed at a look; less is let go (the worker's
// own work between runs: its control messages, its runtime).
const minBill = time.Millisecond

// cpuTally is a host worker's CPU as its runs reported it and as billed
// beside them.
type cpuTally struct {
	starts   atomic.Uint64 // runs begun on the worker
	alone    atomic.Uint64 // of them, sent while the device ran no other
	reported atomic.Int64  // ns of device time its runs' replies reported

	look sync.Mutex // one look at a time (billUnreported): the watch loop's, a test's

	mu    sync.Mutex
	sinks []*program // its programs with a bill to send (Bill), in load order
	// The CPU clock less the runs' reports, and the runs sent alone, at
	// the last look (or the first program's Bill); based once set.
	base      time.Duration
	aloneSeen uint64
	based     bool
}

// Bill implements the engine's billing of device time used outside runs:
// from now on, while g is loaded, CPU its host worker uses that its runs
// did not report is passed to bill, split evenly among the worker's
// programs. Not on CUDA, where a run's device time is not CPU time.
func (g *program) Bill(bill func(time.Duration)) {
	if g.d.Target() != abi.TargetHost || bill == nil {
		return
	}
	cpu, ok := g.p.cpuNow() // before any run of g: its load is not billed
	c := &g.p.cpu
	c.mu.Lock()
	defer c.mu.Unlock()
	if g.closed.Load() || !ok {
		return
	}
	if !c.based {
		c.base, c.aloneSeen, c.based = cpu-time.Duration(c.reported.Load()), c.alone.Load(), true
	}
	g.bill = bill
	c.sinks = append(c.sinks, g)
}

// unbill takes g out of its worker's bills (its Close).
func (c *cpuTally) unbill(g *program) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sinks = slices.DeleteFunc(c.sinks, func(s *program) bool { return s == g })
}

// processCPU reads process pid's CPU clock (all its threads, live and
// ended), from outside it: CLOCK_PROCESS_CPUTIME_ID is the caller's own,
// another process's is named by its pid (Linux's MAKE_PROCESS_CPUCLOCK).
func processCPU(pid int) (time.Duration, bool) {
	const cpuclockSched = 2
	var ts unix.Timespec
	if err := unix.ClockGettime(int32(^pid<<3|cpuclockSched), &ts); err != nil {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}

// cpuNow is p's CPU clock; false once it exited. Under p.mu, so that a
// pid reaped (and free for another process) is never read: wait sets
// exited under it.
func (p *proc) cpuNow() (time.Duration, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited {
		return 0, false
	}
	return processCPU(p.pid)
}

// billUnreported bills p's programs the CPU it used that no run reported
// since the last bill (see cpuTally), when no run is in flight on it.
func (p *proc) billUnreported() {
	c := &p.cpu
	c.look.Lock()
	defer c.look.Unlock()
	if p.runs.Load() > 0 {
		return
	}
	began := c.starts.Load()
	cpu, ok := p.cpuNow()
	rep := time.Duration(c.reported.Load())
	if !ok || c.starts.Load() != began || p.runs.Load() > 0 {
		return // a run began meanwhile: its CPU is partly read, not reported
	}
	c.mu.Lock()
	if !c.based || len(c.sinks) == 0 {
		c.mu.Unlock()
		return
	}
	alone := c.alone.Load()
	owed := cpu - rep - c.base - time.Duration(alone-c.aloneSeen)*wire.SpinMax
	c.base, c.aloneSeen = cpu-rep, alone // a run's over-report is not carried
	if owed < minBill {
		c.mu.Unlock()
		return
	}
	bills := make([]func(time.Duration), len(c.sinks))
	for i, g := range c.sinks {
		bills[i] = g.bill
	}
	c.mu.Unlock()
	each := owed / time.Duration(len(bills))
	for _, bill := range bills {
		bill(each)
	}
}
