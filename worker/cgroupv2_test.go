package worker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// A failure to pass the cpu controller down names the cause its errno
// gives: before, every failure was said to be processes in the group,
// ENOENT (the parent does not delegate the controller) too. Against a
// fake v2 hierarchy whose group's cgroup.subtree_control fails as set up.
func TestEnablingTheCPUControllerSaysWhyNot(t *testing.T) {
	for _, tc := range []struct {
		name    string
		file    func(root, path string) // makes the group's cgroup.subtree_control fail
		say     string
		sayNone []string
	}{
		{"not delegated (ENOENT)", func(root, path string) { os.Symlink(filepath.Join(root, "gone", "x"), path) },
			"does not pass the cpu controller down", []string{"holds processes"}},
		{"a failure with no cause named (EISDIR)", func(_, path string) { os.Mkdir(path, 0o755) },
			"is a directory", []string{"holds processes", "does not pass", "may not write"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := fakeCgroups(t, "0::/srv\n")
			os.WriteFile(filepath.Join(root, "cgroup.controllers"), []byte("cpu pids memory\n"), 0o644)
			os.MkdirAll(filepath.Join(root, "srv"), 0o755)
			tc.file(root, filepath.Join(root, "srv", "cgroup.subtree_control"))
			log, said := logTo()
			g := NewCPUGroupsAt(root, log)
			t.Cleanup(g.Close)
			if m := g.Mechanism(); m == "cgroup v2" {
				t.Fatalf("mechanism %s with a group that cannot pass cpu down", m)
			}
			if said("cannot enable the cpu controller") != 1 || said(tc.say) != 1 {
				t.Errorf("the log does not say once that the cpu controller cannot be enabled, and %q", tc.say)
			}
			for _, s := range tc.sayNone {
				if said(s) != 0 {
					t.Errorf("the log says %q", s)
				}
			}
		})
	}
}

func TestWhyNotEnabled(t *testing.T) {
	for _, tc := range []struct {
		errno syscall.Errno
		says  string
	}{
		{syscall.ENOENT, "does not pass the pids controller down"},
		{syscall.EBUSY, "holds processes"},
		{syscall.EACCES, "may not write"},
		{syscall.EROFS, "may not write"},
		{syscall.EOPNOTSUPP, "threaded"},
		{syscall.EINVAL, ""},
	} {
		err := &os.PathError{Op: "open", Path: "cgroup.subtree_control", Err: tc.errno}
		if got := whyNotEnabled("pids", err); tc.says == "" && got != "" || !strings.Contains(got, tc.says) {
			t.Errorf("%v: %q, want it to say %q", tc.errno, got, tc.says)
		}
	}
}

// v2HomeEnv names, in the test binary run again, the home group of
// TestCloseGoesHomeUnderCgroupV2's server.
const v2HomeEnv = "PLOVER_TEST_V2_HOME"

// Under cgroup v2 a server whose home group passes a controller down (it
// passed cpu, pids and memory) while the server's own group in it holds
// the server cannot go back home: the kernel's no-internal-process rule
// refuses the move (EBUSY), which Close ignored, and the server's groups
// stayed until the next start. Close now takes the controllers back, its
// own group's and then those it passed at home, and goes home. Against the
// real hierarchy, with a controller this host's offers (it need not be
// cpu: the rule holds for any), in a process of its own that moves itself
// about; skipped where there is none to write.
func TestCloseGoesHomeUnderCgroupV2(t *testing.T) {
	mount, ctl := v2Controller(t)
	if os.Getenv(v2HomeEnv) == "" {
		home := filepath.Join(mount, fmt.Sprintf("plover-test-home-%d", os.Getpid()))
		if err := os.Mkdir(home, 0o755); err != nil {
			t.Skipf("cannot make a cgroup in %s: %v", mount, err)
		}
		t.Cleanup(func() { removeTree(home) })
		out, err := rerun(t, v2HomeEnv+"="+home)
		if err != nil || !strings.Contains(string(out), "--- PASS") {
			t.Errorf("as a server under cgroup v2: %v\n%s", err, out)
		}
		return
	}
	home := os.Getenv(v2HomeEnv)
	moveTo := func(dir string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(fmt.Sprint(os.Getpid())), 0o644); err != nil {
			t.Fatalf("move into %s: %v", dir, err)
		}
	}
	// As a server starts: in its home group, it makes its own in it, moves
	// into that one's server group and passes the controller down.
	moveTo(home)
	log, said := logTo()
	g := &CPUGroups{v2: true, home: home, dir: filepath.Join(home, fmt.Sprintf("plover-%d", os.Getpid())), log: log}
	for _, d := range []string{g.dir, filepath.Join(g.dir, "server")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	moveTo(filepath.Join(g.dir, "server"))
	if err := g.passDown(ctl); err != nil {
		t.Fatal(err)
	}
	if err := g.goHome(); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("going home with %s passed down: %v, want EBUSY (the rule this rests on)", ctl, err)
	}
	g.Close()
	if own := filepath.Join(mount, OwnGroup("")); own != home {
		t.Errorf("the server is in %s after Close, want %s", own, home)
	}
	if _, err := os.Stat(g.dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the server's group outlived Close: %v", err)
	}
	if got := subtreeControllers(home); len(got) != 0 {
		t.Errorf("home passes %v down after Close, want nothing, as before", got)
	}
	if said("cannot") != 0 {
		t.Error("Close logged a failure")
	}
}

