// Package nicelevel finds whether this process may take a thread's nice
// level back down once it raised it: the fact the workers' CPU weights
// (package worker) and the server's I/O threads (package ioshare) both
// depend on where nice levels stand in for cgroups; and reads and sets a
// thread's nice level and EEVDF slice together, as the light workers'
// short slices need.
package nicelevel

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"time"

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
// the caller locked it and lets it end. At nice 19 it says no whatever the
// capabilities: no level above is left to raise a thread to, so there is
// nothing to weigh by and nothing to take back (callers that log why
// read the level). Only CAP_SYS_NICE counts: an
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

// Attr is a thread's scheduling attributes that the server reads: its
// policy, its nice level, and its EEVDF slice (Linux 6.12 and later; 0
// where the kernel keeps none per thread).
type Attr struct {
	Policy uint32
	Nice   int
	Slice  time.Duration
}

// Sliced reports whether a's policy takes a nice level and a slice of its
// own (SCHED_NORMAL, SCHED_BATCH): SCHED_IDLE takes neither from
// sched_setattr (setpriority sets its level), real-time policies no level.
func (a Attr) Sliced() bool { return a.Policy == unix.SCHED_NORMAL || a.Policy == unix.SCHED_BATCH }

// Thread is thread tid's attributes (sched_getattr; tid 0: the calling
// thread).
func Thread(tid int) (Attr, error) {
	a, err := unix.SchedGetAttr(tid, 0)
	if err != nil {
		return Attr{}, err
	}
	return Attr{Policy: a.Policy, Nice: int(a.Nice), Slice: time.Duration(a.Runtime)}, nil
}

// SetThread sets thread tid's nice level and slice in one call
// (sched_setattr), keeping its policy and its reset-on-fork flag, as the
// thread may change them itself between a read and this: slice 0 gives it
// the kernel's default, which it then follows. A nice level set by
// setpriority after keeps the slice, and a thread or process made by the
// thread starts with both. On a thread whose policy is not Sliced the
// kernel takes neither (and answers success).
func SetThread(tid, nice int, slice time.Duration) error {
	return unix.SchedSetAttr(tid, &unix.SchedAttr{Flags: unix.SCHED_FLAG_KEEP_POLICY, Nice: int32(nice), Runtime: uint64(slice)}, 0)
}

// DefaultSlice is the slice the kernel gives a thread that asks for none
// (its base slice, scaled by the CPUs), read on a thread of its own that
// asks for none first; 0 where the kernel keeps no slice per thread
// (before Linux 6.12 sched_getattr reports none), or where this process's
// threads' policy takes none.
func DefaultSlice() time.Duration {
	type probe struct {
		slice time.Duration
		tid   int
	}
	c := make(chan probe, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		tid := unix.Gettid()
		a, err := Thread(0)
		if err != nil || !a.Sliced() || a.Slice == 0 || SetThread(0, a.Nice, 0) != nil {
			c <- probe{0, tid}
			return
		}
		if a, err = Thread(0); err != nil {
			c <- probe{0, tid}
			return
		}
		c <- probe{a.Slice, tid}
	}()
	p := <-c
	// The probe's thread, at the default slice now, may yet make one of
	// the runtime's threads (its send wakes a goroutine, which may start
	// a thread from it), which would take that slice: waited for until it
	// is gone, so that every thread it made exists when the caller sets
	// the process's threads (SliceProcess), which once left such a thread
	// at the default (a test saw one, under load).
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if _, err := os.Stat(fmt.Sprintf("/proc/self/task/%d", p.tid)); err != nil {
			break
		}
	}
	return p.slice
}

// SliceProcess gives every thread of the calling process slice d (0: the
// kernel's default, followed from then on), each keeping its policy and
// level, in passes over its threads (Settle: threads made while it works
// take their maker's). Threads the Go runtime makes later take their
// maker's slice too, so once all have it they keep it.
func SliceProcess(d time.Duration) error {
	done := map[int]bool{}
	_, err := Settle(10, func() (set bool, err error) {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return false, err
		}
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil || done[tid] {
				continue
			}
			a, err := Thread(tid)
			if err == unix.ESRCH {
				continue
			}
			if err != nil {
				return set, fmt.Errorf("thread %d's attributes: %w", tid, err)
			}
			if err := SetThread(tid, a.Nice, d); err != nil && err != unix.ESRCH {
				return set, fmt.Errorf("thread %d's slice: %w", tid, err)
			}
			done[tid], set = true, true
		}
		return set, nil
	})
	return err
}

// Settle sets a value (a nice level, a slice) on a set of threads or
// processes that changes as it works, each new one taking its maker's
// value: pass goes over the set once, saying whether it set any. Settle
// runs passes until one sets none, and, where any did, once more: one
// being made as its maker was set (copied at the old value, not yet
// listed) can miss the first pass that sets none, never the one after
// (one test run in several hundred saw a thread at its old level). At
// most rounds passes: a set that outruns them keeps what is left.
// changed says whether any pass set any.
func Settle(rounds int, pass func() (set bool, err error)) (changed bool, err error) {
	confirmed := false
	for range rounds {
		set, err := pass()
		changed = changed || set
		switch {
		case err != nil:
			return changed, err
		case set:
			confirmed = false
		case !changed || confirmed:
			return changed, nil
		default:
			confirmed = true
		}
	}
	return changed, nil
}
