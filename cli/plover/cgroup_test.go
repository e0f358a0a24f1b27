package main_test

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/plover-run/plover/worker"
)

// testCgroup makes a cgroup v1 group of controller ctl for the test, with
// its file set to value (skipping the test where the machine has no such
// hierarchy or it cannot be written), and returns its directory. It is
// made inside the group the test runs in, so that whatever limit that
// group has holds the test's servers too. Cleanup kills what is left in it
// and in the groups the server made inside it (processes this test
// started) and removes them.
func testCgroup(t *testing.T, ctl, file, value string) string {
	t.Helper()
	home := filepath.Join("/sys/fs/cgroup", ctl, worker.OwnGroup(ctl))
	if _, err := os.Stat(filepath.Join(home, "cgroup.procs")); err != nil {
		t.Skipf("no cgroup v1 %s hierarchy at %s: %v", ctl, home, err)
	}
	dir := filepath.Join(home, "plover-test-"+randHex(4))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("cannot make a %s cgroup: %v", ctl, err)
	}
	if err := os.WriteFile(filepath.Join(dir, file), []byte(value), 0o644); err != nil {
		os.Remove(dir)
		t.Skipf("cannot set %s: %v", file, err)
	}
	t.Cleanup(func() {
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			groups := groupTree(dir)
			for _, g := range groups {
				b, _ := os.ReadFile(filepath.Join(g, "cgroup.procs"))
				for _, f := range strings.Fields(string(b)) {
					if pid, err := strconv.Atoi(f); err == nil {
						syscall.Kill(pid, syscall.SIGKILL)
					}
				}
			}
			for i := len(groups) - 1; i >= 0; i-- { // the innermost first
				os.Remove(groups[i])
			}
			if _, err := os.Stat(dir); os.IsNotExist(err) {
				return
			}
		}
		t.Errorf("cannot remove the test's cgroup %s", dir)
	})
	return dir
}

// groupTree is cgroup dir and the groups inside it, each before those
// inside it.
func groupTree(dir string) []string {
	out := []string{dir}
	kids, _ := os.ReadDir(dir)
	for _, k := range kids {
		if k.IsDir() {
			out = append(out, groupTree(filepath.Join(dir, k.Name()))...)
		}
	}
	return out
}

// serveInCgroup starts `plover serve --device host` with args in cgroup
// cg, from its first instruction on, and gives the harness over it, the
// hostile library lib.
func serveInCgroup(t *testing.T, cg, lib string, args ...string) *isoHarness {
	t.Helper()
	bin := buildPlover(t)
	data := t.TempDir()
	// The wrapper joins the cgroup, then execs the server: the server is
	// the process the harness watches.
	cmd := exec.Command("/bin/sh", "-c", `echo $$ > "$0/cgroup.procs" && exec "$@"`, cg, bin, "serve", "--listen", "127.0.0.1:0", "--data", data, "--device", "host")
	cmd.Args = append(cmd.Args, args...)
	h := &isoHarness{mode: "process", bin: bin, hostile: lib, args: args, client: &http.Client{Timeout: 20 * time.Second}}
	t.Cleanup(func() { // after the server's stop (registered later, run earlier)
		if h.srv != nil {
			removeCPUGroups(h.srv.pid)
		}
	})
	h.srv = startIsoCmd(t, cmd, data)
	return h
}
