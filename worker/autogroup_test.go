package worker

import (
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// Whether autogroups may weigh the workers: the kernel's switch, the
// server's CPU task group and its right to write its workers' files, as
// /proc and the hierarchy say them.
func TestAutogroupsInForce(t *testing.T) {
	oldOn, oldSelf, oldRoot, oldMay := procAutogroupEnabled, procSelfCgroup, cgroupRoot, mayWriteWorkers
	t.Cleanup(func() {
		procAutogroupEnabled, procSelfCgroup, cgroupRoot, mayWriteWorkers = oldOn, oldSelf, oldRoot, oldMay
	})
	dir := t.TempDir()
	procAutogroupEnabled, procSelfCgroup, cgroupRoot = filepath.Join(dir, "enabled"), filepath.Join(dir, "cgroup"), filepath.Join(dir, "v2")
	// Under v2, a.slice passes the cpu controller to its children (they
	// have cpu.weight); b.slice does not.
	os.MkdirAll(filepath.Join(cgroupRoot, "a.slice", "x.service"), 0o755)
	os.WriteFile(filepath.Join(cgroupRoot, "a.slice", "x.service", "cpu.weight"), []byte("100\n"), 0o644)
	os.MkdirAll(filepath.Join(cgroupRoot, "b.slice", "y.service"), 0o755)
	for _, tc := range []struct {
		name, enabled, cgroup string
		notRoot, nsRoot       bool
		on                    bool
	}{
		{"v1 root", "1\n", "4:memory:/x\n2:cpuacct:/\n1:cpu:/\n0::/\n", false, false, true},
		{"v1 cpu,cpuacct root", "1\n", "3:cpu,cpuacct:/\n0::/y\n", false, false, true},
		{"v2 root", "1\n", "0::/\n", false, false, true},
		{"switched off", "0\n", "0::/\n", false, false, false},
		{"v1 in a group", "1\n", "1:cpu:/system.slice/plover.service\n0::/\n", false, false, false},
		{"v2 in a group with the cpu controller", "1\n", "0::/a.slice/x.service\n", false, false, false},
		{"v2 in a group without it", "1\n", "0::/b.slice/y.service\n", false, false, true},
		{"v2 in a container's cgroup namespace", "1\n", "0::/\n", false, true, false},
		{"no switch (a kernel without autogroups)", "", "0::/\n", false, false, false},
		{"a server that may not write its workers' files", "1\n", "0::/\n", true, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			os.Remove(procAutogroupEnabled)
			if tc.enabled != "" {
				os.WriteFile(procAutogroupEnabled, []byte(tc.enabled), 0o644)
			}
			os.WriteFile(procSelfCgroup, []byte(tc.cgroup), 0o644)
			// A cgroup namespace's root is a container's group, with the
			// cpu controller; the real root has no cpu.weight.
			os.Remove(filepath.Join(cgroupRoot, "cpu.weight"))
			if tc.nsRoot {
				os.WriteFile(filepath.Join(cgroupRoot, "cpu.weight"), []byte("100\n"), 0o644)
			}
			mayWriteWorkers = func() bool { return !tc.notRoot }
			if a := newAutogroups(slog.New(slog.DiscardHandler)); a.on.Load() != tc.on {
				t.Fatalf("in force %v, want %v", a.on.Load(), tc.on)
			}
		})
	}
}

// A worker's autogroup gets its level; the server's own (a process of the
// server's session) never does, nor a process gone.
func TestAutogroupSetsAWorkersSessionOnly(t *testing.T) {
	if _, _, ok := readAutogroup(os.Getpid()); !ok {
		t.Skip("this kernel has no autogroups (/proc/self/autogroup)")
	}
	a := &autogroups{log: slog.New(slog.DiscardHandler)}
	a.self, _, _ = readAutogroup(os.Getpid())
	a.on.Store(true)
	_, selfNice, _ := readAutogroup(os.Getpid())
	for _, tc := range []struct {
		name   string
		setsid bool
		gone   bool
		wrote  bool
	}{
		{"a session of its own", true, false, true},
		{"the server's session", false, false, false},
		{"gone", true, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command("sleep", "30")
			cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: tc.setsid}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			pid := cmd.Process.Pid
			defer func() { cmd.Process.Kill(); cmd.Wait() }()
			if tc.gone {
				cmd.Process.Kill()
				cmd.Wait()
			}
			if got := a.set(pid, 13); got != tc.wrote {
				t.Fatalf("wrote %v, want %v", got, tc.wrote)
			}
			if _, n, _ := readAutogroup(os.Getpid()); n != selfNice {
				t.Fatalf("the server's own autogroup at nice %d, was %d", n, selfNice)
			}
			if !tc.wrote {
				return
			}
			if _, n, ok := readAutogroup(pid); !ok || n != 13 {
				t.Fatalf("the worker's autogroup at nice %d (%v), want 13", n, ok)
			}
			if a.set(pid, 13) {
				t.Fatal("wrote a level the group had")
			}
		})
	}
	if !a.on.Load() {
		t.Fatal("a write turned the autogroups off")
	}
}