// Close takes back at home only what the server passed down there: a
// controller home passed before it started stays passed. Against a fake
// v2 hierarchy, whose files keep what was last written.
func TestTakeBackLeavesWhatHomePassedBefore(t *testing.T) {
	root := fakeCgroups(t, "0::/srv\n")
	home := filepath.Join(root, "srv")
	os.MkdirAll(home, 0o755)
	os.WriteFile(filepath.Join(root, "cgroup.controllers"), []byte("cpu pids memory"), 0o644)
	os.WriteFile(filepath.Join(home, "cgroup.subtree_control"), []byte("cpu"), 0o644)
	cpu := NewCPUGroupsAt(root, nil)
	t.Cleanup(cpu.Close)
	if NewPidGroups(root, 100, 65534, cpu, nil).Mechanism() != "cgroup v2" {
		t.Fatal("no v2 pids groups on a writable fake hierarchy")
	}
	if !slices.Equal(cpu.passed, []string{"pids"}) {
		t.Fatalf("the server passed %v down at home, by its count; want [pids] (cpu home passed before)", cpu.passed)
	}
	cpu.takeBack()
	for _, d := range []string{home, cpu.dir} {
		if got := readString(filepath.Join(d, "cgroup.subtree_control")); got != "-pids" {
			t.Errorf("%s's subtree_control last written %q, want -pids", d, got)
		}
	}
}

// v2Controller is where a cgroup v2 hierarchy is mounted and a controller
// its root passes down, for a test to pass on: one it passes already, else
// one it offers, passed down for the test (and taken back after: this
// host's hierarchy offers hugetlb alone, which its root does not pass). It
// skips where there is none, or the test is not root.
func v2Controller(t *testing.T) (mount, ctl string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("writes the cgroup hierarchy: needs root")
	}
	b, _ := os.ReadFile("/proc/self/mounts")
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) > 2 && f[2] == "cgroup2" {
			mount = f[1]
			break
		}
	}
	if mount == "" {
		t.Skip("no cgroup v2 hierarchy mounted")
	}
	if passed := subtreeControllers(mount); len(passed) > 0 {
		return mount, passed[0]
	}
	offered, _ := os.ReadFile(filepath.Join(mount, "cgroup.controllers"))
	f := strings.Fields(string(offered))
	if len(f) == 0 {
		t.Skipf("the cgroup v2 hierarchy at %s offers no controller", mount)
	}
	if os.Getenv(v2HomeEnv) == "" { // the test run again finds it passed
		if err := enableController(mount, f[0]); err != nil {
			t.Skipf("cannot pass %s down from %s: %v", f[0], mount, err)
		}
		t.Cleanup(func() {
			os.WriteFile(filepath.Join(mount, "cgroup.subtree_control"), []byte("-"+f[0]), 0o644)
		})
	}
	return mount, f[0]
}

// removeTree removes group dir and every group under it, deepest first
// (the kernel removes no group that holds one); each must hold no process.
func removeTree(dir string) {
	kids, _ := os.ReadDir(dir)
	for _, k := range kids {
		if k.IsDir() {
			removeTree(filepath.Join(dir, k.Name()))
		}
	}
	os.Remove(dir)
}
