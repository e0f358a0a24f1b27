package worker

import (
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/worker/wire"
)

// A host worker's device time is CPU time: the server measures it from
// outside the process, by the worker's CPU clock (all its threads), read
// as each run is sent and as its reply comes. The CPU between two readings
// goes to the runs in flight then, split evenly (as device.Host's
// ChargeProcessCPU does inside: threads a chain starts are its work); with
// none in flight, to the worker's programs, billed beside their runs
// (Bill); during a control call (a load, an unload, an instance made), to
// nobody. Before, a run's device time was what the worker's reply said,
// and what no run reported went unbilled: tenant code can write its
// worker's replies, and threads a bundle left spinning between runs (four
// took two CPUs for good) were billed nothing. A run's reply no longer
// says what it is charged, on the host.
//
// Between runs the worker does some work of the platform's: it finishes
// its reply and waits again, and after a run sent while the device ran
// nothing else it polls for the next request, up to wire.SpinMax (about
// 100 µs a sequential CNN client's request, which doubled its bill when
// billed). So the CPU before the next reading, after a reply, is let go up
// to runSlack, and up to wire.SpinMax more after a run sent alone.

// chargeEvery is how often, in watch ticks, an idle worker's CPU is read:
// a worker with no run in flight is billed once a second.
const chargeEvery = 10

// runSlack is the CPU after each reply let go as the worker's own: the
// end of its reply's system call and its return to waiting.
const runSlack = 10 * time.Microsecond

// minBill is the least CPU billed at once; less waits for more.
const minBill = time.Millisecond

