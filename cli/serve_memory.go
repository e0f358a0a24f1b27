package cli

import (
	"log/slog"
	"os"
	"runtime/debug"

	"github.com/plover-run/plover/cgrouplimit"
)

// procSelfCgroup is where the server reads the groups it runs in; a test
// points it at a fake.
var procSelfCgroup = "/proc/self/cgroup"

// setMemoryLimit holds the server's Go memory under 90% of its cgroup's
// memory limit (a pod's resources.limits.memory), as GOMEMLIMIT would:
// with the runtime's default alone (a collection when the heap doubles
// the live heap), a burst's garbage kept the server's RSS at 2-4 GB for
// about 4 minutes, and a heap near the group's limit met the OOM killer
// where a collection would have freed enough. The limit is soft: the
// collector works harder near it, nothing fails at it. The other tenth is
// what the Go runtime does not count (cgo's and the devices' memory, the
// kernel's pages charged to the group). A GOMEMLIMIT set by the operator
// stands. The limit is never below what the server's budgets may hold at
// once (goMemoryLimit).
func setMemoryLimit(f *serveFlags, log *slog.Logger) {
	if os.Getenv("GOMEMLIMIT") != "" {
		// Said either way, as serverProcs says GOMAXPROCS's (the runtime
		// ignores a GOMEMLIMIT it cannot parse: no limit).
		log.Info("the server's Go memory limit: as GOMEMLIMIT says", "limit_mib", debug.SetMemoryLimit(-1)>>20)
		return
	}
	text, err := os.ReadFile(procSelfCgroup)
	if err != nil {
		return // no /proc (not Linux): no group to read
	}
	group := cgrouplimit.MemoryIn(string(text), f.cgroupRoot)
	// 0 (no bound) counts as nothing: the operator chose a server whose
	// memory only the group bounds, and the soft limit can only help it.
	need := min(f.maxBodyMemMB+f.maxPipeMemMB, topMiB) << 20
	limit, tooSmall := goMemoryLimit(group, need)
	switch {
	case tooSmall:
		log.Warn("no Go memory limit set: the server's budgets (--max-body-memory and --max-pipeline-memory) exceed its cgroup's memory limit, past which the OOM killer ends it",
			"budgets_mib", need>>20, "cgroup_mib", group>>20)
	case limit > 0:
		debug.SetMemoryLimit(limit)
		log.Info("the server's Go memory limit: 90% of its cgroup's memory limit, or its budgets where more (GOMEMLIMIT sets it)",
			"limit_mib", limit>>20, "cgroup_mib", group>>20, "budgets_mib", need>>20)
	}
}

// goMemoryLimit is the Go memory limit of a server in a cgroup limited to
// group bytes (0: no limit) whose budgets may hold need bytes at once: 0
// for none. Never below need: under the live heap the budgets allow, the
// collector would run back to back while requests hold it (the runtime
// caps it at half the CPUs). Budgets past the group's limit leave none
// (tooSmall): no soft limit can keep them within it.
func goMemoryLimit(group, need int64) (limit int64, tooSmall bool) {
	switch {
	case group <= 0:
		return 0, false
	case need > group:
		return 0, true
	}
	return max(group/10*9, need), false
}
