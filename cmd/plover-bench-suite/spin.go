package main

import (
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// spinCPU burns d of the calling thread's CPU time, the goroutine locked
// to its thread meanwhile: the echo floors' stand-in for a kernel, which
// does a fixed amount of work. A spin by the wall clock (until 2026-12-01)
// did less work whenever its thread was descheduled on these shared CPUs,
// so that under load the floor's "kernel" got cheaper than the one Plover
// runs, to the floor's advantage.
func spinCPU(d time.Duration) {
	if d <= 0 {
		return
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	t0, ok := threadCPUTime()
	for ok {
		var t time.Duration
		if t, ok = threadCPUTime(); t-t0 >= d {
			return
		}
	}
}

// threadCPUTime is the calling thread's CPU time, user and system (a
// system call: the vDSO serves only the wall clocks).
func threadCPUTime() (time.Duration, bool) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}
