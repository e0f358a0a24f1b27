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
// may be taken back down once raised. It tries on a thread of its own,
// which ends with its goroutine either way.
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
// the caller locked it and lets it end. Only CAP_SYS_NICE counts: an
// RLIMIT_NICE that allows the thread its level back is the target's, not
// the caller's, and a worker drops its own (contain.Enter), so it would
// not let the server take a worker's level back down.
func Try() (level int, lower bool) {
	raw, err := unix.Getpriority(unix.PRIO_PROCESS, 0)
	if err != nil {
		return 0, false
	}
	n := 20 - raw // the system call's value is 20 - nice
	if !HasCap(unix.CAP_SYS_NICE) {
		return n, false
	}
	return n, n < 19 && unix.Setpriority(unix.PRIO_PROCESS, 0, n+1) == nil && unix.Setpriority(unix.PRIO_PROCESS, 0, n) == nil
}

// HasCap reports whether the calling thread holds capability c
// (unix.CAP_*, below 32) in its effective set.
func HasCap(c int) bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[0].Effective&(1<<c) != 0
}
