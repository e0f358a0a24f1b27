package worker

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// A worker's group is named by its pid: a group of that name still there
// (what an earlier worker of the pid left, which could not be removed) is
// never joined (the new worker's bound and weight would be theirs too),
// nor emptied as the worker starts (under its lock, a process there may
// not die): the new worker's group takes a fresh name. Against the node's
// real v1 hierarchies, where they can be written.
func TestANewWorkerDoesNotJoinWhatAnEarlierOneLeft(t *testing.T) {
	for _, tc := range []struct {
		name  string
		place func(pid int) (dir string, remove func())
	}{
		{"pids", func(pid int) (string, func()) {
			g := NewPidGroups(cgroupRoot, 64, 0, nil, nil)
			if m := g.Mechanism(); m != "cgroup v1" {
				t.Skipf("pids bounded by %s here: want a writable cgroup v1 pids hierarchy", m)
			}
			leaveBehind(t, filepath.Join(g.dir, strconv.Itoa(pid)))
			pg := g.Place(pid, nil)
			if pg == nil {
				t.Fatalf("no pids group (%s)", g.Mechanism())
			}
			return pg.dir, func() { pg.Remove(); g.Close() }
		}},
		{"cpu", func(pid int) (string, func()) {
			g := NewCPUGroups(nil)
			if m := g.Mechanism(); m != "cgroup v1" {
				t.Skipf("CPU weights by %s here: want a writable cgroup v1 cpu hierarchy", m)
			}
			leaveBehind(t, filepath.Join(g.dir, strconv.Itoa(pid)))
			cg := g.Place(pid, 1)
			if cg == nil {
				t.Fatalf("no CPU group (%s)", g.Mechanism())
			}
			return cg.dir, func() { cg.Remove(); g.Close() }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := exec.Command("sleep", "60")
			if err := w.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { w.Process.Kill(); w.Wait() }) // a place that skips or fails
			dir, remove := tc.place(w.Process.Pid)
			got := strings.Fields(readString(filepath.Join(dir, "cgroup.procs")))
			w.Process.Kill()
			w.Wait()
			remove()
			if len(got) != 1 || got[0] != strconv.Itoa(w.Process.Pid) {
				t.Errorf("the new worker's group holds %v, want only the worker, %d", got, w.Process.Pid)
			}
		})
	}
}

// leaveBehind makes the group at dir with a process in it, as a worker
// that left one would, killed and reaped when the test ends, and the group
// removed then, with the server's group it is in once that is empty.
func leaveBehind(t *testing.T, dir string) {
	t.Helper()
	left := exec.Command("sleep", "60")
	if err := left.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		left.Process.Kill()
		left.Wait()
		os.Remove(dir)
		os.Remove(filepath.Dir(dir))
	})
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(left.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A process is a group's member by the line of that group's hierarchy in
// /proc/PID/cgroup, its path exactly: a path of another hierarchy's that
// only ends the same, or a directory that is no cgroup at all, made it one
// (and emptyGroup would kill it). Against the node's v1 cpu hierarchy.
func TestGroupMembersAreOfTheOneHierarchy(t *testing.T) {
	name := fmt.Sprintf("plover-test-%d-members", os.Getpid())
	cpu := filepath.Join("/sys/fs/cgroup/cpu", name)
	if err := os.Mkdir(cpu, 0o755); err != nil {
		t.Skipf("no writable cgroup v1 cpu hierarchy: %v", err)
	}
	w := exec.Command("sleep", "60")
	if err := w.Start(); err != nil {
		os.Remove(cpu)
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Process.Kill(); w.Wait(); os.Remove(cpu) })
	pid := strconv.Itoa(w.Process.Pid)
	if err := os.WriteFile(filepath.Join(cpu, "cgroup.procs"), []byte(pid), 0o644); err != nil {
		t.Fatal(err)
	}
	// A plain directory whose path ends as the cpu group's, listing it.
	fake := filepath.Join(t.TempDir(), name)
	os.Mkdir(fake, 0o755)
	os.WriteFile(filepath.Join(fake, "cgroup.procs"), []byte(pid), 0o644)
	if got, err := groupMembers(cpu); err != nil || len(got) != 1 || got[0] != w.Process.Pid {
		t.Errorf("the cpu group's members %v, %v; want %s", got, err, pid)
	}
	if got, _ := groupMembers(fake); len(got) != 0 {
		t.Errorf("a directory that is no cgroup has members %v", got)
	}
}

// groupMembers lists the processes in the cgroup at dir that /proc places
// there too (none in a directory that is no cgroup, a test's fake
// hierarchy of plain files).
func groupMembers(dir string) ([]int, error) {
	ref, ok := groupRefOf(dir)
	if !ok {
		return nil, nil
	}
	return membersOf(dir, ref)
}
