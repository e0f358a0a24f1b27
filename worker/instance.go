package worker

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/worker/wire"
)

// instance is one instance in a worker. Its channel is a plain blocking
// descriptor, not a net.Conn: the request's goroutine waits in ppoll on its
// own thread and the kernel wakes that thread when the reply lands, instead
// of a round through the netpoller and the scheduler (measured: the p50 of
// a hot CNN request and 4-client throughput both improved; BENCHMARKS.md).
type instance struct {
	g               *program
	fd              int
	slot            []byte
	pinned          int64 // bytes of slot its worker pinned (pin.go)
	maxIn, tmp, out int64
	msg, rep        []byte
	// overrun, after a run passed its deadline, receives whether the chain
	// finished within overrunGrace (true) or the worker was killed.
	overrun chan bool
	// reply is how long its runs' replies took to come (wire/poll.go).
	reply wire.WaitEstimate
	// seq numbers the runs; a reply must echo its run's (wire/run.go).
	seq uint32
	// sent and got are the run's message's sending and its reply's
	// arrival on the clock the worker reads too (wire.Mono), for the
	// handoff and handback an accepted reply gives (answer).
	sent, got int64
}

// errRunDeadline is a run given up at its deadline (device.ErrDeadline).
var errRunDeadline = fmt.Errorf("%w while its chain was running", device.ErrDeadline)

// overrunGrace is how long a chain may run past its request's deadline
// before its worker is killed. The request is answered (504) at the deadline
// either way; the grace spares the worker's other requests when a chain is
// merely late, and a stuck kernel still ends within it.
const overrunGrace = 200 * time.Millisecond

// finish waits out an overrun chain: its reply is discarded. The run
// leaves the device's count of runs in flight only now. Its slot is given
// back before the instance's next run is let go (done), so that a request
// after that run finds it free.
func (i *instance) finish(done chan<- bool, held *poolSlot) {
	defer i.g.runEnd() // last: after the worker is gone, if it goes
	defer i.g.d.running.Add(-1)
	ok := i.waitOut(held)
	if held != nil {
		// The chain may read and write its slot until it ends or its
		// worker does: only then may the slot serve another request.
		held.unhold()
	}
	done <- ok
}

// waitOut waits for an overrun chain's reply within overrunGrace, and
// reports whether it came (the worker lives on); else the worker is gone
// once it returns, killed here if it was late.
func (i *instance) waitOut(held *poolSlot) bool {
	n, err := i.recv(time.Now().Add(overrunGrace), 0)
	if err == nil && i.finished(i.rep[:n]) {
		held.replied()
		return true
	}
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, errEmptyMessage) {
		// The worker closed its end within the grace (EOF, or a reset):
		// it is dying of its own (a crash, this chain's or a sibling's),
		// to be told as it died, not as the server's kill for an overrun.
		i.g.p.end("it closed its channel while a chain overran")
		return false
	}
	// Late, faulted, or not a reply at all (an empty message too): the
	// worker goes.
	if errors.Is(err, os.ErrDeadlineExceeded) {
		// Marked before the kill: once the worker is reaped the engine
		// may load the function again, and that load must find the mark.
		i.g.d.overran(i.g, "its chain was running", i.g.p.holdsBeside(i.g))
	}
	why := "a chain ran past its request's deadline by more than " + overrunGrace.String()
	i.g.p.killFor(i.g, why)
	i.g.p.end(why) // reaped while this run counts: its death was a run's
	return false
}

// recv waits for the reply until dl (zero: no limit): os.ErrDeadlineExceeded
// past it, io.EOF when the worker's end closed, errEmptyMessage for a
// message of no bytes with its end open. It polls for up to spin first
// (wire/poll.go), then sleeps.
func (i *instance) recv(dl time.Time, spin time.Duration) (int, error) {
	if !dl.IsZero() {
		spin = min(spin, time.Until(dl))
	}
	if spin > 0 {
		n, err := wire.PollRecv(i.fd, i.rep, spin, &i.g.d.running, 1)
		switch {
		case err == nil && n == 0:
			return 0, zeroRead(i.fd)
		case err == nil:
			return n, nil
		case err != unix.EAGAIN:
			return 0, err
		}
	}
	pfd := []unix.PollFd{{Fd: int32(i.fd), Events: unix.POLLIN}}
	for {
		var ts *unix.Timespec
		if !dl.IsZero() {
			left := time.Until(dl)
			if left <= 0 {
				return 0, os.ErrDeadlineExceeded
			}
			t := unix.NsecToTimespec(int64(left))
			ts = &t
		}
		n, err := unix.Ppoll(pfd, ts, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, err
		}
		if n == 0 {
			continue // the timeout: the loop's check says so
		}
		for {
			n, err = unix.Read(i.fd, i.rep)
			if err != unix.EINTR {
				break
			}
		}
		if err != nil {
			return 0, err
		}
		if n == 0 {
			return 0, zeroRead(i.fd)
		}
		return n, nil
	}
}

