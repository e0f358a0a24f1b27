package worker

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A group an earlier worker of the same pid left holding a process that
// cannot be killed (here: frozen by the v1 freezer) made the new worker's
// placement spend 5 s of kills under the worker's lock, then fail, which
// turned CPU weights off for every worker. The new worker's group now
// takes a fresh name. Against the node's v1 cpu and freezer hierarchies.
func TestLeftoverGroupThatCannotBeEmptiedFailsNothing(t *testing.T) {
	freezer := "/sys/fs/cgroup/freezer"
	if _, err := os.Stat(filepath.Join(freezer, "cgroup.procs")); err != nil {
		t.Skip("no cgroup v1 freezer")
	}
	cpu := nodeCPUGroupsV1(t)
	w, stuck := exec.Command("sleep", "60"), exec.Command("sleep", "60")
	for _, c := range []*exec.Cmd{w, stuck} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { w.Process.Kill(); w.Wait() })
	fz := filepath.Join(freezer, fmt.Sprintf("plover-test-%d", os.Getpid()))
	left := filepath.Join(cpu.dir, strconv.Itoa(w.Process.Pid))
	t.Cleanup(func() {
		// Thawed, the stuck process dies; reaped, it is out of both groups.
		os.WriteFile(filepath.Join(fz, "freezer.state"), []byte("THAWED"), 0o644)
		stuck.Process.Kill()
		stuck.Wait()
		os.Remove(left)
		os.Remove(fz)
	})
	if err := os.Mkdir(fz, 0o755); err != nil {
		t.Fatal(err)
	}
	stuckPid := strconv.Itoa(stuck.Process.Pid)
	os.WriteFile(filepath.Join(fz, "cgroup.procs"), []byte(stuckPid), 0o644)
	os.WriteFile(filepath.Join(fz, "freezer.state"), []byte("FROZEN"), 0o644)
	for end := time.Now().Add(10 * time.Second); strings.TrimSpace(readString(filepath.Join(fz, "freezer.state"))) != "FROZEN"; {
		if time.Now().After(end) {
			t.Fatal("the freezer did not freeze in 10 s")
		}
	}
	if err := os.Mkdir(left, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(left, "cgroup.procs"), []byte(stuckPid), 0o644); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	cg := cpu.Place(w.Process.Pid, 1)
	took := time.Since(t0)
	if cg == nil || !cpu.On() {
		t.Fatalf("placing a worker beside a leftover group that cannot be emptied: group %v, weights on %v (took %v)", cg, cpu.On(), took)
	}
	t.Cleanup(cg.Remove)
	if members, _ := groupMembers(cg.dir); cg.dir == left || !slices.Contains(members, w.Process.Pid) {
		t.Errorf("the worker's group %s (members %v), the leftover %s", cg.dir, members, left)
	}
}
