package worker

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/plover-run/plover/nicelevel"
)

// Autogroups (CONFIG_SCHED_AUTOGROUP, on by default in many kernels): a
// process in the root CPU cgroup is scheduled in its session's group, CFS
// weighing each session's group as a whole, at the group's own nice level
// (/proc/<pid>/autogroup), and a thread's nice level only against the
// threads of its own session. Every worker leads a session of its own
// (contain.Spawner.Start), so there its threads' levels alone weigh it
// against no other worker nor the server: on the 2-core VM of
// BENCHMARKS.md a nice-19 spinner in a session of its own took as much CPU
// as a nice-0 one. So, with nice levels, a worker's autogroup gets its
// level too (and a process of its tree that made a session of its own,
// its own group's), wherever autogroups may be in force.
type autogroups struct {
	on atomic.Bool
	// self is the server's own autogroup (its session's: its shell's,
	// say), never written: a process in it is no session of a worker's.
	self string
	log  *slog.Logger
}

// Where the kernel says whether autogroups are on (a variable for tests).
var procAutogroupEnabled = "/proc/sys/kernel/sched_autogroup_enabled"

// mayWriteWorkers reports whether the server may write its workers'
// autogroup files: a worker makes itself non-dumpable as it starts, and
// the kernel then gives its /proc files to root, so only a server that
// may write files it does not own can (a variable for tests).
var mayWriteWorkers = func() bool { return nicelevel.HasCap(unix.CAP_DAC_OVERRIDE) }

// newAutogroups finds whether autogroups may weigh the server's workers:
// turned on, the server in the root CPU task group (rootTaskGroup), and
// the server allowed to write its workers' files (mayWriteWorkers;
// logged where not).
func newAutogroups(log *slog.Logger) *autogroups {
	a := &autogroups{log: log}
	b, err := os.ReadFile(procAutogroupEnabled)
	if err != nil || strings.TrimSpace(string(b)) != "1" || !rootTaskGroup() {
		return a
	}
	if !mayWriteWorkers() {
		log.Warn("worker CPU weights by nice level weigh each worker only against its own threads here: the kernel schedules sessions as groups (sched_autogroup_enabled, the server in the root CPU cgroup) and each worker leads a session of its own, but a server that is not root (no CAP_DAC_OVERRIDE) cannot give a worker's group its level (a worker's /proc files are root's); run the server in a CPU cgroup of its own (any but the root, as a pod or a systemd unit with the cpu controller is), or as root")
		return a
	}
	a.self, _, _ = readAutogroup(os.Getpid())
	a.on.Store(true)
	log.Info("worker CPU weights by nice level on each worker's autogroup too: the kernel schedules sessions as groups here (sched_autogroup_enabled, the server in the root CPU cgroup), and each worker leads a session of its own")
	return a
}

// rootTaskGroup reports whether the server's threads are in the kernel's
// root CPU task group, where autogroups apply: its v1 cpu group is the
// root, or, under v2, no group on its path below the root has the cpu
// controller (a cpu.weight file: a group whose parent passed the
// controller down), as /proc/self/cgroup and the hierarchy say (in a
// container with a cgroup namespace of its own, "/" is its group: that
// one's cpu.weight says so; under v1 it is read as the root, and the
// writes are harmless).
func rootTaskGroup() bool {
	b, err := os.ReadFile(procSelfCgroup)
	if err != nil {
		return true
	}
	if path, ok := procGroup(string(b), func(v2 bool, ctls []string) bool { return !v2 && slices.Contains(ctls, "cpu") }); ok {
		return path == "/"
	}
	// "/" too: the real root has no cpu.weight, a cgroup namespace's
	// root (a container's group) may.
	for dir := OwnGroup(""); ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(cgroupRoot, dir, "cpu.weight")); err == nil {
			return false
		}
		if dir == "/" || dir == "." || dir == "" {
			return true
		}
	}
}

// active reports whether the workers' autogroups are given their levels
// (nil: never; with cgroups, or where autogroups are not in force).
func (a *autogroups) active() bool { return a != nil && a.on.Load() }

// readAutogroup is process pid's autogroup and its nice level; ok is
// false when the process is gone or in no autogroup (the file is empty
// for the kernel's default group).
func readAutogroup(pid int) (id string, nice int, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/autogroup", pid))
	if err != nil {
		return "", 0, false
	}
	// "/autogroup-42 nice 10"
	f := strings.Fields(string(b))
	if len(f) != 3 || f[1] != "nice" {
		return "", 0, false
	}
	n, err := strconv.Atoi(f[2])
	return f[0], n, err == nil
}

// set gives process pid's autogroup nice level n, unless autogroups are
// not in force, the group is the server's own or already at n; it
// reports whether it wrote. A process gone is no failure, nor EAGAIN (a
// server without CAP_SYS_ADMIN may write one a tenth of a second: the
// group gets its level at its next change, or the boost's next window).
// Another refusal (EACCES: a worker the server may not write for) leaves
// the workers' autogroups as they are from then on, logged once: their
// threads' levels still weigh their threads against each other.
func (a *autogroups) set(pid, n int) bool {
	if !a.active() {
		return false
	}
	id, cur, ok := readAutogroup(pid)
	if !ok || id == a.self || cur == n {
		return false
	}
	f, err := os.OpenFile(fmt.Sprintf("/proc/%d/autogroup", pid), os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString(strconv.Itoa(n))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	switch {
	case err == nil:
		return true
	case errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) || errors.Is(err, syscall.EAGAIN):
		return false
	}
	if a.on.Swap(false) {
		a.log.Warn("worker CPU weights by nice level: a worker's autogroup cannot be given its level, so from now on each worker's level weighs it only against its own threads, not against other workers or the server (the kernel schedules sessions as groups here)",
			"pid", pid, "nice", n, "error", err)
	}
	return false
}