// zeroRead is what a read of no bytes on an instance's channel fd was:
// the worker's end closing (io.EOF), or, with that end still open, an
// empty message, which only bundle code sends (the worker's replies are
// never empty). Taken for the end, it had the run wait 2 s for a death
// that does not come, then kill the worker naming no program (p.end),
// where any other malformed reply ends it at once, for its program.
func zeroRead(fd int) error {
	if hungUp(fd) {
		return io.EOF
	}
	return errEmptyMessage
}

// finished reports whether rep is the last run's reply, and its device
// did not fault.
func (i *instance) finished(rep []byte) bool {
	st, seq, err := wire.ReplyHead(rep)
	return err == nil && st != wire.StFault && seq == i.seq
}

func deadlineC(dl time.Time) <-chan time.Time {
	if dl.IsZero() {
		return nil
	}
	return time.After(time.Until(dl))
}

func (i *instance) DeviceBytes() int64 { return i.maxIn + i.tmp + i.out }

func (i *instance) Close() {
	if i.slot == nil {
		return
	}
	n := i.DeviceBytes()
	given := i.g.p.give(n) // before used drops them: never out of both counts
	if i.overrun != nil {  // still finishing: the reader owns the buffers
		go func(c chan bool, fd int, slot []byte, pinned int64) {
			<-c
			i.end(fd, n, given)
			unix.Munmap(slot)
			i.g.p.dropSlot(int64(len(slot)), pinned, false)
		}(i.overrun, i.fd, i.slot, i.pinned)
		i.slot = nil
		i.g.d.used.Add(-n)
		return
	}
	i.end(i.fd, n, given)
	unix.Munmap(i.slot)
	i.g.p.dropSlot(int64(len(i.slot)), i.pinned, false)
	i.slot = nil
	i.g.d.used.Add(-n)
}

// end ends the instance's channel: the worker frees the instance when it
// reads the end, and its n bytes, given as returning, are counted back
// once it closed its side (awaitEnd).
func (i *instance) end(fd int, n int64, given bool) {
	i.g.instanceClosed()
	if given {
		i.g.ending.add()
		i.g.p.awaitEnd(fd, n, i.g.ending.done)
		return
	}
	unix.Close(fd)
}

// Run hands one request to the worker: one message each way. The request is
// in a pool slot of this worker's when its body was read into one (r.Slot:
// nothing is copied, and the output is left there), else the input is
// copied into the instance's own slot and the output out of it. Past
// r.Deadline the worker is killed (a running kernel cannot be stopped
// otherwise).
func (i *instance) Run(r *device.Run) error {
	// Callers reuse r (plover run --repeat; the engine, which also resets
	// it for a run its scheduler refuses): a run that gets no reply (past
	// its deadline, its worker dead) must not keep the last one's device
	// time or parts.
	r.Timing = device.Timing{}
	if err := i.check(r); err != nil {
		return err
	}
	if err := i.settle(r.Deadline); err != nil {
		return err
	}
	mem, id, ps := i.slotFor(r)
	copiedIn, copyIn := copyInput(mem, r.Input)
	// Polled for only while no other run is in flight on the device: a
	// loaded device needs its CPUs for the runs. The worker is told, so
	// that it polls for this instance's next request only then too.
	cpu0 := i.g.p.runBegan() // first: a panic in its bills leaves nothing counted
	alone := i.g.d.running.Add(1) == 1
	i.g.runStart()
	ended := false
	defer func() {
		if !ended { // a panic (which the transport recovers): the run leaves the tally
			i.g.p.runEnded(cpu0, false)
		}
	}()
	// Marked in a run only while its message may be out unanswered: a
	// panic outside that window leaves none on the slot, and a discarded
	// slot with none goes at once (dropDiscarded).
	ps.running()
	// Read before the send: the worker may start on the message before
	// the send returns, and its figures must fit in the wall time
	// (boundTiming).
	sent := time.Now()
	i.sent = wire.Mono()
	if err := i.send(r, alone, id); err != nil {
		ps.replied() // it never reached the worker
		ended = true
		i.g.p.cpu.measured(r, i.g.p.runEnded(cpu0, false))
		return err
	}
	var spin time.Duration
	if alone {
		spin = i.reply.Budget()
	}
	n, err := i.recv(r.Deadline, spin)
	i.got = wire.Mono()
	if err == nil {
		ps.replied()
	}
	// Past its deadline too: the CPU its chain goes on using is billed
	// beside it (its run is charged its slot's time).
	cpu := i.g.p.runEnded(cpu0, alone)
	ended = true
	i.g.p.cpu.measured(r, cpu)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		i.overran(ps)
		return errRunDeadline
	}
	i.g.d.running.Add(-1)
	// After any wait for the worker's end below: a run that saw it die
	// counts until it is reaped.
	defer i.g.runEnd()
	if errors.Is(err, errEmptyMessage) { // as a malformed reply (answer)
		i.g.p.killFor(i.g, "it sent an empty message on its instance channel")
		return i.g.lost("running the chain")
	}
	if err != nil {
		return i.g.failed(err, "running the chain")
	}
	wall := time.Since(sent)
	i.reply.Observe(wall)
	err = i.answer(r, i.rep[:n], mem, copiedIn, copyIn, wall)
	i.g.p.cpu.measured(r, cpu) // not the reply's word (cpucharge.go)
	return err
}

