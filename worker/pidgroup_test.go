package worker

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/internal/testkit"
)

// fakeCgroups points the cgroup root and the server's own groups at a
// fake hierarchy (plain files) for the test: self is /proc/self/cgroup's
// text.
func fakeCgroups(t *testing.T, self string) string {
	t.Helper()
	root := t.TempDir()
	oldRoot, oldSelf := cgroupRoot, procSelfCgroup
	procSelfCgroup = filepath.Join(t.TempDir(), "cgroup")
	os.WriteFile(procSelfCgroup, []byte(self), 0o644)
	t.Cleanup(func() { cgroupRoot, procSelfCgroup = oldRoot, oldSelf })
	return root
}

func readString(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

// logTo is a logger into a buffer, and a count of its lines holding text.
func logTo() (*slog.Logger, func(text string) int) {
	var buf bytes.Buffer
	return slog.New(slog.NewTextHandler(&buf, nil)), func(text string) int { return strings.Count(buf.String(), text) }
}

// Against a fake v1 pids hierarchy: the server's groups inside the group
// it runs in, a dead server's swept; a group per worker with the bound and
// the worker's pid, removed when the worker is gone; Close removes the rest.
func TestPidGroupsV1(t *testing.T) {
	root := fakeCgroups(t, "8:pids:/srv\n1:cpu:/\n0::/\n")
	home := filepath.Join(root, "pids", "srv")
	os.MkdirAll(filepath.Join(home, "plover-999999999", "42"), 0o755) // a dead server's
	os.WriteFile(filepath.Join(home, "cgroup.procs"), nil, 0o644)
	g := NewPidGroups(root, 64, 65534, nil, nil)
	if m := g.Mechanism(); m != "cgroup v1" {
		t.Fatalf("mechanism %q on a writable v1 pids hierarchy", m)
	}
	if _, err := os.Stat(filepath.Join(home, "plover-999999999")); !os.IsNotExist(err) {
		t.Fatalf("a dead server's groups were not swept: %v", err)
	}
	if g.dir != filepath.Join(home, fmt.Sprintf("plover-%d", os.Getpid())) {
		t.Fatalf("the workers' groups in %s, want them in the server's own pids group %s", g.dir, home)
	}
	pg := g.Place(1234, nil)
	dir := filepath.Join(g.dir, "1234")
	if pg == nil || pg.dir != dir {
		t.Fatalf("the worker's group %+v, want %s", pg, dir)
	}
	if got := readString(filepath.Join(dir, "pids.max")); got != "64" {
		t.Fatalf("pids.max %q, want 64", got)
	}
	if got := readString(filepath.Join(dir, "cgroup.procs")); got != "1234" {
		t.Fatalf("cgroup.procs %q, want the worker's pid", got)
	}
	// A real group's files vanish with it; these are plain files here.
	os.Remove(filepath.Join(dir, "pids.max"))
	os.Remove(filepath.Join(dir, "cgroup.procs"))
	pg.Remove()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("the worker's group outlived it: %v", err)
	}
	g.Place(5678, nil)
	os.Remove(filepath.Join(g.dir, "5678", "pids.max"))
	os.Remove(filepath.Join(g.dir, "5678", "cgroup.procs"))
	g.Close()
	if _, err := os.Stat(g.dir); !os.IsNotExist(err) {
		t.Fatalf("the server's pids groups outlived Close: %v", err)
	}
}