// cpuTally is a host worker's CPU clock, as the server last read it, and
// where the CPU since went (see above). Its mutex is held across a clock
// read (a system call that does not wait), taking proc.mu inside it.
type cpuTally struct {
	mu   sync.Mutex
	on   bool          // a host worker: its CPU is device time
	last time.Duration // the clock at the last reading
	read bool          // last was read
	// lastWall is when: a control call's thread, and the worker's own
	// work after a reply, take at most the wall time since.
	lastWall time.Time
	perRun   time.Duration // CPU each run in flight since has had, summed
	runs     int           // runs in flight, as read
	calls    int           // control calls in flight
	slack    time.Duration // of the CPU before the next reading, let go
	idle     time.Duration // CPU with nothing in flight, not yet billed
	sinks    []*program    // its programs with a bill to send (Bill), in load order
	// offspring is the CPU of the processes the worker started, as last
	// read (offspringCPU), if it was; dipped: the last read was below it,
	// not yet taken for the new baseline (offspringAt).
	offspring             time.Duration
	offspringRead, dipped bool
	billed                bool // a program took bills (Bill) once
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

// advance reads p's clock and gives the CPU since the last reading where
// it goes: a control call's (one thread of the worker: at most the wall
// time since) to nobody, the rest to the runs in flight, split evenly, or
// with none to the worker's programs, less the slack the last reply left
// (at most that wall time too). Under c.mu.
func (c *cpuTally) advance(p *proc) {
	now, ok := p.cpuNow()
	if !ok {
		return
	}
	wall := time.Now()
	d, w := now-c.last, wall.Sub(c.lastWall)
	if !c.read || d < 0 {
		d = 0
	}
	c.last, c.lastWall, c.read = now, wall, true
	if c.calls > 0 {
		d -= min(d, w)
	}
	if c.runs > 0 {
		c.perRun += d / time.Duration(c.runs)
	} else {
		c.idle += max(d-min(c.slack, w), 0)
	}
	c.slack = 0
}

// runBegan reads p's clock as a run is sent: its start, for runEnded.
func (p *proc) runBegan() time.Duration {
	c := &p.cpu
	if !c.on {
		return 0
	}
	c.mu.Lock()
	c.advance(p)
	c.runs++
	start := c.perRun
	bills := c.takeBills(false)
	c.mu.Unlock()
	if len(bills.to) > 0 {
		c.sendBefore(p, bills)
	}
	return start
}

// sendBefore sends bills taken as a run began. A panic in sending them
// (the scheduler's code, which the transport recovers) takes the run out
// of the tally again: it is not sent, and the tally would otherwise count
// it in flight for good, giving the CPU of the worker's idle moments to
// nobody.
func (c *cpuTally) sendBefore(p *proc, b bills) {
	sent := false
	defer func() {
		if !sent {
			c.mu.Lock()
			c.advance(p)
			c.runs--
			c.mu.Unlock()
		}
	}()
	b.send()
	sent = true
}

// runEnded reads p's clock as a run's reply came (or its wait ended): the
// CPU the run used, its part of the worker's since start (runBegan); 0 on
// a device that is not the host. alone: it was sent while the device ran
// nothing else, so the worker may poll for the next.
func (p *proc) runEnded(start time.Duration, alone bool) time.Duration {
	c := &p.cpu
	if !c.on {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.advance(p)
	c.runs--
	c.slack = runSlack
	if alone {
		c.slack += wire.SpinMax
	}
	return c.perRun - start
}

// measured sets r's device time to the CPU the server measured it used
// (runEnded) on the host, whatever the reply said and whether one came: a
// run past its deadline, or one whose worker died, is charged what it
// used, not what the device.Run the engine reuses held from the last.
func (c *cpuTally) measured(r *device.Run, cpu time.Duration) {
	if c.on {
		r.Timing.Busy = cpu
	}
}

// calling counts n control calls begun (-1: one ended) on p: the CPU they
// take goes to nobody.
func (c *cpuTally) calling(p *proc, n int) {
	if !c.on {
		return
	}
	c.mu.Lock()
	c.advance(p)
	c.calls += n
	c.mu.Unlock()
}

// look reads p's clock and sends its bills: the watch loop's, once a
// second, and (all set) the last, as p has exited and is not yet reaped
// (wait): a zombie's clock still reads, its CPU since the last reading
// billed whatever its amount.
func (p *proc) look(all bool) {
	c := &p.cpu
	if !c.on {
		return
	}
	kids, read := p.offspringCPU()
	c.mu.Lock()
	c.advance(p)
	if read {
		c.idle += c.offspringAt(kids)
	}
	b := c.takeBills(all)
	c.mu.Unlock()
	b.send()
}

// offspringAt takes kids, a read of offspringCPU, and returns what to bill
// of it: its rise over the baseline. A sum below the baseline is taken
// for the new one only when the next read is below it too (a child's
// time lost for good: SIGCHLD ignored): once, it may be a child reaped
// between the reads of its parent and of itself, its time in neither,
// and lowering the baseline then billed it again at the next look. Under
// c.mu.
func (c *cpuTally) offspringAt(kids time.Duration) time.Duration {
	var bill time.Duration
	switch {
	case !c.offspringRead:
		c.offspring, c.offspringRead = kids, true
	case kids >= c.offspring:
		bill, c.offspring, c.dipped = kids-c.offspring, kids, false
	case c.dipped:
		c.offspring, c.dipped = kids, false
	default:
		c.dipped = true
	}
	return bill
}

// offspringCPU is the CPU time used so far by the processes p's worker
// started: those under it and, in a PID namespace, under its init (where
// orphans go), each its own and its reaped children's, and the worker's
// and the init's reaped children's; not the worker's own threads (its
// clock: the runs') nor the init's. A forked child is the function's
// work as a thread is: billed with the worker's idle CPU, whether runs are
// in flight or not. A process whose parent is not the one it was listed
// under is another's that took a reaped pid, and is left out. A sum that
// goes down (a child reaped where its time is lost: SIGCHLD ignored) is
// read again from there: what it used since the last look is not billed.
// false once p exited (before the reap its pid is still its own: the
// tree is read while it was not, so no pid of it was another's yet).
func (p *proc) offspringCPU() (time.Duration, bool) {
	p.mu.Lock()
	pid, exited := p.pid, p.exited
	p.mu.Unlock()
	if exited {
		return 0, false
	}
	root := p.tree.Root()
	var sum time.Duration
	for _, k := range treeOf(pid, root) {
		pc, err := cpuParts(k.pid)
		switch {
		case err != nil:
		case k.pid == pid || k.pid == root:
			sum += pc.reaped
		case pc.parent == k.parent:
			sum += pc.own + pc.reaped
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return sum, !p.exited
}

// bills is CPU to bill each of a worker's programs.
type bills struct {
	each time.Duration
	to   []func(time.Duration)
}

// takeBills takes the idle CPU for its programs, when it is minBill or
// more, or any if all is set. Under c.mu.
func (c *cpuTally) takeBills(all bool) bills {
	if len(c.sinks) == 0 || c.idle <= 0 || c.idle < minBill && !all {
		return bills{}
	}
	b := bills{each: c.idle / time.Duration(len(c.sinks))}
	for _, g := range c.sinks {
		b.to = append(b.to, g.bill)
	}
	c.idle = 0
	return b
}

// send bills, with no lock held: a bill takes its scheduler's.
func (b bills) send() {
	for _, bill := range b.to {
		bill(b.each)
	}
}

// Bill implements the engine's billing of device time used outside runs:
// from now on, while g is loaded, the CPU its host worker uses with no run
// in flight is passed to bill, split evenly among the worker's programs
// (a tenant's worker's). Not on CUDA, where a run's device time is not
// CPU time.
func (g *program) Bill(bill func(time.Duration)) {
	c := &g.p.cpu
	if !c.on || bill == nil {
		return
	}
	c.mu.Lock()
	if g.closed.Load() {
		c.mu.Unlock()
		return
	}
	c.advance(g.p)
	// What came before is g's siblings' where it has any. Before the
	// worker's first program it is g's own load's (its constructor's
	// threads, past the one thread its call is let go); after the last
	// went, theirs that are gone: nobody's.
	b := c.takeBills(true)
	if c.billed {
		c.idle = 0
	}
	c.billed = true
	g.bill = bill
	c.sinks = append(c.sinks, g)
	c.mu.Unlock()
	b.send()
}

// unbill sends g its last bill, all the worker's idle CPU not yet billed,
// and takes it out of the worker's bills (its Close).
func (c *cpuTally) unbill(p *proc, g *program) {
	if !c.on {
		return
	}
	c.mu.Lock()
	c.advance(p)
	b := c.takeBills(true)
	c.sinks = slices.DeleteFunc(c.sinks, func(s *program) bool { return s == g })
	c.mu.Unlock()
	b.send()
}

// billsCPU reports whether d's workers' CPU is their runs' device time.
func (d *Device) billsCPU() bool { return d.Target() == abi.TargetHost }
