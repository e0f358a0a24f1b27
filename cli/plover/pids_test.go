package main_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/plover-run/plover/internal/testkit"
)

// forkFillSource is a bundle whose entry fork_fill forks children that
// pause for ever (in its worker's process group and PID namespace: plover
// rm and the server's stop end them) until fork fails or grid children
// run, and writes "forked N errno E".
const forkFillSource = `#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "plover.h"
PLOVER_BUNDLE("host");
PLOVER_ENTRY(fork_fill) {
  (void)block;
  int n = 0, e = 0;
  for (; n < grid; n++) {
    pid_t c = fork();
    if (c < 0) { e = errno; break; }
    if (c == 0) { for (;;) pause(); }
  }
  char msg[64];
  snprintf(msg, sizeof msg, "forked %d errno %d", n, e);
  memset(s->out.dat, 0, s->out.len);
  memcpy(s->out.dat, msg, strlen(msg));
}
`

// TestPidsForkingBundleStaysInItsWorker: a function's bundle that forks
// until fork fails is stopped at its worker's bound (--worker-max-pids: a
// pids cgroup per worker), so another tenant's function still starts a
// worker and the server still makes threads. The server runs in a pids
// cgroup of 256 tasks here, standing in for the machine's pid_max,
// threads-max or a container's pids limit, so the test hurts no one else;
// without the per-worker bound the forker took all 256, the other
// function's cold start failed (503 fork/exec: resource temporarily
// unavailable) and in most runs the server died (pthread_create failed).
func TestPidsForkingBundleStaysInItsWorker(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts servers")
	}
	const serverMax, workerMax = 256, 64
	cg := testCgroup(t, "pids", "pids.max", strconv.Itoa(serverMax))
	lib := testkit.BuildLib(t, writeTemp(t, "forkfill.cu", forkFillSource), t.TempDir(), "forkfill.so", "-Wall")
	h := serveInCgroup(t, cg, lib, "--isolation", "process", "--standby-workers", "0", "--worker-max-pids", strconv.Itoa(workerMax))
	h.srv.waitLog(t, "worker tasks bounded by a pids cgroup per worker")

	victim := testkit.BundleDir(t, testkit.Manifest("victim"), nil)
	h.mustDeployDir(t, victim)
	h.mustDeploy(t, hostileManifest("forker", launch("fork_fill", 100000, 1)), lib)
	r := h.invoke(t, "forker", []byte("x"), 20000)
	t.Logf("forker: %d %q; the server's cgroup holds %s tasks of its %d", r.code, cstr(r.body), readTrim(filepath.Join(cg, "pids.current")), serverMax)
	m := regexp.MustCompile(`^forked (\d+) errno (\d+)$`).FindStringSubmatch(cstr(r.body))
	if r.code != 200 || m == nil {
		t.Fatalf("forker: %d %.300q, want 200 and what it forked", r.code, r.body)
	}
	if n, _ := strconv.Atoi(m[1]); n >= workerMax || m[2] != strconv.Itoa(int(syscall.EAGAIN)) {
		t.Errorf("forker forked %s children, its fork failing with errno %s; want fewer than %d (its worker's bound, its own threads counted) and EAGAIN (%d)", m[1], m[2], workerMax, syscall.EAGAIN)
	}
	// Its worker is in a pids group of its own, inside the server's, at the
	// bound and having refused a fork.
	workers := h.functionView(t, "forker").Workers
	if len(workers) != 1 {
		t.Fatalf("forker's workers %+v, want one", workers)
	}
	group := pidsGroupOf(t, workers[0].PID)
	if want := filepath.Join(cg, fmt.Sprintf("plover-%d", h.srv.pid), strconv.Itoa(workers[0].PID)); group != want {
		t.Errorf("forker's worker is in pids group %s, want %s", group, want)
	}
	if max, cur, events := readTrim(filepath.Join(group, "pids.max")), readTrim(filepath.Join(group, "pids.current")), readTrim(filepath.Join(group, "pids.events")); max != strconv.Itoa(workerMax) || cur != max || events == "max 0" {
		t.Errorf("forker's worker's group: pids.max %s, pids.current %s, pids.events %q; want the bound, reached, a fork refused", max, cur, events)
	}

	// Another tenant's function, deployed before and never invoked: its
	// first request needs a worker.
	if v := h.invokeNoFatal("victim", []byte("hello"), 10000); v.err != nil || v.code != 200 {
		t.Errorf("another function's cold start beside a bundle at its bound: %d %.300s (err %v); want 200", v.code, v.body, v.err)
	}
	// The server itself needs threads for concurrent work: a burst of
	// requests (bounded: 32, each with a deadline). The forker's worker,
	// at its bound, may fail its own; the victim's must not.
	var wg sync.WaitGroup
	var mu sync.Mutex
	var fails []string
	for i := range 32 {
		wg.Go(func() {
			name := []string{"forker", "victim"}[i%2]
			if v := h.invokeNoFatal(name, []byte("again"), 3000); name == "victim" && (v.err != nil || v.code != 200) {
				mu.Lock()
				fails = append(fails, fmt.Sprintf("%d %.200s (err %v)", v.code, v.body, v.err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(fails) > 0 {
		t.Errorf("%d of the victim's 16 requests in the burst failed beside the forker: %v", len(fails), fails)
	}
	select {
	case <-h.srv.exited:
		t.Fatalf("the server died beside a bundle that forked until fork failed: %v\n%s", h.srv.waitErr, crashLines(h.srv.log.String()))
	case <-time.After(500 * time.Millisecond):
	}
	h.srv.mustBeHealthy(t, "after the burst")
}

// pidsGroupOf is the pids cgroup directory of process pid (cgroup v1).
func pidsGroupOf(t *testing.T, pid int) string {
	t.Helper()
	for _, line := range strings.Split(readTrim(fmt.Sprintf("/proc/%d/cgroup", pid)), "\n") {
		if parts := strings.SplitN(line, ":", 3); len(parts) == 3 && parts[1] == "pids" {
			return filepath.Join("/sys/fs/cgroup/pids", parts[2])
		}
	}
	t.Fatalf("process %d is in no pids cgroup", pid)
	return ""
}

// crashLines is the head of a Go crash report in a server's log.
func crashLines(log string) string {
	for _, mark := range []string{"runtime/cgo", "fatal error", "SIGABRT", "panic:"} {
		if i := strings.Index(log, mark); i >= 0 {
			return tailString(log[:min(len(log), i+600)], 1200)
		}
	}
	return tailString(log, 1200)
}

// removeCPUGroups removes the cgroup v1 CPU groups a server of pid left,
// as a crashed one does (the next server's start would sweep them), once
// its workers are gone (a few seconds at most).
func removeCPUGroups(pid int) {
	dir := fmt.Sprintf("/sys/fs/cgroup/cpu/plover-%d", pid)
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		groups := groupTree(dir)
		for i := len(groups) - 1; i >= 0; i-- {
			os.Remove(groups[i])
		}
		if _, err := os.Stat(dir); os.IsNotExist(err) {
			return
		}
	}
}

func writeTemp(t *testing.T, name, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("? (%v)", err)
	}
	return strings.TrimSpace(string(b))
}