// check refuses a run that does not fit the instance, or finds it closed.
func (i *instance) check(r *device.Run) error {
	switch {
	case i.slot == nil:
		return errors.New("worker instance: closed")
	case int64(len(r.Input)) > i.maxIn || int64(len(r.Output)) > i.out || r.TmpLen < 0 || r.TmpLen > i.tmp:
		return fmt.Errorf("run of %d/%d/%d bytes on an instance of %d/%d/%d", len(r.Input), r.TmpLen, len(r.Output), i.maxIn, i.tmp, i.out)
	case len(r.Chain) == 0 || len(r.Chain) > wire.MaxSteps:
		return fmt.Errorf("chain has %d steps", len(r.Chain))
	}
	return nil
}

// settle waits, until dl, for the last run if it passed its deadline and
// may still be finishing (finish), and finds the worker alive.
func (i *instance) settle(dl time.Time) error {
	if i.overrun != nil {
		select {
		case ok := <-i.overrun:
			i.overrun = nil
			if !ok {
				return i.g.idleExit()
			}
		case <-deadlineC(dl):
			return errRunDeadline
		}
	}
	if !i.g.p.alive() {
		return i.g.idleExit()
	}
	return nil
}

// slotFor is the memory r runs in, the id the run message names it by,
// and its pool slot: r's own when it was read into one of this worker's
// that fits, else the instance's (0, no pool slot).
func (i *instance) slotFor(r *device.Run) ([]byte, uint32, *poolSlot) {
	if s, ok := r.Slot.(*poolSlot); ok && s.g == i.g && s.maxIn == i.maxIn && s.out >= int64(len(r.Output)) {
		return s.mem, s.id, s
	}
	return i.slot, 0, nil
}

// copyInput copies a payload not already in mem there: the bytes copied
// beside the worker's own, and how long it took, are part of the run's
// copy-in (into a slot not touched since it was mapped, a cold request's,
// it is page faults as much as bytes).
func copyInput(mem, in []byte) (int64, time.Duration) {
	if len(in) == 0 || &in[0] == &mem[0] {
		return 0, 0
	}
	t0 := time.Now()
	n := int64(copy(mem, in))
	return n, time.Since(t0)
}

// send numbers r's run and sends its message, naming slot id. A run that
// did not reach the worker leaves the device's and the worker's counts of
// runs in flight again.
func (i *instance) send(r *device.Run, alone bool, id uint32) error {
	i.seq++
	msg := wire.EncodeRun(i.msg, r, alone, id, i.seq)
	// One message is ever in flight, so the send never waits; if it would,
	// the worker stuffed its own channel.
	err := unix.Sendto(i.fd, msg, unix.MSG_DONTWAIT, nil)
	if err == nil {
		return nil
	}
	i.g.d.running.Add(-1)
	i.g.runEnd() // it never reached the worker
	if err == unix.EAGAIN {
		i.g.p.killFor(i.g, "it filled its instance channel")
		return i.g.failed(err, "running the chain")
	}
	// The worker's end is gone: the request never reached it.
	return i.g.idleExit()
}

