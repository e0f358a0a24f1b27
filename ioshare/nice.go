package ioshare

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// renice sets the calling thread's nice level (a nice level is a thread's
// on Linux); the caller is locked to its thread.
func renice(n int) error {
	return unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), n)
}

// baseNice is the nice level of this process's threads, and whether it
// may take a thread's level back to it once it raised it (CAP_SYS_NICE,
// or an RLIMIT_NICE that allows it): without, a thread that moved one
// piece niced would stay so. Tried on a thread of its own, which ends with
// its goroutine either way.
func baseNice() (int, bool) {
	type answer struct {
		level int
		ok    bool
	}
	c := make(chan answer)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		raw, err := unix.Getpriority(unix.PRIO_PROCESS, 0)
		if err != nil {
			c <- answer{}
			return
		}
		level := 20 - raw // the system call's value is 20 - nice
		c <- answer{level, level < 19 && renice(level+1) == nil && renice(level) == nil}
	}()
	a := <-c
	return a.level, a.ok
}

// nice moves the calling goroutine's thread to level n for a piece, if
// pieces may move niced and fewer threads than the Go scheduler has Ps
// less one are niced now (a niced thread the kernel leaves waiting still
// holds its P: the others, a collection's stop included, must not all
// wait on such threads). It reports whether it did; unnice undoes it.
func (s *Shares) nice(n int) bool {
	if n <= s.base || !s.niceOK.Load() {
		return false
	}
	if s.niced.Add(1) > int32(max(1, runtime.GOMAXPROCS(0)-1)) {
		s.niced.Add(-1)
		return false
	}
	runtime.LockOSThread()
	if renice(n) != nil {
		runtime.UnlockOSThread()
		s.niced.Add(-1)
		return false
	}
	return true
}

// unnice takes the thread back to the server's level. Where that fails
// (it did not at start) the goroutine keeps its thread, rather than have
// others run niced on it (Go ends the thread with the goroutine), and no
// piece moves niced again.
func (s *Shares) unnice() {
	s.niced.Add(-1)
	if renice(s.base) != nil {
		s.niceOK.Store(false)
		return
	}
	runtime.UnlockOSThread()
}
