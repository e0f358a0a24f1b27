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

	"github.com/plover-run/plover/worker/contain"
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

// A process a killed server's worker started that its argv no longer
// names (one that rewrote it, or ran another program: EndLeftovers finds
// leftovers only by the tag there) still sits in the worker's groups,
// plover-<dead server>/<worker>. The next server's sweep kills it, in
// each hierarchy, and removes the groups; before, it removed only empty
// groups, and the process lived on, its groups with it. Against the
// node's v1 cpu and pids hierarchies. A server dead and not yet reaped (a
// zombie: its supervisor reaps late) is dead too: its /proc entry made
// the sweep take it for a live server and leave its groups and what they
// held until the restart after.
func TestSweepEndsWhatADeadServerLeftInItsGroups(t *testing.T) {
	cpuHome, pidsHome := nodeHomes(t)
	for _, tc := range []struct {
		what string
		dead func(*testing.T) string
	}{
		{"gone", func(*testing.T) string { return deadServer() }},
		{"a zombie", func(t *testing.T) string { return fmt.Sprintf("plover-%d", zombieProcess(t)) }},
	} {
		t.Run(tc.what, func(t *testing.T) {
			dead := tc.dead(t)
			inCPU := leftIn(t, filepath.Join(cpuHome, dead, "7"))
			inPids := leftIn(t, filepath.Join(pidsHome, dead, "7-1"))
			cpu := nodeCPUGroupsV1(t)
			pids := NewPidGroups(cgroupRoot, 64, 0, cpu, nil)
			t.Cleanup(pids.Close)
			if m := pids.Mechanism(); m != "cgroup v1" {
				t.Skipf("pids bounded by %s here: want a writable cgroup v1 pids hierarchy", m)
			}
			for _, l := range []*leftover{inCPU, inPids} {
				select {
				case <-l.done:
				case <-time.After(10 * time.Second):
					t.Fatalf("a killed server's leftover %d in %s lives on after the next server's sweep", l.cmd.Process.Pid, l.dir)
				}
				if _, err := os.Stat(filepath.Dir(l.dir)); !os.IsNotExist(err) {
					t.Errorf("the killed server's group %s is still there: %v", filepath.Dir(l.dir), err)
				}
			}
		})
	}
}

// zombieProcess is the pid of a child that exited and is not reaped until
// the test ends.
func zombieProcess(t *testing.T) int {
	t.Helper()
	c := exec.Command("/bin/true")
	if err := c.Start(); err != nil {
		t.Skip(err)
	}
	t.Cleanup(func() { c.Wait() })
	for end := time.Now().Add(10 * time.Second); !contain.Exited(c.Process.Pid); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("child %d did not exit in 10 s", c.Process.Pid)
		}
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", c.Process.Pid)); err != nil {
		t.Fatalf("the zombie %d has no /proc entry: %v", c.Process.Pid, err)
	}
	return c.Process.Pid
}

// A server's groups whose plover-<pid> names no process this one sees,
// but whose server group holds one, are a live server's under a PID
// namespace of its own (a container sharing the hierarchy): sweep kills
// nothing in them and leaves them, in the pids hierarchy too, where the
// server group looked at is cpu's.
func TestSweepLeavesTheGroupsOfAServerInAnotherNamespace(t *testing.T) {
	cpuHome, pidsHome := nodeHomes(t)
	name := deadServer()
	server := leftIn(t, filepath.Join(cpuHome, name, "server"))
	workers := []*leftover{leftIn(t, filepath.Join(cpuHome, name, "7")), leftIn(t, filepath.Join(pidsHome, name, "7"))}
	cpu := nodeCPUGroupsV1(t)
	pids := NewPidGroups(cgroupRoot, 64, 0, cpu, nil)
	t.Cleanup(pids.Close)
	if m := pids.Mechanism(); m != "cgroup v1" {
		t.Skipf("pids bounded by %s here: want a writable cgroup v1 pids hierarchy", m)
	}
	// The sweeps ran in the constructors, to their end: anything they
	// killed is out of its group by now (emptyGroup returns once it is).
	for _, l := range append(workers, server) {
		if members, _ := groupMembers(l.dir); !slices.Contains(members, l.cmd.Process.Pid) {
			t.Errorf("process %d of another namespace's server was swept out of %s (members %v)", l.cmd.Process.Pid, l.dir, members)
		}
	}
}

// nodeHomes is the node's v1 cpu and pids groups this process is in,
// where a server started here makes its groups (skipped where there are
// none to write).
func nodeHomes(t *testing.T) (cpu, pids string) {
	t.Helper()
	cpu = filepath.Join(cgroupRoot, "cpu", OwnGroup("cpu"))
	pids = filepath.Join(cgroupRoot, "pids", OwnGroup("pids"))
	for _, d := range []string{cpu, pids} {
		if _, err := os.Stat(filepath.Join(d, "cgroup.procs")); err != nil {
			t.Skipf("no cgroup v1 hierarchy at %s: %v", d, err)
		}
	}
	return cpu, pids
}

// deadServer is a server's group name whose pid no process has: above
// any pid_max, and this test process's own.
func deadServer() string { return fmt.Sprintf("plover-%d", 1<<30+os.Getpid()) }

// leftover is a process the test put in a group as a killed server's.
type leftover struct {
	cmd  *exec.Cmd
	dir  string
	done chan struct{} // closed once it exited and was reaped
}

// leftIn starts a process in group dir (made, with its parent), killed
// and removed with the groups after the test (skipped where the group
// cannot be made).
func leftIn(t *testing.T, dir string) *leftover {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Skipf("cannot make a cgroup: %v", err)
	}
	l := &leftover{cmd: exec.Command("sleep", "60"), dir: dir, done: make(chan struct{})}
	if err := l.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { l.cmd.Wait(); close(l.done) }()
	t.Cleanup(func() {
		l.cmd.Process.Kill()
		<-l.done
		os.Remove(dir)
		os.Remove(filepath.Dir(dir))
	})
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(l.cmd.Process.Pid)), 0o644); err != nil {
		t.Fatalf("move %d into %s: %v", l.cmd.Process.Pid, dir, err)
	}
	return l
}
