package contain

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// OOMScoreAdj is the OOM killer's adjustment of every worker, of what it
// starts (a child inherits it, across exec too) and of its PID
// namespace's init: the most there is, so that where memory runs out the
// kernel ends one of a worker's processes before the server. Out of
// memory the kernel kills the process of the highest badness, its memory
// with this adjustment added, among all of the group that hit its limit
// (or the node's). The workers are in the server's memory cgroup (a pod's
// limit holds the server and its workers together, and a worker's own
// group, --worker-max-memory, has no limit by default), and at 0 a bundle
// that forked children each a little smaller than the server had the
// server taken, the largest, and every tenant with it. At 1000 a worker's
// process counts as the whole of the group's memory more than its own, so
// every one of them ranks above a server at 0, and the killer takes the
// largest of them.
//
// Raising it needs no privilege; the server's own score is left as it is
// (lowering it takes CAP_SYS_RESOURCE, and in a pod the kubelet sets it).
const OOMScoreAdj = 1000

// oomScoreAdjFile is this process's score adjustment.
const oomScoreAdjFile = "/proc/self/oom_score_adj"

// beOOMVictim sets this process's OOM score adjustment to OOMScoreAdj and
// reads it back. Written while the process holds CAP_SYS_RESOURCE (a root
// worker before Enter drops it), it is also the least the process may set
// again without that capability (the kernel's oom_score_adj_min), so
// nothing the worker runs can lower it. A worker that never held it (a
// server not root, or a container's root, whose default set leaves it
// out) keeps the floor it inherited, the server's, down to which a
// program it runs (dumpable again, its /proc files its own) could lower
// it, by a write that the Landlock rules refuse (/proc is read-only).
func beOOMVictim() error {
	want := strconv.Itoa(OOMScoreAdj)
	if err := os.WriteFile(oomScoreAdjFile, []byte(want), 0); err != nil {
		return fmt.Errorf("make the worker the OOM killer's first choice: %w", err)
	}
	got, err := readOOMScore(oomScoreAdjFile)
	if err != nil {
		return fmt.Errorf("make the worker the OOM killer's first choice: %w", err)
	}
	if got != OOMScoreAdj {
		return fmt.Errorf("make the worker the OOM killer's first choice: %s is %d after writing %s", oomScoreAdjFile, got, want)
	}
	return nil
}

// OOMScore is process pid's OOM score adjustment (/proc/PID/oom_score_adj).
func OOMScore(pid int) (int, error) {
	return readOOMScore(fmt.Sprintf("/proc/%d/oom_score_adj", pid))
}

// readOOMScore reads an oom_score_adj file. By path, not by pid: a worker
// in a PID namespace reads its own through /proc/self, whatever /proc it
// sees.
func readOOMScore(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return v, nil
}
