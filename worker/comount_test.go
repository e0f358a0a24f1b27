package worker

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

// Where cpu and pids are one v1 hierarchy (co-mounted, as cpu,cpuacct
// are, or a --cgroup-root leading both to one directory), a worker's CPU
// group and pids group would be one directory: the pids placement found
// it made by the CPU placement, the worker in it, took it for an earlier
// worker's and killed the new worker. It now holds the bound in the CPU
// group, as under v2. Against the node's v1 cpu hierarchy, named twice.
func TestSharedCPUAndPidsHierarchyKeepsTheNewWorker(t *testing.T) {
	if _, err := os.Stat("/sys/fs/cgroup/cpu/cpu.shares"); err != nil {
		t.Skip("no cgroup v1 cpu hierarchy")
	}
	saved := cgroupRoot
	t.Cleanup(func() { cgroupRoot = saved })
	root := t.TempDir()
	os.Symlink("/sys/fs/cgroup/cpu", filepath.Join(root, "cpu"))
	os.Symlink("/sys/fs/cgroup/cpu", filepath.Join(root, "pids"))
	cpu := NewCPUGroupsAt(root, nil)
	if cpu.Mechanism() != "cgroup v1" {
		t.Skipf("CPU groups: %s, want a writable cgroup v1 hierarchy", cpu.Mechanism())
	}
	t.Cleanup(cpu.Close)
	pids := NewPidGroups(root, 64, 0, cpu, nil)
	t.Cleanup(pids.Close)
	w := exec.Command("sleep", "60")
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	cg := cpu.Place(w.Process.Pid, 1)
	pg := pids.Place(w.Process.Pid, cg)
	members, _ := groupMembers(cg.dir)
	w.Process.Kill()
	w.Wait()
	pg.Remove()
	cg.Remove()
	if !slices.Contains(members, w.Process.Pid) {
		t.Errorf("the new worker %d is not in its group %s (%v): its pids placement killed it", w.Process.Pid, cg.dir, members)
	}
	// The node's cpu hierarchy has no pids.max to write (the bound then
	// falls back here); a co-mounted one has.
	if !pids.shared {
		t.Errorf("pids and cpu in one hierarchy not seen as such (pids: %s)", pids.Mechanism())
	}
}
