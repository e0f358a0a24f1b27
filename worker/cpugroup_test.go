package worker

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/nicelevel"
)

func TestCPUWeight(t *testing.T) {
	for _, tt := range []struct {
		share    float64
		priority string
		v1, v2   string
	}{
		{0, "", "1024", "100"},
		{1, "default", "1024", "100"},
		{3, "", "3072", "300"},
		{1, "latency", "8192", "800"},
		{1, "batch", "128", "13"},
		{1000, "latency", "131072", "5000"}, // half the server's, the largest
		{0.001, "batch", "2", "1"},
	} {
		m := &abi.Manifest{Share: tt.share, Priority: tt.priority}
		if got := (&CPUGroups{}).value(Weight(m)); got != tt.v1 {
			t.Errorf("share %v %q: v1 %s, want %s", tt.share, tt.priority, got, tt.v1)
		}
		if got := (&CPUGroups{v2: true}).value(Weight(m)); got != tt.v2 {
			t.Errorf("share %v %q: v2 %s, want %s", tt.share, tt.priority, got, tt.v2)
		}
	}
}

// Against a fake v1 hierarchy (plain files): a group per worker with its
// weight and pid, removed when the worker is gone; a dead server's groups
// swept; a hierarchy that refuses writes is reported once and left alone.
func TestCPUGroupsV1(t *testing.T) {
	root := t.TempDir()
	old := cgroupRoot
	cgroupRoot = root
	defer func() { cgroupRoot = old }()
	cpu := filepath.Join(root, "cpu")
	os.MkdirAll(filepath.Join(cpu, "plover-999999999", "42"), 0o755) // a dead server's
	os.WriteFile(filepath.Join(cpu, "cpu.shares"), []byte("1024"), 0o644)
	g := NewCPUGroups(nil)
	if g == nil {
		t.Fatal("no groups on a writable v1 hierarchy")
	}
	if _, err := os.Stat(filepath.Join(cpu, "plover-999999999")); !os.IsNotExist(err) {
		t.Fatalf("a dead server's groups were not swept: %v", err)
	}
	cg := g.Place(1234, 0) // a standby: the smallest weight
	dir := filepath.Join(g.dir, "1234")
	if b, _ := os.ReadFile(filepath.Join(dir, "cpu.shares")); string(b) != "2" {
		t.Fatalf("a standby's cpu.shares %q, want the smallest, 2", b)
	}
	cg.Weigh(&abi.Manifest{Name: "f", Share: 2, Priority: "latency"})
	if b, _ := os.ReadFile(filepath.Join(dir, "cpu.shares")); string(b) != strconv.Itoa(2*8*1024) {
		t.Fatalf("cpu.shares %q once it took its function", b)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs")); string(b) != "1234" {
		t.Fatalf("cgroup.procs %q", b)
	}
	// A real group's files vanish with it; these are plain files here.
	os.Remove(filepath.Join(dir, "cpu.shares"))
	os.Remove(filepath.Join(dir, "cgroup.procs"))
	cg.Remove()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("the worker's group outlived it: %v", err)
	}
	srv := filepath.Join(g.dir, "server")
	if b, _ := os.ReadFile(filepath.Join(srv, "cgroup.procs")); string(b) != strconv.Itoa(os.Getpid()) {
		t.Fatalf("the server is not in its group: cgroup.procs %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(srv, "cpu.shares")); string(b) != "262144" {
		t.Fatalf("the server's cpu.shares %q", b)
	}
	os.Remove(filepath.Join(srv, "cpu.shares"))
	os.Remove(filepath.Join(srv, "cgroup.procs"))
	g.Close()
	if _, err := os.Stat(g.dir); !os.IsNotExist(err) {
		t.Fatalf("the server's group outlived Close: %v", err)
	}
}