// overran leaves a run that passed its deadline to finish: the chain
// still runs, and counts in flight, its pool slot held, until finish ends.
func (i *instance) overran(ps *poolSlot) {
	i.overrun = make(chan bool, 1)
	if ps != nil {
		ps.hold()
	}
	go i.finish(i.overrun, ps)
}

// answer reads the worker's reply rep to r, run in mem, into r: its
// timing (its figures bounded, boundTiming, by wall, the time from the
// run's message to its reply), with the copy-in done here (copiedIn bytes
// in copyIn), and its
// output, copied out of mem unless it is there already; or the run's
// error. A reply out of turn, one too short to be a reply, or one that
// claims more output than r has room for, ends the worker, for g: the
// worker is well and would not end by itself.
func (i *instance) answer(r *device.Run, rep, mem []byte, copiedIn int64, copyIn, wall time.Duration) error {
	st, outLen, text, err := wire.DecodeReply(rep, r, i.seq)
	if err == nil {
		boundTiming(&r.Timing, wall, int64(len(mem)))
		r.Timing.Handoff, r.Timing.Handback = wire.Handover(rep, i.sent, i.got, wall)
	}
	if err != nil {
		why := fmt.Sprintf("it sent a malformed reply (%v)", err)
		if turn := (*wire.TurnError)(nil); errors.As(err, &turn) {
			why = fmt.Sprintf("it answered out of turn (%v)", turn)
		}
		i.g.p.killFor(i.g, why)
		return i.g.lost("running the chain")
	}
	r.Timing.Copied += copiedIn
	r.Timing.CopyIn += copyIn
	switch st {
	case wire.StOK:
		// The worker runs bundle code: its word on the length is bounded.
		if outLen > uint64(len(r.Output)) {
			i.g.p.killFor(i.g, fmt.Sprintf("it reported %d output bytes of %d", outLen, len(r.Output)))
			return i.g.lost("running the chain")
		}
		at := device.SlotOut(i.maxIn)
		out := mem[at : at+int64(outLen)]
		if outLen > 0 && &r.Output[0] != &out[0] {
			t0 := time.Now()
			r.Timing.Copied += int64(copy(r.Output, out))
			r.Timing.CopyOut += time.Since(t0)
		}
		r.OutLen = int64(outLen)
		return nil
	case wire.StFault:
		return i.g.faulted(text, "running the chain")
	}
	return wire.ErrorOf(st, text)
}

// boundTiming bounds the worker's word on a run's timing, once, here,
// where the run's wall time is known: bundle code can write the reply, and
// its figures go on into Server-Timing, histograms, a batch's split among
// its requests and a pipeline's sums, which may be another tenant's. Each
// of the copy-in, kernels and copy-out lies in [0, wall], the time from
// the run's message to its reply, within which the worker did them all;
// the bytes it copied on the host in [0, slot], its slot's size (in and
// out, each at most its part). Busy, the run's charge, is bounded where
// it is charged (sched's DoneUsed), or replaced by the server's own
// measure (cpucharge.go).
func boundTiming(t *device.Timing, wall time.Duration, slot int64) {
	t.CopyIn = min(max(t.CopyIn, 0), wall)
	t.Kernels = min(max(t.Kernels, 0), wall)
	t.CopyOut = min(max(t.CopyOut, 0), wall)
	t.Copied = min(max(t.Copied, 0), slot)
}

// runStart and runEnd count a run in flight on g's worker, and in a
// tenant's worker on g (for tenantOutput).
func (g *program) runStart() {
	g.p.runs.Add(1)
	if g.p.tenant != nil {
		g.runs.Add(1) // before busyNow's load of busy: reweigh relies on it
		g.busyNow()
	}
}

func (g *program) runEnd() {
	if g.p.tenant != nil {
		g.runEnded.Store(monoNow())
		g.runs.Add(-1)
	}
	g.p.runs.Add(-1)
}

// faulted is the error of g's call that faulted its worker's device
// context (a StFault reply saying text), once the worker is gone.
func (g *program) faulted(text, during string) error {
	return &faultError{ke: &device.KernelError{Msg: text}, exit: g.lost(during)}
}

// faultError is a chain or hook that faulted the worker's device context
// for good: the request failed like any kernel failure, and the worker is
// gone.
type faultError struct {
	ke   *device.KernelError
	exit error
}

func (e *faultError) Error() string { return e.ke.Error() }

func (e *faultError) Unwrap() []error { return []error{e.ke, e.exit} }