// Under cgroup v2 the bound goes in the worker's CPU group, the pids
// controller passed down as cpu is; without CPU groups to hold it, the
// bound is RLIMIT_NPROC.
func TestPidGroupsV2(t *testing.T) {
	root := fakeCgroups(t, "0::/srv\n")
	os.MkdirAll(filepath.Join(root, "srv"), 0o755)
	os.WriteFile(filepath.Join(root, "cgroup.controllers"), []byte("cpuset cpu io memory pids"), 0o644)
	cpu := NewCPUGroupsAt(root, nil)
	if cpu.Mechanism() != "cgroup v2" {
		t.Fatalf("CPU groups %q on a writable fake v2 hierarchy", cpu.Mechanism())
	}
	g := NewPidGroups(root, 100, 65534, cpu, nil)
	if m := g.Mechanism(); m != "cgroup v2" {
		t.Fatalf("mechanism %q with v2 CPU groups", m)
	}
	for _, d := range []string{cpu.home, cpu.dir} {
		if got := readString(filepath.Join(d, "cgroup.subtree_control")); got != "+pids" {
			t.Fatalf("%s's subtree_control was last written %q, want +pids", d, got)
		}
	}
	cg := cpu.Place(1234, 0)
	if pg := g.Place(1234, cg); pg != nil {
		t.Fatalf("a v2 pids group of its own (%+v): the CPU group's removal is the group's", pg)
	}
	if got := readString(filepath.Join(cpu.dir, "1234", "pids.max")); got != "100" {
		t.Fatalf("the CPU group's pids.max %q, want 100", got)
	}
	// A worker the CPU groups found gone has no group, and that is no
	// failure; CPU groups turned off are, and the bound falls back.
	g.Place(999999999, nil)
	if m := g.Mechanism(); m != "cgroup v2" {
		t.Fatalf("mechanism %q after a worker gone before its group, want cgroup v2 still", m)
	}
	cpu.fail(nil, errors.New("a write refused"), "test")
	g.Place(999999999, cpu.Place(999999999, 1))
	if m := g.Mechanism(); m != "rlimit" {
		t.Fatalf("mechanism %q once the CPU groups are off, want rlimit", m)
	}
	if m := NewPidGroups(root, 100, 65534, nil, nil).Mechanism(); m != "rlimit" {
		t.Fatalf("mechanism %q under v2 without CPU groups, want rlimit", m)
	}
	if g := NewPidGroups(root, 0, 65534, cpu, nil); g != nil || g.Mechanism() != "off" {
		t.Fatalf("a bound of 0 gave %+v (%s), want none", g, g.Mechanism())
	}
}

// Under v2 (or a v1 hierarchy cpu and pids share) the bound goes in the
// worker's CPU group. A worker that got none because earlier workers of
// its pid left every name taken (errGroupsLeft) was taken for one gone:
// no group and no RLIMIT_NPROC, no bound at all. It now gets RLIMIT_NPROC,
// the groups staying on for the rest.
func TestPidGroupsWorkerWithoutCPUGroupGetsRlimit(t *testing.T) {
	root := fakeCgroups(t, "0::/srv\n")
	os.MkdirAll(filepath.Join(root, "srv"), 0o755)
	os.WriteFile(filepath.Join(root, "cgroup.controllers"), []byte("cpu pids"), 0o644)
	cpu := NewCPUGroupsAt(root, nil)
	g := NewPidGroups(root, 100, 65534, cpu, nil)
	if m := g.Mechanism(); m != "cgroup v2" {
		t.Fatalf("mechanism %q with v2 CPU groups", m)
	}
	w := exec.Command("sleep", "60")
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Process.Kill(); w.Wait() })
	pid := w.Process.Pid
	for i := 0; i < groupNames; i++ { // the names makeGroup tries
		d := filepath.Join(cpu.dir, strconv.Itoa(pid))
		if i > 0 {
			d += fmt.Sprintf("-%d", i)
		}
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var before unix.Rlimit
	unix.Prlimit(pid, unix.RLIMIT_NPROC, nil, &before)
	cg := cpu.Place(pid, 1)
	if cg != nil {
		t.Fatalf("a CPU group %s though every name was taken", cg.dir)
	}
	if pg := g.Place(pid, cg); pg != nil {
		t.Fatalf("a pids group of its own under v2: %+v", pg)
	}
	var after unix.Rlimit
	if err := unix.Prlimit(pid, unix.RLIMIT_NPROC, nil, &after); err != nil {
		t.Fatal(err)
	}
	if after.Cur == before.Cur || after.Cur != after.Max || after.Cur < 100 || after.Cur == unix.RLIM_INFINITY {
		t.Errorf("RLIMIT_NPROC %d/%d (before %d/%d): want the uid's tasks and the bound, hard and soft", after.Cur, after.Max, before.Cur, before.Max)
	}
	if m := g.Mechanism(); m != "cgroup v2" || !cpu.On() {
		t.Errorf("mechanism %q, CPU weights on %v after one worker without a group: want both on for the rest", m, cpu.On())
	}
}

