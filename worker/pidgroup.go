package worker

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// PidGroups bounds the tasks (processes and threads together) that each
// worker and everything it starts may have at once. Without a bound, one
// bundle that forks or spins threads until the kernel refuses takes every
// task the node has: every other tenant's next worker fails to start and
// the server itself can no longer make a thread, which kills it. With one,
// the bundle's own fork fails (EAGAIN), and only its worker notices.
//
// Where cgroups can be written each worker gets a pids group whose
// pids.max is the bound, made as it starts (before it runs bundle code)
// and removed once it is gone: under cgroup v1 a group of its own in the
// pids hierarchy, inside the group the server runs in (plover-<server
// pid>/<worker pid>); under v2 its CPU group (CPUGroups), which then holds
// both controllers, as a process is in one group of a v2 hierarchy.
// Where they cannot, each worker gets RLIMIT_NPROC instead, which the
// kernel counts per uid: it then bounds all workers of one uid together
// (the server and other users are kept safe, tenants not from each other),
// at the bound more than the tasks the uid had when the server started
// (with workers of the server's own uid, a desktop user's thousand
// threads must not leave workers none). Mechanism says which is in force.
type PidGroups struct {
	ctlGroups
	max  int
	uid  int    // the workers' uid (RLIMIT_NPROC)
	rlim uint64 // RLIMIT_NPROC at the fallback (logged): the uid's tasks then, plus max

	// Under mu. broken: RLIMIT_NPROC from then on. rlimSaid: a failed
	// RLIMIT_NPROC was logged; raiseSaid: a failed raise of one.
	rlimSaid, raiseSaid bool
}

// NewPidGroups finds where cgroup pids controllers can be written under
// root (the cgroup mount) for a bound of max tasks per worker, and logs
// which mechanism is in force; uid is the workers' (RLIMIT_NPROC counts
// it), cpu the workers' CPU groups (under v2 the bound goes in them; nil:
// none). A max of 0 or less is no bound (nil).
func NewPidGroups(root string, max, uid int, cpu *CPUGroups, log *slog.Logger) *PidGroups {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if max <= 0 {
		log.Warn("worker tasks unbounded (--worker-max-pids 0): a bundle that forks or makes threads until the kernel refuses takes every task of the node, the server's included")
		return nil
	}
	g := &PidGroups{ctlGroups: ctlGroups{ctl: "pids", log: log}, max: max, uid: uid}
	if err := g.ready(root, cpu); err != nil {
		g.fallBack(err)
		return g
	}
	log.Info("worker tasks bounded by a pids cgroup per worker", "max", max, "mechanism", g.Mechanism())
	return g
}

// fallBack turns the groups off for RLIMIT_NPROC, saying why once.
func (g *PidGroups) fallBack(why error) {
	base := tasksOf(g.uid) // read before the lock: a walk of /proc
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.broken != nil {
		return
	}
	g.broken = why
	g.rlim = uint64(base + g.max)
	msg := "worker tasks bounded by RLIMIT_NPROC, which counts per uid: all workers of the uid together may have the bound more than the uid had now (the server and other users are safe; tenants are not from each other)"
	if g.uid == 0 {
		msg = "worker tasks unbounded: no pids cgroup, and RLIMIT_NPROC does not apply to root, the workers' uid"
	}
	g.log.Warn(msg, "max", g.max, "uid", g.uid, "uid_tasks", base, "rlimit_nproc", g.rlim, "why", why)
}

// Mechanism says how workers' tasks are bounded: "cgroup v1", "cgroup v2",
// "rlimit", or "off".
func (g *PidGroups) Mechanism() string {
	switch {
	case g == nil || g.off() != nil && g.uid == 0:
		return "off"
	case g.off() != nil:
		return "rlimit"
	}
	return g.mechanism()
}

// Place bounds the tasks of process pid, a worker that has not run bundle
// code yet, whose CPU group is cg (nil: none), and returns its group to
// remove once it exited and was emptied, before its reap (nil: nothing to
// remove). As for CPUGroups.Place the caller holds what keeps pid from being reaped meanwhile. A group
// that cannot be made turns the groups off for RLIMIT_NPROC (logged once),
// from this worker on.
func (g *PidGroups) Place(pid int, cg *Group) *ownGroup {
	if g == nil {
		return nil
	}
	if g.off() == nil {
		c, err := g.place(pid, cg)
		switch {
		case err == nil || errors.Is(err, syscall.ESRCH):
			return c
		case errors.Is(err, errNoCPUGroup):
			// This worker's alone, and CPUGroups.Place said why (or it
			// exited before its placement, when the limit is harmless):
			// it gets RLIMIT_NPROC.
		case errors.Is(err, errGroupsLeft):
			g.log.Warn("a worker without a pids group", "pid", pid, "error", err)
		default:
			g.fallBack(fmt.Errorf("worker %d: %w", pid, err))
		}
	}
	g.limit(pid)
	return nil
}

// place puts pid in a pids group with the bound (ctlGroups.place).
func (g *PidGroups) place(pid int, cg *Group) (*ownGroup, error) {
	own, _, err := g.ctlGroups.place(pid, cg, func(dir string) error {
		return os.WriteFile(filepath.Join(dir, "pids.max"), []byte(strconv.Itoa(g.max)), 0o644)
	})
	return own, err
}

// errNoCPUGroup: a worker whose bound would go in its CPU group has none
// while the CPU groups are on: every name for it was taken by leftovers
// (errGroupsLeft), or it exited before it was placed. CPUGroups.Place
// returns nil for both; reading nil as "gone" left a worker of the first
// kind without any bound, so either gets RLIMIT_NPROC (a zombie's is
// harmless: the caller keeps it from being reaped, so the pid is still its).
var errNoCPUGroup = errors.New("no CPU group to hold the bound")

