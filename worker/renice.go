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
// inherit them.
// The threads change while it works: one made after the list was read by
// a thread not yet set takes the old level, for good. So it reads the
// list again until a pass finds every thread at n (at most reniceRounds
// passes: a process whose threads outrun it keeps what is left), and,
// where it set any, once more: a thread its parent was making while the
// parent was set (copied at the old level, not yet in the list) can miss
// the first pass that finds the rest at n, never the one after (one test
// run in several hundred saw one at its old level).
//
// With raiseOnly (no CAP_SYS_NICE: a level cannot be taken back down) a
// thread already at a higher level than n (one that raised its own) is
// left there: lowering it would fail. changed says whether it set any
// thread (reniceTree's passes end on a pass that set none).
func renice(pid, n int, sl slicing, raiseOnly bool) (changed bool, err error) {
	confirmed := false
	for range reniceRounds {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return changed, syscall.ESRCH
			}
			return changed, err
		}
		set := false
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil {
				continue
			}
			if sl.light != 0 {
				ok, err := sl.set(tid, n, raiseOnly)
				if err != nil {
					return changed, err
				}
				set, changed = set || ok, changed || ok
				continue
			}
			// The system call's value is 20 - nice.
			raw, err := syscall.Getpriority(syscall.PRIO_PROCESS, tid)
			if err == syscall.ESRCH || err == nil && (20-raw == n || raiseOnly && 20-raw > n) {
				continue
			}
			if err := syscall.Setpriority(syscall.PRIO_PROCESS, tid, n); err != nil && err != syscall.ESRCH {
				if raisedMeanwhile(tid, n, raiseOnly, err) {
					continue
				}
				return changed, err
			}
			set, changed = true, true
		}
		switch {
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
		if err := syscall.Setpriority(syscall.PRIO_PROCESS, tid, n); err != nil && err != syscall.ESRCH {
			return false, orRaised(tid, n, raiseOnly, err)
		}
		return true, nil
	}
	if a.Nice == n && sl.has(a.Slice) {
		return false, nil
	}
	if err := nicelevel.SetThread(tid, n, sl.want); err != nil && err != syscall.ESRCH {
		return false, orRaised(tid, n, raiseOnly, err)
	}
	return true, nil
}

// raisedMeanwhile reports whether a set of thread tid to level n that
// failed with err failed because the thread raised its own level above n
// after it was read (a bundle may: with raiseOnly the set would take it
// back down, which takes a privilege the server lacks), or has gone: its
// business, not a mechanism that broke. Taken for a failure, it turned
// every worker's weights off; a hostile bundle's threads raising
// themselves as the server set them did so within a hundred tries.
func raisedMeanwhile(tid, n int, raiseOnly bool, err error) bool {
	if !raiseOnly || !errors.Is(err, syscall.EACCES) && !errors.Is(err, syscall.EPERM) {
		return false
	}
	raw, gerr := syscall.Getpriority(syscall.PRIO_PROCESS, tid) // 20 - nice
	return gerr == syscall.ESRCH || gerr == nil && 20-raw > n
}

// orRaised is err, or nil where the thread raised its level meanwhile
// (raisedMeanwhile).
func orRaised(tid, n int, raiseOnly bool, err error) error {
	if raisedMeanwhile(tid, n, raiseOnly, err) {
		return nil
	}
	return err
}

// reniceRounds bounds renice's passes over a process's threads, and
// reniceTree's over a worker's processes.
const reniceRounds = 10