// Where cgroups cannot be written, every thread of a worker gets the nice
// level of its function's weight: a standby the lowest, a default function
// 10, share 3 about 4.9 levels (x1.25 each) above, a latency function 9
// levels above; the mechanism says "nice".
func TestCPUWeightsByNiceLevel(t *testing.T) {
	old := cgroupRoot
	cgroupRoot = filepath.Join(t.TempDir(), "none") // no hierarchy at all
	defer func() { cgroupRoot = old }()
	g := NewCPUGroups(nil)
	if g.Mechanism() != "nice" {
		t.Fatalf("mechanism %q without cgroups, want nice", g.Mechanism())
	}
	autogroups := g.ag.on.Load() // in force here (autogroup.go)
	for _, tc := range []struct {
		share    float64
		priority string
		nice     int
	}{{1, "", 10}, {3, "", 5}, {1, "latency", 1}, {1, "batch", 19}} {
		d := NewDevice(Options{Exe: os.Args[0], Base: device.NewHost(0), Landlock: true, StageDir: t.TempDir(), Spawner: spawner, CPU: g})
		m := testkit.Manifest("nice")
		m.Share, m.Priority = tc.share, tc.priority
		p := load(t, d, m)
		pid := p.(interface{ PID() int }).PID()
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil || len(tasks) < 2 {
			t.Fatalf("worker %d's threads: %v (%d)", pid, err, len(tasks))
		}
		for _, task := range tasks {
			f, err := statFields(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
			if err != nil {
				t.Fatal(err)
			}
			if n, _ := strconv.Atoi(f[16]); n != tc.nice {
				t.Fatalf("share %v %q: thread %s of worker %d at nice %d, want %d", tc.share, tc.priority, task.Name(), pid, n, tc.nice)
			}
		}
		// Where the kernel schedules sessions as groups, the level weighs
		// the worker (a session of its own) only if its group has it too.
		if autogroups {
			if _, n, ok := readAutogroup(pid); !ok || n != tc.nice || !g.ag.on.Load() {
				t.Fatalf("share %v %q: worker %d's autogroup at nice %d (%v), want %d; still in force: %v", tc.share, tc.priority, pid, n, ok, tc.nice, g.ag.on.Load())
			}
		}
		p.Close()
		d.Close()
	}
}

// noSysNiceEnv marks this test binary as run without CAP_SYS_NICE
// (withoutSysNice).
const noSysNiceEnv = "PLOVER_TEST_NO_SYS_NICE"

// A root server without CAP_SYS_NICE (a container's default capabilities)
// may set no nice level on a process of another uid, its workers under
// --worker-user: the weights are off from the start, logged with why,
// where before the start log said "by nice level, raised only", /healthz
// said nice, and the first function's weight failed with EPERM and turned
// them off. Workers of its own uid it may still raise. Run without the
// capability (setpriv); skipped where it cannot be dropped.
func TestNiceWeightsOffWhereWorkersCannotBeReniced(t *testing.T) {
	if os.Getenv(noSysNiceEnv) == "" {
		withoutSysNice(t)
		return
	}
	if nicelevel.HasCap(unix.CAP_SYS_NICE) {
		t.Fatal("run to be without CAP_SYS_NICE, it holds it")
	}
	old := cgroupRoot
	t.Cleanup(func() { cgroupRoot = old })
	for _, tc := range []struct {
		name      string
		uid       int
		mechanism string
		said      string // the start log's
		nice      int    // the worker's, weighed at a default function's
	}{
		{"workers of another uid", 65534, "off", "worker CPU weights off: they would be nice levels", 0},
		{"workers of its own uid", os.Geteuid(), "nice", "worker CPU weights by nice level, raised only", 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := exec.Command("sleep", "60")
			w.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(tc.uid), Gid: uint32(tc.uid)}}
			startInGroup(t, w)
			pid := w.Process.Pid
			// What the mechanism rests on: the kernel's refusal, or not.
			err := syscall.Setpriority(syscall.PRIO_PROCESS, pid, 1)
			if refused := err == syscall.EPERM; refused != (tc.mechanism == "off") {
				t.Fatalf("setpriority on a process of uid %d: %v", tc.uid, err)
			}
			log, said := logTo()
			g := NewCPUGroupsFor(filepath.Join(t.TempDir(), "none"), tc.uid, log)
			t.Cleanup(g.Close)
			if m := g.Mechanism(); m != tc.mechanism {
				t.Fatalf("mechanism %q at start, want %s", m, tc.mechanism)
			}
			if said(tc.said) != 1 || tc.mechanism == "off" && (said("as uid 65534 and the server as uid 0 without CAP_SYS_NICE") != 1 || said("raised only") != 0) {
				t.Fatalf("the start log does not say once %q (and, off, why: no CAP_SYS_NICE)", tc.said)
			}
			// /healthz's reason: the start log's, while off; none while on.
			if why := g.OffReason(); (tc.mechanism == "off") != strings.Contains(why, "without CAP_SYS_NICE") {
				t.Fatalf("off reason %q with mechanism %s", why, tc.mechanism)
			}
			g.Place(pid, 0).Weigh(&abi.Manifest{Name: "f"})
			if m := g.Mechanism(); m != tc.mechanism {
				t.Fatalf("mechanism %q once a worker was weighed, want %s", m, tc.mechanism)
			}
			if n := niceOf(t, pid); n != tc.nice {
				t.Fatalf("the worker at nice %d, want %d", n, tc.nice)
			}
		})
	}
}

// withoutSysNice runs the calling test in this test binary again, as root
// without CAP_SYS_NICE (setpriv drops it from the bounding and inheritable
// sets, so that the binary it runs has none), and reports what that says;
// it skips where setpriv is missing or cannot drop the capability.
func withoutSysNice(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: a server of another uid runs its workers as itself")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("no setpriv to drop CAP_SYS_NICE with")
	}
	out, err := rerun(t, noSysNiceEnv+"=1", setpriv, "--inh-caps=-sys_nice", "--bounding-set=-sys_nice", "--")
	switch {
	case err != nil && !strings.Contains(string(out), "=== RUN"):
		t.Skipf("cannot drop CAP_SYS_NICE (setpriv: %v): %s", err, out)
	case err != nil || !strings.Contains(string(out), "--- PASS"):
		t.Errorf("without CAP_SYS_NICE: %v\n%s", err, out)
	}
}

// rerun runs the calling test alone in this test binary again, in a
// process of its own with env added to its environment, through wrapper
// where one is given (a command and its arguments, the binary's path and
// flags after them), and returns what it printed.
func rerun(t *testing.T, env string, wrapper ...string) ([]byte, error) {
	t.Helper()
	args := append(wrapper, os.Args[0], "-test.run=^"+t.Name()+"$", "-test.v", "-test.count=1")
	cmd := exec.CommandContext(t.Context(), args[0], args[1:]...)
	cmd.Env = append(os.Environ(), env)
	return cmd.CombinedOutput()
}
