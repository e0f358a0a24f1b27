package main_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/internal/racebuild"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/worker/contain"
)

// TestOOMKillerTakesAWorkerNotTheServer: the server and its workers share
// a memory limit (a pod's: here a cgroup v1 memory group of 600 MiB made
// for the test), and no worker has one of its own (--worker-max-memory 0,
// the default). A bundle forks 40 children that each touch 20 MiB, each
// smaller than the server, and then touches 800 MiB itself (fork_swarm).
// With every process at oom_score_adj 0 the kernel's OOM killer took the
// largest, the server, and every tenant with it; with a worker's at 1000
// it takes the swarm's processes, at last its worker, and the server and
// another function's worker go on. With PID namespaces and with subreapers:
// a namespace's init at 1000 alone would do (its end takes the whole
// namespace), subreapers have none.
func TestOOMKillerTakesAWorkerNotTheServer(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts servers")
	}
	if racebuild.Enabled {
		t.Skip("the race detector's memory would change which process is the largest")
	}
	if s, err := contain.OOMScore(os.Getpid()); err != nil || s == contain.OOMScoreAdj {
		t.Skipf("the test runs at oom_score_adj %d (%v): the server would be at the workers' score", s, err)
	}
	lib := testkit.BuildLib(t, testkit.HostileSource(), t.TempDir(), "hostile.so", "-Wall")
	for _, tc := range []struct{ trees, flag, log string }{
		{"pid namespaces", "--pid-namespaces=true", "a PID namespace per worker"},
		{"subreapers", "--pid-namespaces=false", "child subreapers"},
	} {
		t.Run(tc.trees, func(t *testing.T) { swarmBesideServer(t, lib, tc.flag, tc.log) })
	}
}

// swarmBesideServer runs the swarm beside a server in a memory group of
// its own, with flag, whose log says trees.
func swarmBesideServer(t *testing.T, lib, flag, trees string) {
	const limitMiB, children, childMiB = 600, 40, 20
	cg := testCgroup(t, "memory", "memory.limit_in_bytes", strconv.Itoa(limitMiB<<20))
	h := serveInCgroup(t, cg, lib, "--isolation", "process", "--standby-workers", "0", flag)
	if !strings.Contains(h.srv.log.String(), trees) {
		t.Skipf("the server's worker process trees are not %s here:\n%s", trees, h.srv.log)
	}
	h.mustDeployDir(t, testkit.BundleDir(t, testkit.Manifest(goodName), nil))
	h.expectEcho(t, "before the swarm")
	h.mustDeploy(t, hostileManifest("swarm", launch("fork_swarm", children, childMiB)), lib)

	name := "swarm" + randHex(4)
	before, _ := rssKiB(h.srv.pid)
	r := h.invokeNoFatal("swarm", []byte(name), 60_000)
	if r.err != nil {
		select {
		case <-h.srv.exited:
			t.Fatalf("the server died beside a bundle that took its memory limit (the swarm's request: %v): %v\n%s", r.err, h.srv.waitErr, tailString(h.srv.log.String(), 1200))
		case <-time.After(5 * time.Second):
			t.Fatalf("the swarm's request: %v", r.err)
		}
	}
	// Under v1 a group counts the OOM kills of its own processes alone,
	// not those in the groups inside it (the workers'): what it counts
	// is the charges its limit refused.
	hits := readTrim(filepath.Join(cg, "memory.failcnt"))
	t.Logf("swarm: %d %.300s; the server %d MiB resident before it (a child of the swarm: %d MiB and what it shares with its worker); the test's group refused %s charges at its limit",
		r.code, r.body, before>>10, childMiB, hits)
	h.srv.mustBeHealthy(t, "after the swarm")
	// Its worker is the last the killer took: its request fails saying
	// so, and its tree ends with it.
	expectError(t, r, 500, "worker_crashed", "SIGKILL")
	for end := time.Now().Add(10 * time.Second); len(procsNamed(name)) > 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the swarm's children %v outlived its worker by 10 s", procsNamed(name))
		}
	}
	if hits == "0" {
		t.Errorf("the swarm never met the test's group's limit: the test proves nothing")
	}
	h.expectEcho(t, "after the swarm")
}

// expectEcho: the well-behaved function answers a request exactly.
func (h *isoHarness) expectEcho(t *testing.T, when string) {
	t.Helper()
	in := []byte("echo " + when + " " + randHex(8))
	if r := h.invoke(t, goodName, in, 20_000); r.code != 200 || !bytes.Equal(r.body, padTo(in, 256)) {
		t.Fatalf("%s: %s answered %d %.300q, want its input back", when, goodName, r.code, r.body)
	}
}

// procsNamed lists the processes whose /proc/PID/comm is name.
func procsNamed(name string) []int {
	var found []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil && readTrim(filepath.Join("/proc", e.Name(), "comm")) == name {
			found = append(found, pid)
		}
	}
	return found
}
