package worker

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/worker/contain"
)

// lockedBuffer is an io.Writer that Options.Output's goroutines may share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// subreaperEnv, set, has a test run as a subreaper server: Contain makes
// the process one for good, so such a test re-runs itself in a child.
const subreaperEnv = "PLOVER_TEST_SUBREAPER"

// inSubreaperChild runs the calling test again in a child process with
// subreaperEnv set and reports false, or reports true in that child.
func inSubreaperChild(t *testing.T) bool {
	t.Helper()
	if os.Getenv(subreaperEnv) != "" {
		return true
	}
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^"+t.Name()+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), subreaperEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS") {
		t.Errorf("as a subreaper server: %v\n%s", err, out)
	}
	return false
}

// A worker's pid (and process group) stays held, its zombie unreaped,
// until every process it left is gone: the seccomp reach filter lets
// those set limits on their worker by its pid, which must not be another
// process's by then. Before, the worker was reaped first and its strays
// ended after; a stray spinning on kill(worker, 0) saw ESRCH.
func TestAWorkersPidIsHeldUntilWhatItLeftIsGone(t *testing.T) {
	if !inSubreaperChild(t) {
		return
	}
	sp := contain.NewSpawner()
	if c, err := sp.Contain(false); c != contain.Subreaper {
		t.Fatalf("containment %v: %v", c, err)
	}
	var out lockedBuffer
	d := NewDevice(Options{Exe: os.Args[0], Base: device.NewHost(0), Landlock: true, StageDir: t.TempDir(), Spawner: sp, Output: &out})
	t.Cleanup(func() { d.Close() })
	// The stray sees a free pid only if it runs in the moment between
	// the reap and its own end: a few workers, so that it is seen.
	for range 3 {
		watchReap(t, d)
		if said := out.String(); strings.Contains(said, "reaped while its stray ran") {
			t.Fatalf("the worker's pid was free while what it left ran: %s", said)
		}
	}
}

// A worker's cgroup ends what it left (all at once, before the reap),
// whatever the Spawner's containment: with process groups alone, a
// process in a session of its own outlived its worker before.
func TestWhatAWorkerLeftInItsCgroupEndsBeforeItsReap(t *testing.T) {
	g := NewPidGroups(cgroupRoot, 64, 0, nil, nil)
	if m := g.Mechanism(); m != "cgroup v1" {
		t.Skipf("pids bounded by %s here: want a writable cgroup v1 pids hierarchy", m)
	}
	t.Cleanup(g.Close)
	var out lockedBuffer
	d := NewDevice(Options{Exe: os.Args[0], Base: device.NewHost(0), Landlock: true, StageDir: t.TempDir(), Spawner: spawner, Pids: g, Output: &out})
	t.Cleanup(func() { d.Close() })
	stray := watchReap(t, d)
	if f, err := statFields(fmt.Sprintf("/proc/%d/stat", stray)); err == nil && f[0] != "Z" && f[0] != "X" && !exiting(f) {
		syscall.Kill(stray, syscall.SIGKILL)
		t.Fatalf("process %d, which the worker left, runs after its reap (%s)", stray, out.String())
	}
	if said := out.String(); strings.Contains(said, "reaped while its stray ran") {
		t.Errorf("the worker's pid was free while what it left ran: %s", said)
	}
}

// watchReap runs the hostile watch_reap in a worker of d, kills the worker
// and returns, once it is reaped, the pid of the process it left.
func watchReap(t *testing.T, d *Device) int {
	t.Helper()
	p, m := loadHostile(t, d, "watch_reap")
	in, r := newInst(t, p, m), oneStep(t, p, m, "watch_reap")
	if err := in.Run(r); err != nil {
		t.Fatal(err)
	}
	var stray int
	if _, err := fmt.Sscanf(string(r.Output), "watching %d", &stray); err != nil {
		t.Fatalf("watch_reap wrote %q: %v", r.Output[:16], err)
	}
	w := p.(*program).p
	w.kill("the test")
	<-w.done
	return stray
}

// A worker's process cannot make a child of the server's (clone with
// CLONE_PARENT): outside its worker's tree, such a child kept the nice
// level it was made at (a light boost's) and its CPU was not counted in
// its worker's, which kept the boost. Before, the clone succeeded.
func TestAWorkerCannotMakeTheServersChild(t *testing.T) {
	d := newDevice(t, 0)
	said := runHostile(t, d, "clone_parent")
	var child int
	if _, err := fmt.Sscanf(said, "clone_parent: child %d", &child); err == nil {
		syscall.Kill(child, syscall.SIGKILL)
		var ws syscall.WaitStatus
		syscall.Wait4(child, &ws, 0, nil)
	}
	if d.filterLogged.Load() {
		t.Skip("this kernel has no seccomp filters")
	}
	if said != "clone_parent: refused EPERM" {
		t.Errorf("the worker's clone(CLONE_PARENT): %q, want it refused", said)
	}
}

