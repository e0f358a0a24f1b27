package contain

import (
	"log/slog"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// killStrays kills and reaps this process's children that it did not
// start, with everything under them. Only those under no_new_privs are
// taken (every worker's descendant is, as Enter set it before any bundle
// code ran), unless this process is under it too and so cannot tell: a
// process that library code in the server started is not touched.
//
// It never blocks on one process: endStrays serves every worker's look,
// and a stray's exit may be reported to a tracer first, which need never
// wait for it (the stray stays unreapable until the tracer goes).
func killStrays() {
	k := strayKill{self: os.Getpid(), fds: map[int]int{}, direct: map[int]bool{}, old: map[int]bool{}}
	k.tellable = !noNewPrivs(k.self)
	defer k.close(stuck)
	k.adopt(stuck)
	for end := time.Now().Add(strayTime); ; {
		// Nothing is reaped until the walk converged: a killed
		// process's zombie keeps its pid and its charge against
		// RLIMIT_NPROC and a pids cgroup, so that what is left cannot
		// fork again into the room a reap would make.
		if k.round() == 0 && k.allExited() {
			break
		}
		if !time.Now().Before(end) {
			slog.Warn("strays still running after a look's bound: later looks neither kill nor wait for them again, and reap them once they exit", "bound", strayTime, "killed", len(k.fds)-len(k.old))
			break
		}
		k.waitExit(end)
	}
	k.reap()
}

// stuck holds, by pidfd, the processes that outlived a look's bound (an
// uninterruptible sleep, a frozen cgroup, a slow exit), which only
// endStrays's goroutine touches. Each had SIGKILL sent, so it cannot fork
// again: a later look walks it (its children may still be to kill) but
// does not wait for it, as each look, two per dead worker through the one
// endStrays, would pay the whole bound again for the same process.
var stuck = map[int]int{}

// strayKill is one look's state: every process it signalled.
type strayKill struct {
	self     int
	tellable bool
	fds      map[int]int  // pid -> its pidfd (-1: none)
	direct   map[int]bool // killed as this process's child
	old      map[int]bool // taken from stuck: not waited for
}

// adopt takes over the processes stuck holds, as killed but not waited
// for. One that exited since is reaped with the look's own, once the walk
// converged, not before: a reap frees a task that what is not yet killed
// could fork into.
func (k *strayKill) adopt(stuck map[int]int) {
	for pid, fd := range stuck {
		delete(stuck, pid)
		k.fds[pid], k.old[pid] = fd, true
	}
}

// known reports whether the look killed c already. One taken from stuck,
// or killed this look under another stray, must still hold its pid (not
// reaped by a parent that ignores SIGCHLD, a tenant's subreaper or init):
// else c is another process, which the look has yet to kill. A child of
// this process holds its pid until the look reaps it.
func (k *strayKill) known(c int) bool {
	fd, ok := k.fds[c]
	if ok && (k.old[c] || fd >= 0 && !k.direct[c]) && !k.held(c) {
		unix.Close(fd)
		delete(k.fds, c)
		delete(k.old, c)
		return false
	}
	return ok
}

// round kills every stray not yet killed, and what is under it, and
// returns how many it killed. A process killed cannot fork once kill
// returned (the kernel checks a fatal signal under the lock that adds a
// child), so its children read after the kill are all it will have; what
// a round still misses (a child it was moving up to this process as its
// parent exited; one made with CLONE_PARENT) the next finds, and none is
// missed once every killed process exited.
func (k *strayKill) round() int {
	n := 0
	var walk []int
	ours.Lock()
	for _, c := range childrenOf(k.self) {
		if _, known := ours.pids[c]; known {
			continue
		}
		if !k.known(c) {
			if k.tellable && !noNewPrivs(c) {
				continue
			}
			// A child not yet reaped: the pid cannot be another's.
			fd, err := unix.PidfdOpen(c, 0)
			if err != nil {
				fd = -1
			}
			unix.Kill(c, unix.SIGKILL)
			k.fds[c] = fd
			k.direct[c] = true
			n++
		}
		walk = append(walk, c)
	}
	ours.Unlock()
	if !HavePidfds() {
		// Only a child's pid is safe to signal: the rest go a
		// generation a round, as each is left to this process.
		return n
	}
	seen := map[int]bool{}
	for len(walk) > 0 {
		p := walk[len(walk)-1]
		walk = walk[:len(walk)-1]
		for _, c := range childrenOf(p) {
			if seen[c] {
				continue
			}
			seen[c] = true
			if !k.known(c) {
				if !k.killUnder(p, c) {
					continue
				}
				n++
			}
			walk = append(walk, c)
		}
	}
	return n
}

// killUnder kills c, a child of p, through a pidfd: c's pid may have been
// reaped and reused since the children file named it, and the pidfd holds
// the process whose parent is checked. p's pid may have been too: a killed
// p whose parent ignores SIGCHLD is reaped as it exits, and the pid's next
// holder's children would match by number. So p must still be unreaped
// after c's parent was read (held): then it held its pid all along.
func (k *strayKill) killUnder(p, c int) bool {
	fd, err := unix.PidfdOpen(c, 0)
	if err != nil {
		return false
	}
	if ppid, _, ok := statOf(c); !ok || ppid != p || !k.held(p) || unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) != nil {
		unix.Close(fd)
		return false
	}
	k.fds[c] = fd
	return true
}