// Where no pids group can be made, or one cannot once the server runs,
// the worker gets RLIMIT_NPROC, hard and soft, at the bound over the
// uid's tasks, and the change is logged once.
func TestPidGroupsFallBackToRlimit(t *testing.T) {
	sleeper := func() *exec.Cmd {
		c := exec.Command("sleep", "60")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
		return c
	}
	nproc := func(pid int) string {
		for _, line := range strings.Split(readString(fmt.Sprintf("/proc/%d/limits", pid)), "\n") {
			if strings.HasPrefix(line, "Max processes") {
				return strings.Join(strings.Fields(line)[2:4], " ")
			}
		}
		return "?"
	}
	const uid = 65534 // the workers' (not the test's, which may be root's: root has no RLIMIT_NPROC)

	t.Run("no hierarchy", func(t *testing.T) {
		root := fakeCgroups(t, "0::/\n")
		log, count := logTo()
		g := NewPidGroups(filepath.Join(root, "none"), 64, uid, nil, log)
		if m := g.Mechanism(); m != "rlimit" {
			t.Fatalf("mechanism %q without a pids hierarchy, want rlimit", m)
		}
		c := sleeper()
		if pg := g.Place(c.Process.Pid, nil); pg != nil {
			t.Fatalf("a group %+v without a hierarchy", pg)
		}
		if got := nproc(c.Process.Pid); !boundOver(got, 64) {
			t.Fatalf("the worker's RLIMIT_NPROC (soft hard) %q, want both 64 over the uid's tasks", got)
		}
		if n := count("RLIMIT_NPROC"); n != 1 {
			t.Fatalf("the fallback logged %d times, want once", n)
		}
	})
	t.Run("a group that fails", func(t *testing.T) {
		root := fakeCgroups(t, "8:pids:/\n")
		os.MkdirAll(filepath.Join(root, "pids"), 0o755)
		os.WriteFile(filepath.Join(root, "pids", "cgroup.procs"), nil, 0o644)
		log, count := logTo()
		g := NewPidGroups(root, 64, uid, nil, log)
		if m := g.Mechanism(); m != "cgroup v1" {
			t.Fatalf("mechanism %q, want cgroup v1", m)
		}
		// The server's group is made a file: no worker's group can be made in it.
		os.Remove(g.dir)
		os.WriteFile(g.dir, nil, 0o644)
		for range 2 {
			c := sleeper()
			if pg := g.Place(c.Process.Pid, nil); pg != nil {
				t.Fatalf("a group %+v where none can be made", pg)
			}
			if got := nproc(c.Process.Pid); !boundOver(got, 64) {
				t.Fatalf("the worker's RLIMIT_NPROC (soft hard) %q, want both 64 over the uid's tasks", got)
			}
		}
		if m := g.Mechanism(); m != "rlimit" {
			t.Fatalf("mechanism %q after a group failed, want rlimit", m)
		}
		if n := count("RLIMIT_NPROC"); n != 1 {
			t.Fatalf("the fallback logged %d times for two workers, want once", n)
		}
	})
}