// limit sets RLIMIT_NPROC of pid (soft and hard: bundle code, without
// CAP_SYS_RESOURCE, cannot raise it) to the uid's tasks and the bound,
// logging a failure once.
func (g *PidGroups) limit(pid int) {
	if g.uid == 0 {
		return
	}
	// The uid's tasks now, not at the fallback: the server's own threads
	// (a server running as the workers' uid) and the workers' grow, and a
	// budget read once would shrink for the workers started later.
	n := uint64(tasksOf(g.uid) + g.max)
	lim := unix.Rlimit{Cur: n, Max: n}
	err := unix.Prlimit(pid, unix.RLIMIT_NPROC, &lim, nil)
	if err == nil || errors.Is(err, unix.ESRCH) {
		return
	}
	g.warnOnce(&g.rlimSaid, "worker tasks unbounded: cannot set a worker's RLIMIT_NPROC", "pid", pid, "error", err)
}

// Raise bounds the tasks of worker pid, whose groups Place gave (c, and
// cg under v2), at n times the bound, up from was times: a tenant's worker
// holding n programs (each of their live instances keeps a thread of the
// worker) may have what n workers of one program each would, where one
// program's bound would have it die of its siblings' threads (the Go
// runtime aborts when it cannot make one), taking every function in it.
// The caller holds what keeps pid from being reaped meanwhile (a pid must
// not be written once it may have been reused).
func (g *PidGroups) Raise(pid int, c *ownGroup, cg *Group, was, n int) {
	if g == nil || n <= was {
		return
	}
	max := []byte(strconv.Itoa(g.max * n))
	// Where the worker was bounded: its v1 group, its v2 CPU group, or
	// (where neither took the bound at its start) its RLIMIT_NPROC; each
	// tried in turn, as Place did.
	if c != nil && os.WriteFile(filepath.Join(c.dir, "pids.max"), max, 0o644) == nil {
		return
	}
	if g.cpu != nil && cg != nil && cg.dir != "" && os.WriteFile(filepath.Join(cg.dir, "pids.max"), max, 0o644) == nil {
		return
	}
	if g.uid == 0 {
		return // no RLIMIT_NPROC bound either (root's is not enforced)
	}
	// RLIMIT_NPROC counts the uid's tasks: the worker's limit (the uid's
	// tasks at its start and the bound) grows by the bound for each
	// program more. Raising a hard limit needs CAP_SYS_RESOURCE, which a
	// server without writable cgroups (a container) seldom has: then the
	// worker keeps one program's bound, and the server says so once.
	var lim unix.Rlimit
	err := unix.Prlimit(pid, unix.RLIMIT_NPROC, nil, &lim)
	if err == nil && lim.Cur == unix.RLIM_INFINITY {
		return
	}
	if err == nil {
		lim.Cur += uint64(g.max * (n - was))
		lim.Max = lim.Cur
		err = unix.Prlimit(pid, unix.RLIMIT_NPROC, &lim, nil)
	}
	if err == nil || errors.Is(err, unix.ESRCH) {
		return
	}
	g.warnOnce(&g.raiseSaid, "a tenant's worker keeps one function's task bound (--worker-max-pids) whatever it holds: cannot raise its RLIMIT_NPROC (needs CAP_SYS_RESOURCE, or writable cgroups)", "pid", pid, "error", err)
}

// Close removes the server's pids groups (every worker is gone by then).
func (g *PidGroups) Close() {
	if g != nil {
		g.close()
	}
}

// tasksOf counts the tasks (threads) of the processes whose real uid is
// uid, as far as this process's /proc shows them: what RLIMIT_NPROC
// counts, at least.
func tasksOf(uid int) int {
	n := 0
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		f, err := os.Open(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		var real, threads int
		ok := false
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			k, v, _ := strings.Cut(sc.Text(), ":")
			fields := strings.Fields(v)
			switch {
			case k == "Uid" && len(fields) > 0:
				real, _ = strconv.Atoi(fields[0])
				ok = true
			case k == "Threads" && len(fields) > 0:
				threads, _ = strconv.Atoi(fields[0])
			}
		}
		f.Close()
		if ok && real == uid {
			n += threads
		}
	}
	return n
}

// ownSpare is the threads a worker may hold of its own past one per CPU:
// the Go runtime's monitor and spare, the control loop, a CUDA context's
// (a handful), and a bundle's constructor's few.
const ownSpare = 16

// OwnThreads is the most threads a worker process holds besides its
// instances': the Go runtime may start one per processor (its
// GOMAXPROCS, at most this machine's CPUs) while its goroutines run Go
// code, idle GC workers on every idle processor among them, and ownSpare
// more.
func OwnThreads() int { return runtime.NumCPU() + ownSpare }

// InstanceRoom is how many instances of one program a worker bounded at
// max tasks may hold: each holds a thread of the worker for its life (its
// goroutine waits for runs in a read, as a tenant's worker's is locked
// to one), and past the bound the Go runtime, refused a thread, aborts the
// worker with every function in it. A tenant's worker is raised max for
// each program it holds (Raise), so this many of each fit too. 0 for
// max 0 (no bound); 0 or less too where max leaves the worker's own
// threads no room for one, which the caller, knowing max, refuses.
func InstanceRoom(max int) int {
	if max <= 0 {
		return 0
	}
	return max - OwnThreads()
}