// held reports whether p, a process the look killed, has not been reaped
// (running, or a zombie), through the pidfd it holds p by: a signal 0
// reaches a process until its reap. Without one, only a child of this
// process is sure to be: nothing else reaps it before the look ends.
func (k *strayKill) held(p int) bool {
	if fd, ok := k.fds[p]; ok && fd >= 0 {
		return unix.PidfdSendSignal(fd, 0, nil, 0) == nil
	}
	return k.direct[p]
}

// allExited reports whether every process the look killed has exited.
func (k *strayKill) allExited() bool {
	for pid, fd := range k.fds {
		if !k.old[pid] && !exited(pid, fd) {
			return false
		}
	}
	return true
}

// exited reports whether pid (held by pidfd fd, -1 for none) has exited:
// a zombie, or gone.
func exited(pid, fd int) bool {
	if fd >= 0 {
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(p, 0)
		return err == nil && n > 0
	}
	f := statFields(pid)
	return len(f) == 0 || f[0] == "Z" || f[0] == "X"
}

// waitExit waits, until end at the latest, for one of the killed
// processes still running to exit.
func (k *strayKill) waitExit(end time.Time) {
	var p []unix.PollFd
	for pid, fd := range k.fds {
		if k.old[pid] {
			continue
		}
		if fd < 0 {
			// No pidfd to wait on: look again shortly.
			time.Sleep(min(time.Millisecond, time.Until(end)))
			return
		}
		if !exited(pid, fd) {
			p = append(p, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
		}
	}
	if len(p) == 0 {
		return
	}
	ms := max(int(time.Until(end).Milliseconds()), 0)
	unix.Poll(p, ms) // EINTR, or an error: the caller looks again
}

// reap reaps the killed processes that are this process's children now,
// without waiting: one whose exit went to a tracer that is none of the
// strays is left to a later look. Through the pidfd, so that a pid that
// was reaped and reused meanwhile (a descendant's, by its parent) is
// never taken for it: by pid only where the look killed it as a child.
func (k *strayKill) reap() {
	for pid, fd := range k.fds {
		var info unix.Siginfo
		var err error = unix.EINVAL
		for fd >= 0 {
			if err = unix.Waitid(unix.P_PIDFD, fd, &info, unix.WEXITED|unix.WNOHANG, nil); err != unix.EINTR {
				break
			}
		}
		if err == unix.EINVAL && k.direct[pid] { // no P_PIDFD (before Linux 5.4)
			for unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOHANG, nil) == unix.EINTR {
			}
		}
	}
}

// close keeps in stuck, by their pidfds, the processes still running
// once the look ended, and closes the rest. Without a pidfd one is not
// kept: only a pidfd tells it from a later holder of its pid.
func (k *strayKill) close(stuck map[int]int) {
	for pid, fd := range k.fds {
		switch {
		case fd < 0:
		case !exited(pid, fd):
			stuck[pid] = fd
		default:
			unix.Close(fd)
		}
	}
}

// HavePidfds reports whether the kernel has pidfd_open (Linux 5.3).
var HavePidfds = sync.OnceValue(func() bool {
	fd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		return false
	}
	unix.Close(fd)
	return true
})
