package wire

import (
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A request's hand-over to a worker and back is two wake-ups of a sleeping
// thread, 44 µs of a hot CNN request on a 2-CPU VM (BENCHMARKS.md), where
// waking a thread on an idle virtual CPU is costly. Each side may instead
// poll its channel for a while before it sleeps, catching the message as
// it lands. Polling takes the CPU, so it is done only while the device has
// no other run in flight: the server polls for a reply only when its run
// is the device's one, and stops the moment another starts; the worker
// polls for an instance's next request only when the last one came while
// the device had no other (the server says so in the run message) and none
// of its other instances runs. A sequential client's requests get the
// polling, a loaded device gets its CPUs. Each side polls for twice the
// wait it has recently seen, when that is short.

// SpinMax is the longest a side polls. It covers a short chain's whole run
// (the CNN's 80-150 µs on the host device), so that its reply is caught as
// it lands rather than by a wake-up; past it a wait is a long run's or a
// client's, and a wake-up costs nothing measurable against it.
const SpinMax = 300 * time.Microsecond

// WaitEstimate tracks a side's recent waits (an exponentially weighted mean
// in nanoseconds) and says how long to poll for the next one.
type WaitEstimate struct{ ns atomic.Int64 }

func (w *WaitEstimate) Observe(d time.Duration) {
	// A long wait (a client that paused) says only that it was long: kept
	// whole, it would hold the mean past SpinMax for many waits after.
	d = min(d, 2*SpinMax)
	old := w.ns.Load()
	if old == 0 {
		w.ns.Store(int64(d))
		return
	}
	w.ns.Store(old + (int64(d)-old)/4)
}

// budget is how long to poll: twice the recent wait, or nothing when that
// passes SpinMax (the message will come after a poll would give up).
func (w *WaitEstimate) Budget() time.Duration {
	b := 2 * time.Duration(w.ns.Load())
	if b > SpinMax {
		return 0
	}
	return b
}

// PollRecv reads one message from fd without sleeping, for up to d, or
// until busy counts more than limit (another run started: the CPU is
// wanted): unix.EAGAIN when none came. A raw system call: no scheduler
// hand-off and no allocation per poll.
func PollRecv(fd int, p []byte, d time.Duration, busy *atomic.Int32, limit int32) (int, error) {
	start := time.Now()
	for {
		n, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)), unix.MSG_DONTWAIT, 0, 0)
		switch {
		case e == 0:
			return int(n), nil
		case e != unix.EAGAIN && e != unix.EINTR:
			return 0, e
		}
		if time.Since(start) >= d || busy.Load() > limit {
			return 0, unix.EAGAIN
		}
	}
}