// A worker is put in its pids group as it starts, before it takes a
// function, and its group goes once it is reaped.
func TestPidGroupsWorkerLifecycle(t *testing.T) {
	root := fakeCgroups(t, "8:pids:/\n")
	os.MkdirAll(filepath.Join(root, "pids"), 0o755)
	os.WriteFile(filepath.Join(root, "pids", "cgroup.procs"), nil, 0o644)
	g := NewPidGroups(root, 64, 65534, nil, nil)
	d := NewDevice(Options{Exe: os.Args[0], Base: device.NewHost(0), Landlock: true, StageDir: t.TempDir(), Spawner: spawner, Pids: g})
	p := load(t, d, testkit.Manifest("pids"))
	pid := p.(interface{ PID() int }).PID()
	dir := filepath.Join(g.dir, strconv.Itoa(pid))
	if max, procs := readString(filepath.Join(dir, "pids.max")), readString(filepath.Join(dir, "cgroup.procs")); max != "64" || procs != strconv.Itoa(pid) {
		t.Fatalf("worker %d's pids group: pids.max %q, cgroup.procs %q; want 64 and its pid", pid, max, procs)
	}
	// A real group's files vanish with it; these are plain files here.
	os.Remove(filepath.Join(dir, "pids.max"))
	os.Remove(filepath.Join(dir, "cgroup.procs"))
	p.Close()
	d.Close()
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(dir); os.IsNotExist(err) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("worker %d's pids group outlived it by 10 s", pid)
		}
	}
}

// boundOver reports whether limits ("soft hard", from /proc/PID/limits)
// are one value, at least max: the bound over the uid's tasks when the
// limit was set (other tests' workers of the uid may come and go).
func boundOver(limits string, max uint64) bool {
	f := strings.Fields(limits)
	if len(f) != 2 || f[0] != f[1] {
		return false
	}
	n, err := strconv.ParseUint(f[0], 10, 64)
	return err == nil && n >= max
}

// A tenant's worker holds the tasks of every function in it (each live
// instance keeps a thread of the worker): its bound is the per-worker
// bound once for each program it holds, as each would have in a worker of
// its own, so that a tenant's functions together are not cut to one
// function's tasks, and a tenant's worker does not die (taking every
// function in it) of instances that separate workers would hold. Against
// the node's real pids hierarchy, where it can be written.
func TestTenantWorkerPidsBoundCountsItsPrograms(t *testing.T) {
	const bound, programs, instances = 40, 4, 12
	g := NewPidGroups(cgroupRoot, bound, 0, nil, nil)
	if m := g.Mechanism(); m != "cgroup v1" {
		t.Skipf("pids bounded by %s here: want a writable cgroup v1 pids hierarchy", m)
	}
	t.Cleanup(g.Close)
	d := NewDevice(Options{Exe: os.Args[0], Base: device.NewHost(0), Landlock: true, StageDir: t.TempDir(), Spawner: spawner, TenantScope: true, Pids: g})
	t.Cleanup(func() { d.Close() })
	type held struct {
		p  device.Program
		in device.Instance
		m  *abi.Manifest
	}
	var all []held
	t.Cleanup(func() {
		for _, h := range all {
			h.in.Close()
		}
	})
	run := func(h held) error {
		e, err := h.p.Entry("echo")
		if err != nil {
			return err
		}
		out := make([]byte, h.m.OutBytes)
		return h.in.Run(&device.Run{Input: []byte("x"), Output: out, Chain: []device.Step{{Entry: e, Grid: 1, Block: 1}}})
	}
	for i := range programs {
		m := testkit.Manifest(fmt.Sprintf("f%d", i))
		p := loadFor(t, d, "t", "", m, nil)
		for j := range instances {
			in, err := p.NewInstance(device.InstanceConfig{MaxInput: m.MaxInputBytes, Tmp: m.TmpBytes, Out: m.OutBytes})
			if err != nil {
				t.Fatalf("%s: instance %d: %v", m.Name, j, err)
			}
			all = append(all, held{p, in, m})
		}
	}
	pid := pidOf(all[0].p)
	for _, h := range all {
		if err := run(h); err != nil || pidOf(h.p) != pid || !h.p.(*program).Alive() {
			t.Fatalf("%s: run: %v; its worker %d (alive %v), the tenant's first %d", h.m.Name, err, pidOf(h.p), h.p.(*program).Alive(), pid)
		}
	}
	if st, _ := all[0].p.(*program).p.measure(nil, false); st.threads <= bound {
		t.Errorf("the tenant's worker has %d threads for %d instances: the test needs more than one program's bound (%d)", st.threads, len(all), bound)
	}
}
