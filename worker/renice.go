package worker

// A worker's nice level, and with it its EEVDF slice, set on every thread
// of a process whose threads come and go (renice), where its weight is a
// nice level rather than a CPU group's (CPUGroups).

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/plover-run/plover/nicelevel"
)

// renice sets every thread of process pid to nice level n, and with sl
// its slice: both are a thread's on Linux, and threads a thread creates
// inherit them. The threads change while it works: one made after the
// list was read by a thread not yet set takes the old level, for good; so
// it reads the list in passes (nicelevel.Settle, at most reniceRounds).
//
// With raiseOnly (no CAP_SYS_NICE: a level cannot be taken back down) a
// thread already at a higher level than n (one that raised its own) is
// left there: lowering it would fail. changed says whether it set any
// thread (a tree's walk ends on a pass that set none).
func renice(pid, n int, sl slicing, raiseOnly bool) (changed bool, err error) {
	return nicelevel.Settle(reniceRounds, func() (set bool, err error) {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return false, syscall.ESRCH
			}
			return false, err
		}
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil {
				continue
			}
			var ok bool
			if sl.light != 0 {
				ok, err = sl.set(tid, n, raiseOnly)
			} else {
				ok, err = setLevel(tid, n, raiseOnly)
			}
			if err != nil {
				return set, err
			}
			set = set || ok
		}
		return set, nil
	})
}

// setLevel gives thread tid level n unless it has it (false); a thread
// gone is no error. With raiseOnly a thread above n keeps its level.
func setLevel(tid, n int, raiseOnly bool) (bool, error) {
	// The system call's value is 20 - nice.
	raw, err := syscall.Getpriority(syscall.PRIO_PROCESS, tid)
	if err == syscall.ESRCH || err == nil && (20-raw == n || raiseOnly && 20-raw > n) {
		return false, nil
	}
	betweenReadAndSet(tid)
	if err := syscall.Setpriority(syscall.PRIO_PROCESS, tid, n); err != nil && err != syscall.ESRCH {
		return false, raisedOr(tid, n, raiseOnly, err)
	}
	return true, nil
}

// slicing is the EEVDF slice renice gives a worker's threads with their
// level, where the kernel keeps one per thread and light workers get a
// short one (CPUGroups.LightSlice): want, the worker's (light while it is
// boosted, else 0: the kernel's default), and light. Zero: slices are
// left as they are.
type slicing struct{ want, light time.Duration }

// has reports whether a thread with slice d has sl's: for the default,
// any slice but the light one (the default may change with the CPUs, and
// a slice a bundle gave itself is its own business unless it is the
// light one).
func (sl slicing) has(d time.Duration) bool {
	if sl.want == 0 {
		return d != sl.light
	}
	return d == sl.want
}

// set gives thread tid level n and sl's slice in one call, unless it has
// both (false); a thread gone is no error. With raiseOnly a thread above
// n keeps its level. A thread its bundle put in SCHED_IDLE gets its level
// by setpriority (sched_setattr sets none there) and no slice; one in a
// real-time policy (a worker holds no privilege for one) is left alone.
func (sl slicing) set(tid, n int, raiseOnly bool) (bool, error) {
	a, err := nicelevel.Thread(tid)
	if err == syscall.ESRCH {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if raiseOnly && a.Nice > n {
		n = a.Nice
	}
	if !a.Sliced() {
		if a.Policy != unix.SCHED_IDLE || a.Nice == n {
			return false, nil
		}
		return setLevel(tid, n, raiseOnly)
	}
	if a.Nice == n && sl.has(a.Slice) {
		return false, nil
	}
	betweenReadAndSet(tid)
	if err := nicelevel.SetThread(tid, n, sl.want); err != nil && err != syscall.ESRCH {
		return false, raisedOr(tid, n, raiseOnly, err)
	}
	return true, nil
}

// betweenReadAndSet is called between a thread's reading and its setting:
// a test's bundle thread changes its own level there.
var betweenReadAndSet = func(tid int) {}

// raisedOr is nil where a set of thread tid to level n failed (err)
// because the thread raised its own level above n after it was read (a
// bundle may: with raiseOnly the set would take it back down, which takes
// a privilege the server lacks) or has gone: its business, not a
// mechanism that broke. Else it is err. Taken for a failure, it turned
// every worker's weights off; a hostile bundle's threads raising
// themselves as the server set them did so within a hundred tries.
func raisedOr(tid, n int, raiseOnly bool, err error) error {
	if !raiseOnly || !errors.Is(err, syscall.EACCES) && !errors.Is(err, syscall.EPERM) {
		return err
	}
	raw, gerr := syscall.Getpriority(syscall.PRIO_PROCESS, tid) // 20 - nice
	if gerr == syscall.ESRCH || gerr == nil && 20-raw > n {
		return nil
	}
	return err
}

// reniceRounds bounds renice's passes over a process's threads, and
// a tree's walk's over a worker's processes (Group.walk).
const reniceRounds = 10
