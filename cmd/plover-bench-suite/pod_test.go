package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestInPod(t *testing.T) {
	for mode, want := range map[string]bool{
		"fair-nice": true, "fair-nice-noio": true, "fair-nice-noboost": true,
		"fair-nice-root": false, "fair": false, "fair-noboost": false, "off": false, "none": false,
	} {
		if got := inPod(mode); got != want {
			t.Errorf("inPod(%q) = %v, want %v", mode, got, want)
		}
	}
}

// The wrapper puts its own pid (the server's, once it execs) in the
// group's procs file before the server's first instruction, and runs the
// command with its arguments whole.
func TestPodWrapStartsTheCommandInTheGroup(t *testing.T) {
	procs := filepath.Join(t.TempDir(), "cgroup.procs")
	os.WriteFile(procs, nil, 0o644)
	argv := pod{procs: procs}.wrap([]string{"/bin/sh", "-c", `echo "$$ $1"`, "sh", "two words"})
	cmd := exec.Command(argv[0], argv[1:]...)
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	pid := strconv.Itoa(cmd.Process.Pid)
	if got := strings.TrimSpace(string(out)); got != pid+" two words" {
		t.Fatalf("the command said %q, want %q", got, pid+" two words")
	}
	if b, _ := os.ReadFile(procs); strings.TrimSpace(string(b)) != pid {
		t.Fatalf("procs holds %q, want the server's pid %s", b, pid)
	}
	if got := (pod{}).wrap([]string{"a", "b"}); strings.Join(got, " ") != "a b" {
		t.Fatalf("no pod wrapped the command: %q", got)
	}
}

func TestMakePod(t *testing.T) {
	old := cgroupV1CPU
	t.Cleanup(func() { cgroupV1CPU = old })
	cgroupV1CPU = t.TempDir()
	if p := makePod(); p.procs != "" || !strings.Contains(p.why, "no cgroup v1 cpu hierarchy") {
		t.Fatalf("without a hierarchy: %+v", p)
	}
	os.WriteFile(filepath.Join(cgroupV1CPU, "cpu.shares"), []byte("1024\n"), 0o644)
	own, err := ownV1CPUGroup()
	if err != nil {
		t.Skipf("this machine has no v1 cpu group in /proc/self/cgroup: %v", err)
	}
	os.MkdirAll(filepath.Join(cgroupV1CPU, own), 0o755)
	p := makePod()
	if p.why != "" || filepath.Dir(filepath.Dir(p.procs)) != filepath.Join(cgroupV1CPU, own) {
		t.Fatalf("pod %+v, want one under this program's group %s", p, own)
	}
	if _, err := os.Stat(filepath.Dir(p.procs)); err != nil {
		t.Fatal(err)
	}
	p.remove()
	if _, err := os.Stat(filepath.Dir(p.procs)); !os.IsNotExist(err) {
		t.Fatalf("the group is still there: %v", err)
	}
}
