// Package nicelevel finds whether this process may take a thread's nice
// level back down once it raised it: the fact the workers' CPU weights
// (package worker) and the server's I/O threads (package ioshare) both
// depend on where nice levels stand in for cgroups.
package nicelevel

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// Probe is the nice level of this process's threads and whether a level
// may be taken back down once raised (CAP_SYS_NICE, or an RLIMIT_NICE
// that allows it). It tries on a thread of its own, which ends with its
// goroutine either way. A child's RLIMIT_NICE is its parent's, so what
// holds for this process's threads holds for the workers it starts.
func Probe() (level int, lower bool) {
	type answer struct {
		level int
		lower bool
	}
	c := make(chan answer)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		level, lower := Try()
		c <- answer{level, lower}
	}()
	a := <-c
	return a.level, a.lower
}

// Try is Probe on the calling thread, which it may leave one level up:
// the caller locked it and lets it end.
func Try() (level int, lower bool) {
	raw, err := unix.Getpriority(unix.PRIO_PROCESS, 0)
	if err != nil {
		return 0, false
	}
	n := 20 - raw // the system call's value is 20 - nice
	return n, n < 19 && unix.Setpriority(unix.PRIO_PROCESS, 0, n+1) == nil && unix.Setpriority(unix.PRIO_PROCESS, 0, n) == nil
}
