package worker

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/internal/testkit"
)

// A dead worker's groups go before its reap frees its pid: removed after
// it, a new worker of the reused pid met the old group, and the old
// worker's Remove then deleted it under the new one (whose writes then
// failed and turned the groups off for every worker). Against the node's
// v1 cpu and pids hierarchies, where they can be written.
func TestWorkerGroupsGoBeforeItsReap(t *testing.T) {
	cpu := nodeCPUGroupsV1(t)
	pids := NewPidGroups(cgroupRoot, 64, 0, cpu, nil)
	if m := pids.Mechanism(); m != "cgroup v1" {
		t.Skipf("pids bounded by %s here: want a writable cgroup v1 pids hierarchy", m)
	}
	t.Cleanup(pids.Close)
	d := NewDevice(Options{Exe: os.Args[0], Base: device.NewHost(0), Landlock: true, StageDir: t.TempDir(), Spawner: spawner, CPU: cpu, Pids: pids})
	t.Cleanup(func() { d.Close() })
	p := load(t, d, testkit.Manifest("groups"))
	pid := pidOf(p)
	dirs := []string{filepath.Join(cpu.dir, strconv.Itoa(pid)), filepath.Join(pids.dir, strconv.Itoa(pid))}
	for _, dir := range dirs {
		if _, err := os.Stat(dir); err != nil {
			t.Fatalf("worker %d's group: %v", pid, err)
		}
	}
	proc := fmt.Sprintf("/proc/%d", pid)
	// A load putting files in its stage holds the end of wait after the
	// reap (stagers), as long as the test looks.
	w := p.(*program).p
	// As inStage adds one: under mu, which wait takes to set exited before
	// it waits (the race detector sees no order in the kill and the reap).
	w.mu.Lock()
	w.stagers.Add(1)
	w.mu.Unlock()
	var once sync.Once
	done := func() { once.Do(w.stagers.Done) }
	defer done()
	syscall.Kill(pid, syscall.SIGKILL)
	for end := time.Now().Add(10 * time.Second); ; {
		if _, err := os.Stat(proc); err != nil {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("worker %d not reaped in 10 s", pid)
		}
	}
	for _, dir := range dirs {
		if _, err := os.Stat(dir); err == nil {
			t.Errorf("worker %d reaped with its group %s still there", pid, dir)
		}
	}
}

// nodeCPUGroupsV1 is CPU groups in the node's cgroup v1 hierarchy for the
// test (skipped where there is none to write), closed after it.
func nodeCPUGroupsV1(t *testing.T) *CPUGroups {
	t.Helper()
	saved := cgroupRoot
	t.Cleanup(func() { cgroupRoot = saved })
	cpu := NewCPUGroupsAt(saved, nil)
	if m := cpu.Mechanism(); m != "cgroup v1" {
		t.Skipf("CPU groups: %s here, want a writable cgroup v1 hierarchy", m)
	}
	t.Cleanup(cpu.Close)
	return cpu
}
