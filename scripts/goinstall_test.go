package scripts

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// goInstallLib runs script in bash with scripts/lib/go-install.sh sourced,
// a stand-in go first on PATH that runs goScript, and env.
func goInstallLib(t *testing.T, goScript, script string, env ...string) (string, error) {
	t.Helper()
	for _, tool := range []string{"bash", "timeout", "flock"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found", tool)
		}
	}
	lib, err := filepath.Abs("lib/go-install.sh")
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	writeUnder(t, bin, "go", []byte("#!/bin/sh\n"+goScript+"\n"), 0o755)
	cmd := exec.Command("bash", "-c", "set -euo pipefail; . '"+lib+"'; "+script)
	cmd.Env = append(os.Environ(), append([]string{"PATH=" + bin + ":" + os.Getenv("PATH")}, env...)...)
	b, err := cmd.CombinedOutput()
	return string(b), err
}

// go_install_retry bounds each go install and tries a stalled or failed one
// again, 3 tries in all (the module proxy once stalled for 16 minutes).
func TestGoInstallRetriesAStall(t *testing.T) {
	dir := t.TempDir()
	count := filepath.Join(dir, "calls")
	// Each call appends a line; the first stalls, the second installs.
	stall := `echo "$*" >>'` + count + `'; [ "$(wc -l <'` + count + `')" -ge 2 ] || exec sleep 60; touch "$GOBIN/tool"`
	start := time.Now()
	out, err := goInstallLib(t, stall, `go_install_retry install-tool "`+dir+`" -trimpath example.com/tool@v1`, "PLOVER_GO_INSTALL_TIMEOUT=1")
	if err != nil {
		t.Fatalf("go_install_retry failed: %v\n%s", err, out)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("took %v: the stalled try was not cut at its 1 s", took)
	}
	calls, _ := os.ReadFile(count)
	if got := strings.Count(string(calls), "install -trimpath example.com/tool@v1\n"); got != 2 {
		t.Errorf("go called %d times with the arguments (%q), want 2", got, calls)
	}
	if _, err := os.Stat(filepath.Join(dir, "tool")); err != nil {
		t.Errorf("nothing installed into GOBIN: %v", err)
	}
	if !strings.Contains(out, "install-tool: go install failed or stalled (try 1") {
		t.Errorf("no word of the retry:\n%s", out)
	}

	// Three failures: it gives up, with a failing status.
	out, err = goInstallLib(t, `echo x >>'`+count+`.fail'; exit 1`, `go_install_retry install-tool "`+dir+`" example.com/tool@v1`)
	calls, _ = os.ReadFile(count + ".fail")
	if err == nil || strings.Count(string(calls), "x\n") != 3 || !strings.Contains(out, "go install failed 3 times") {
		t.Errorf("after 3 failures: err %v, %d calls, output:\n%s", err, strings.Count(string(calls), "x\n"), out)
	}
}

// cache_lock waits for another install of the same tool, then removes the
// scratch directories a killed build left (SIGKILL skips the EXIT trap that
// removes them): under the lock none is another build's.
func TestCacheLockClearsAKilledBuildsScratch(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, ".build.KILLED")
	writeUnder(t, stale, "tool", []byte("half"), 0o755)
	// Another install holds the lock for a while.
	holder := exec.Command("flock", filepath.Join(dir, ".lock"), "sleep", "2")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer holder.Wait()
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	out, err := goInstallLib(t, "exit 1", `[ -d "`+stale+`" ] || { echo "removed before the lock"; exit 1; }; cache_lock install-tool "`+dir+`"; [ ! -e "`+stale+`" ] || { echo "still there"; exit 1; }`)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if took := time.Since(start); took < time.Second {
		t.Errorf("cache_lock took %v: it did not wait for the lock's holder", took)
	}
}
