package main_test

// Hunt rG (a hostile bundle author against a node): tests that fail on the
// code as found, each showing one defect. They are evidence, not fixes.

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/plover-run/plover/internal/testkit"
)

// forkFillSource is a bundle whose entry fork_fill forks children that
// pause for ever (in its worker's process group: plover rm ends them) until
// fork fails or grid children run, and writes "forked N errno E".
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

// pidsCgroup makes a cgroup v1 pids group of max tasks for the test (nil
// where the machine has none or it cannot be written) and returns its
// directory; Cleanup kills what is left in it (processes this test
// started) and removes it.
func pidsCgroup(t *testing.T, max int) string {
	t.Helper()
	root := "/sys/fs/cgroup/pids"
	if _, err := os.Stat(filepath.Join(root, "cgroup.procs")); err != nil {
		t.Skipf("no cgroup v1 pids hierarchy at %s: %v", root, err)
	}
	dir := filepath.Join(root, "plover-hunt-rG-"+randHex(4))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("cannot make a pids cgroup: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "pids.max"), []byte(strconv.Itoa(max)), 0o644); err != nil {
		os.Remove(dir)
		t.Skipf("cannot set pids.max: %v", err)
	}
	t.Cleanup(func() {
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			if os.Remove(dir) == nil {
				return
			}
		}
		t.Errorf("cannot remove the test's cgroup %s", dir)
	})
	return dir
}

// TestHuntRGForkingBundleStarvesOtherTenants: nothing bounds the processes
// and threads a function's worker makes (no pids cgroup per worker, no
// RLIMIT_NPROC: every worker of every tenant runs as the one
// --worker-user, so a per-user limit would be shared by all of them
// anyway). One function's bundle that forks until fork fails takes every
// task the node's server has, and another tenant's function can no longer
// start a worker (nor can the server start a thread). The server runs in a
// pids cgroup of 256 tasks here, standing in for the machine's pid_max,
// threads-max or a container's pids limit, so the test hurts no one else.
func TestHuntRGForkingBundleStarvesOtherTenants(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts servers")
	}
	cg := pidsCgroup(t, 256)
	bin := buildPlover(t)
	lib := testkit.BuildLib(t, writeTemp(t, "forkfill.cu", forkFillSource), t.TempDir(), "hostile.so", "-Wall")
	args := []string{"--isolation", "process", "--standby-workers", "0"}
	data := t.TempDir()
	// The wrapper joins the cgroup, then execs the server: the server is
	// the process the harness watches.
	cmd := exec.Command("/bin/sh", "-c", `echo $$ > "$0/cgroup.procs" && exec "$@"`, cg, bin, "serve", "--listen", "127.0.0.1:0", "--data", data, "--device", "host")
	cmd.Args = append(cmd.Args, args...)
	h := &isoHarness{mode: "process", bin: bin, hostile: lib, args: args, client: &http.Client{Timeout: 20 * time.Second}}
	t.Cleanup(func() { // after the server's stop (registered later, run earlier)
		if h.srv != nil {
			removeCPUGroup(h.srv.pid)
		}
	})
	h.srv = startIsoCmd(t, cmd, data)

	victim := testkit.BundleDir(t, testkit.Manifest("victim"), nil)
	h.mustDeployDir(t, victim)
	h.mustDeploy(t, hostileManifest("forker", launch("fork_fill", 100000, 1)), lib)
	r := h.invoke(t, "forker", []byte("x"), 20000)
	t.Logf("forker: %d %q; the server's cgroup holds %s tasks of its 256", r.code, cstr(r.body), readTrim(filepath.Join(cg, "pids.current")))

	// Another tenant's function, deployed before and never invoked: its
	// first request needs a worker.
	v := h.invokeNoFatal("victim", []byte("hello"), 10000)
	if v.err != nil || v.code != 200 {
		t.Errorf("another function's cold start after one bundle took every task: %d %.300s (err %v); want 200: a function's processes must be bounded below what the node has", v.code, v.body, v.err)
	}
	// The server itself needs threads for concurrent work: a burst of
	// requests (bounded: 32, each with a deadline).
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := []string{"forker", "victim"}[i%2]
			h.invokeNoFatal(name, []byte("again"), 3000)
		}()
	}
	wg.Wait()
	select {
	case <-h.srv.exited:
		t.Errorf("the server died after one function's bundle forked until fork failed: %v\n%s", h.srv.waitErr, crashLines(h.srv.log.String()))
	case <-time.After(500 * time.Millisecond):
	}
}

// crashLines is the head of a Go crash report in a server's log.
func crashLines(log string) string {
	for _, mark := range []string{"runtime/cgo", "fatal error", "SIGABRT", "panic:"} {
		if i := strings.Index(log, mark); i >= 0 {
			return tail(log[:min(len(log), i+600)], 1200)
		}
	}
	return tail(log, 1200)
}

// removeCPUGroup removes the cgroup v1 CPU groups a server of pid left,
// as a crashed one does (the next server's start would sweep them), once
// its workers are gone (a few seconds at most).
func removeCPUGroup(pid int) {
	dir := fmt.Sprintf("/sys/fs/cgroup/cpu/plover-%d", pid)
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		kids, _ := os.ReadDir(dir)
		for _, k := range kids {
			if k.IsDir() {
				os.Remove(filepath.Join(dir, k.Name()))
			}
		}
		if err := os.Remove(dir); err == nil || os.IsNotExist(err) {
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

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