// A worker's process cannot make a session of its own (setsid): where
// the kernel schedules sessions as groups, that is a group at nice 0, the
// server's weight, until the server finds it; a tenant whose children each
// did took 0.76-1.45 CPUs beside an honest one's 0.61 (a review's probe).
// Before, the setsid succeeded.
func TestAWorkerCannotMakeASessionOfItsOwn(t *testing.T) {
	if said := runFiltered(t, "new_session"); said != "new_session: EPERM" {
		t.Errorf("the worker's child's setsid: %q, want it refused with EPERM", said)
	}
}

// runFiltered is runHostile in a worker of a device of its own; it skips
// the test where the kernel has no seccomp filters, whose refusals the
// test looks for.
func runFiltered(t *testing.T, kernel string) string {
	t.Helper()
	d := newDevice(t, 0)
	said := runHostile(t, d, kernel)
	if d.filterLogged.Load() {
		t.Skip("this kernel has no seccomp filters")
	}
	return said
}

// runHostile runs the hostile kernel alone in a worker of d and returns
// what it wrote, up to its first NUL.
func runHostile(t *testing.T, d *Device, kernel string) string {
	t.Helper()
	p, m := loadHostile(t, d, kernel)
	in, r := newInst(t, p, m), oneStep(t, p, m, kernel)
	if err := in.Run(r); err != nil {
		t.Fatal(err)
	}
	return string(bytes.TrimRight(r.Output, "\x00"))
}

// A bundle cannot clear its worker's child-subreaper flag: with it
// cleared, a double fork's grandchild went to the next subreaper up, the
// server, out of its worker's tree, where its CPU was not billed and nice
// levels did not reach it, until some worker ended (a review's probe: 0 s
// billed in 3 s of its spinning). Before, the prctl succeeded.
func TestABundleCannotClearItsWorkersSubreaperFlag(t *testing.T) {
	if !inSubreaperChild(t) {
		return
	}
	sp := contain.NewSpawner()
	if c, err := sp.Contain(false); c != contain.Subreaper {
		t.Fatalf("containment %v: %v", c, err)
	}
	d := NewDevice(Options{Exe: os.Args[0], Base: device.NewHost(0), Landlock: true, StageDir: t.TempDir(), Spawner: sp})
	t.Cleanup(func() { d.Close() })
	m := testkit.Manifest("unsubreaper")
	m.Library = "unsubreaper.so"
	m.Chain = []abi.Launch{{Kernel: "unsubreaper", Grid: 1, Block: 1}}
	p := loadSource(t, d, filepath.Join("testdata", "unsubreaper.cc"), m)
	total := billed(t, p)
	in, r := newInst(t, p, m), oneStep(t, p, m, "unsubreaper")
	if err := in.Run(r); err != nil {
		t.Fatal(err)
	}
	said := string(bytes.TrimRight(r.Output, "\x00"))
	var prctl string
	var gc int
	if _, err := fmt.Sscanf(said, "unsubreaper: prctl %s grandchild %d", &prctl, &gc); err != nil || gc <= 0 {
		t.Fatalf("unsubreaper wrote %q: %v", said, err)
	}
	w := p.(*program).p
	defer endEscaped(t, w, gc)
	if d.filterLogged.Load() {
		t.Skip("this kernel has no seccomp filters")
	}
	if prctl != "EPERM" {
		t.Errorf("the bundle's prctl(PR_SET_CHILD_SUBREAPER, 0): %s, want EPERM", prctl)
	}
	if !slices.ContainsFunc(treeOf(w.pid, w.tree.Root()), func(k kin) bool { return k.pid == gc }) {
		f, _ := statFields(fmt.Sprintf("/proc/%d/stat", gc))
		t.Fatalf("the grandchild %d is out of its worker's (%d) tree: its stat %v (the server is %d)", gc, w.pid, f, os.Getpid())
	}
	deadline := time.Now().Add(10 * time.Second)
	for total.Load() < int64(100*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("billed %v in 10 s beside a spinning grandchild", time.Duration(total.Load()))
		}
		w.look(false)
		time.Sleep(20 * time.Millisecond) // the grandchild's CPU to add up
	}
}

// endEscaped ends worker w and then, should the grandchild gc it left
// still run (the server's child, where the subreaper flag was cleared),
// kills and reaps it.
func endEscaped(t *testing.T, w *proc, gc int) {
	w.kill("the test")
	<-w.done
	if f, err := statFields(fmt.Sprintf("/proc/%d/stat", gc)); err == nil && f[0] != "Z" && f[0] != "X" && !exiting(f) {
		t.Errorf("the grandchild %d runs after its worker's reap (%s)", gc, f[0])
		syscall.Kill(gc, syscall.SIGKILL)
	}
	var ws syscall.WaitStatus
	syscall.Wait4(gc, &ws, syscall.WNOHANG, nil) // the server's child, if it escaped
}

// exiting reports whether the process whose /proc stat fields (after its
// command's name) are f is on its way out (PF_EXITING, in the flags): the
// kernel takes a process out of its cgroup's list as it exits, before it
// is a zombie, so one the group's emptying saw leave may still read R or D
// a moment after, under load, its killed life over all the same.
func exiting(f []string) bool {
	flags, err := strconv.ParseUint(f[6], 10, 64)
	return err == nil && flags&0x4 != 0 // PF_EXITING
}
