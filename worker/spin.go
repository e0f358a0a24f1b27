package worker

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
// it lands. Polling takes the CPU, so it is done only when the CPU is not
// wanted by another run of the same side (the server: no other run in
// flight on the device; the worker: none of its other instances running),
// and only for twice the wait the side has recently seen, when that is
// short: a sequential client's requests get the polling, a loaded device
// gets its CPUs.

// spinMax is the longest a side polls. Past it a wait is no hand-over's but
// a run's or a client's, and sleeping costs nothing measurable against it.
const spinMax = 100 * time.Microsecond

// waitEstimate tracks a side's recent waits (an exponentially weighted mean
// in nanoseconds) and says how long to poll for the next one.
type waitEstimate struct{ ns atomic.Int64 }

func (w *waitEstimate) observe(d time.Duration) {
	// A long wait (a client that paused) says only that it was long: kept
	// whole, it would hold the mean past spinMax for many waits after.
	d = min(d, 2*spinMax)
	old := w.ns.Load()
	if old == 0 {
		w.ns.Store(int64(d))
		return
	}
	w.ns.Store(old + (int64(d)-old)/4)
}

// budget is how long to poll: twice the recent wait, or nothing when that
// passes spinMax (the message will come after a poll would give up).
func (w *waitEstimate) budget() time.Duration {
	b := 2 * time.Duration(w.ns.Load())
	if b > spinMax {
		return 0
	}
	return b
}

// pollRecv reads one message from fd without sleeping, for up to d:
// unix.EAGAIN when none came. A raw system call: no scheduler hand-off and
// no allocation per poll.
func pollRecv(fd int, p []byte, d time.Duration) (int, error) {
	start := time.Now()
	for {
		n, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)), unix.MSG_DONTWAIT, 0, 0)
		switch {
		case e == 0:
			return int(n), nil
		case e == unix.EINTR:
			continue
		case e != unix.EAGAIN:
			return 0, e
		}
		if time.Since(start) >= d {
			return 0, unix.EAGAIN
		}
	}
}
