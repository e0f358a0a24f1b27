package worker

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/plover-run/plover/worker/contain"
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
	pids, _, err := membersOf(dir, ref)
	return pids, err
}

// A killed process is listed in its group's cgroup.procs until its exit
// leaves the group, which for a large address space takes milliseconds;
// meanwhile cgroup v1's /proc/PID/cgroup puts it in the root group, and
// the group cannot be removed. emptyGroup took it for gone once /proc said
// so and returned while it was still there: the removal that followed
// failed, and the group stayed (a dead server's sweep left it; a worker's
// groups waited for Close). It now returns once cgroup.procs lists none.
// Against the node's v1 hierarchies, with a process of 512 MiB.
func TestEmptyGroupWaitsForAProcessOnItsWayOut(t *testing.T) {
	if !contain.HavePidfds() {
		t.Skip("no pidfds: emptyGroup kills nothing by cgroup.procs")
	}
	for _, ctl := range []string{"cpu", "pids"} {
		t.Run(ctl, func(t *testing.T) {
			home := filepath.Join(cgroupRoot, ctl, OwnGroup(ctl))
			dir := filepath.Join(home, fmt.Sprintf("plover-test-%d-exiting", os.Getpid()))
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Skipf("no writable cgroup v1 %s hierarchy: %v", ctl, err)
			}
			t.Cleanup(func() { os.Remove(dir) }) // after the holder's reap
			big := holder(t, 512)
			if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(big.Process.Pid)), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := emptyGroup(dir); err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(dir); err != nil {
				t.Errorf("the group emptyGroup returned for cannot be removed: %v (cgroup.procs %q)", err, strings.TrimSpace(readString(filepath.Join(dir, "cgroup.procs"))))
			}
		})
	}
}

// holdEnv asks the test binary, started again, to hold that many MiB
// touched and say "ready" (holdIfAsked).
const holdEnv = "PLOVER_TEST_HOLD_MIB"

// holder starts the test binary holding mib MiB, killed and reaped after
// the test, and returns once the memory is held.
func holder(t *testing.T, mib int) *exec.Cmd {
	t.Helper()
	c := exec.Command(os.Args[0])
	c.Env = append(os.Environ(), fmt.Sprintf("%s=%d", holdEnv, mib))
	out, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Process.Kill(); c.Wait() })
	line := make([]byte, len("ready"))
	if _, err := io.ReadFull(out, line); err != nil || string(line) != "ready" {
		t.Fatalf("the holder of %d MiB did not start: %q, %v", mib, line, err)
	}
	return c
}

// holdIfAsked is the holder's side: it touches the MiB holdEnv asks for,
// says so and waits to be killed (a minute at most).
func holdIfAsked() {
	n, err := strconv.Atoi(os.Getenv(holdEnv))
	if err != nil {
		return
	}
	b := make([]byte, n<<20)
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	os.Stdout.WriteString("ready")
	time.Sleep(time.Minute)
	b[0]++
	os.Exit(0)
}

// The kernel escapes space, tab, newline and backslash as \ooo in
// mountinfo's root and mount point fields, but not in /proc/PID/cgroup:
// a group's path is its mount's root and its place under the mount point,
// both decoded, else a group under such a name is not the one /proc names
// and emptyGroup misses its processes. The mount is the longest above the
// directory, the last of equals.
func TestGroupRefInMountinfo(t *testing.T) {
	const base = `22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
25 22 0:21 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755
30 25 0:26 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:10 - cgroup cgroup rw,cpu,cpuacct
31 25 0:27 /kube/pod1 /sys/fs/cgroup/pids rw,nosuid shared:11 - cgroup cgroup rw,pids
`
	v1 := func(path string, opts ...string) groupRef {
		return groupRef{opts: append([]string{"rw"}, opts...), path: path}
	}
	v2 := func(path string) groupRef { return groupRef{v2: true, opts: []string{"rw", "nsdelegate"}, path: path} }
	for _, tc := range []struct {
		name, lines, dir string
		want             groupRef
		ok               bool
	}{
		{"v1", "", "/sys/fs/cgroup/cpu,cpuacct/plover-1/42", v1("/plover-1/42", "cpu", "cpuacct"), true},
		{"v1 under a root", "", "/sys/fs/cgroup/pids/plover-1/42", v1("/kube/pod1/plover-1/42", "pids"), true},
		{"v1 mount itself", "", "/sys/fs/cgroup/pids", v1("/kube/pod1", "pids"), true},
		{"v2", "40 22 0:30 / /run/cg2 rw - cgroup2 cgroup2 rw,nsdelegate\n", "/run/cg2/srv/42", v2("/srv/42"), true},
		{"not a cgroup", "", "/sys/fs/cgroup/memory/42", groupRef{}, false},
		{"no mount boundary", "", "/sys/fs/cgroup/pidsx/42", groupRef{}, false},
		{"longest wins over a later shorter", "40 22 0:30 / /sys/fs rw - sysfs sysfs rw\n", "/sys/fs/cgroup/pids/42", v1("/kube/pod1/42", "pids"), true},
		{"longest non-cgroup hides", "40 31 0:30 / /sys/fs/cgroup/pids/x rw - tmpfs tmpfs rw\n", "/sys/fs/cgroup/pids/x/42", groupRef{}, false},
		{"last of equals", "40 25 0:30 / /sys/fs/cgroup/pids rw - cgroup2 cgroup2 rw,nsdelegate\n", "/sys/fs/cgroup/pids/42", v2("/42"), true},
		{"space in mount point", `40 22 0:30 / /cg/a\040b rw - cgroup2 cgroup2 rw,nsdelegate` + "\n", "/cg/a b/42", v2("/42"), true},
		{"tab in mount point", `40 22 0:30 / /cg/a\011b rw - cgroup2 cgroup2 rw,nsdelegate` + "\n", "/cg/a\tb/42", v2("/42"), true},
		{"newline in mount point", `40 22 0:30 / /cg/a\012b rw - cgroup2 cgroup2 rw,nsdelegate` + "\n", "/cg/a\nb/42", v2("/42"), true},
		{"backslash in mount point", `40 22 0:30 / /cg/a\134b rw - cgroup2 cgroup2 rw,nsdelegate` + "\n", `/cg/a\b/42`, v2("/42"), true},
		{"an escape is not the name", `40 22 0:30 / /cg/a\134b rw - cgroup2 cgroup2 rw,nsdelegate` + "\n", `/cg/a\134b/42`, groupRef{}, false},
		{"all in root", `40 22 0:30 /k\040a\011b\012c\134d /cg rw - cgroup cgroup rw,pids` + "\n", "/cg/42", v1("/k a\tb\nc\\d/42", "pids"), true},
		{"root and mount point", `40 22 0:30 /pod\0401 /cg/x\134y rw - cgroup2 cgroup2 rw,nsdelegate` + "\n", `/cg/x\y/42`, v2("/pod 1/42"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := groupRefIn(base+tc.lines, tc.dir)
			if ok != tc.ok || ok && !reflect.DeepEqual(got, tc.want) {
				t.Errorf("groupRefIn(%q) = %+v, %v; want %+v, %v", tc.dir, got, ok, tc.want, tc.ok)
			}
		})
	}
}

// Against the kernel, where this process may mount: a cgroup hierarchy
// mounted again at a path with a tab, a backslash and a space, which
// mountinfo escapes. emptyGroup empties a group there; before, the mount
// was not found and its process was left.
func TestEmptyGroupUnderAnEscapedMountPoint(t *testing.T) {
	if !contain.HavePidfds() {
		t.Skip("no pidfds: emptyGroup kills nothing by cgroup.procs")
	}
	mnt := filepath.Join(t.TempDir(), "cg\tx\\y z")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	fstype, opts := "cgroup", "pids"
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		fstype, opts = "cgroup2", ""
	}
	if err := unix.Mount("none", mnt, fstype, 0, opts); err != nil {
		t.Skipf("cannot mount %s %s: %v", fstype, opts, err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	dir := filepath.Join(mnt, fmt.Sprintf("plover-test-%d-escaped", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(dir) })
	w := exec.Command("sleep", "60")
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Process.Kill(); w.Wait() })
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(w.Process.Pid)), 0o644); err != nil {
		t.Skipf("cannot move a process into %s: %v", dir, err)
	}
	if err := emptyGroup(dir); err != nil {
		t.Fatal(err)
	}
	if left := strings.Fields(readString(filepath.Join(dir, "cgroup.procs"))); len(left) != 0 {
		t.Errorf("processes %v left in a group under %q", left, mnt)
	}
}

// What is no three-digit octal escape of a byte stays as it is.
func TestUnescapeMount(t *testing.T) {
	for in, want := range map[string]string{
		`/a\040b\011c\012d\134e`: "/a b\tc\nd\\e",
		`/a\134134`:              `/a\134`,
		`/plain`:                 "/plain",
		`/a\04`:                  `/a\04`,
		`/a\`:                    `/a\`,
		`/a\400b`:                `/a\400b`,
		`/a\08b`:                 `/a\08b`,
	} {
		if got := unescapeMount(in); got != want {
			t.Errorf("unescapeMount(%q) = %q, want %q", in, got, want)
		}
	}
}

// /proc/PID/cgroup names a process's group in each hierarchy: v2's on its
// "0::" line, a v1 one's on the line listing its controllers. The
// server's own group (OwnGroup) is the line of one controller, "/" where
// none says; a group's member (groupRef.has) is on the first line of the
// group's hierarchy, whose controllers the mount lists all of, at the
// group's path exactly.
func TestProcCgroupLines(t *testing.T) {
	const (
		hybrid = "12:pids:/user.slice/u\n5:cpu,cpuacct:/srv/a\n1:name=systemd:/user.slice\n0::/user.slice/u/s\n"
		v2only = "0::/srv/b\n"
		odd    = "x\n3::/nohier\n4:cpuset:/z\n"
	)
	old := procSelfCgroup
	t.Cleanup(func() { procSelfCgroup = old })
	procSelfCgroup = filepath.Join(t.TempDir(), "cgroup")
	for _, tc := range []struct {
		text, controller, own string
	}{
		{hybrid, "", "/user.slice/u/s"},
		{hybrid, "cpu", "/srv/a"},
		{hybrid, "cpuacct", "/srv/a"},
		{hybrid, "pids", "/user.slice/u"},
		{hybrid, "memory", "/"},
		{v2only, "", "/srv/b"},
		{v2only, "cpu", "/"},
		{odd, "", "/"},
		{odd, "cpu", "/"},
		{"", "", "/"},
	} {
		os.WriteFile(procSelfCgroup, []byte(tc.text), 0o644)
		if got := OwnGroup(tc.controller); got != tc.own {
			t.Errorf("OwnGroup(%q) in %q = %q, want %q", tc.controller, tc.text, got, tc.own)
		}
	}
	for _, tc := range []struct {
		text string
		ref  groupRef
		in   bool
	}{
		{hybrid, groupRef{v2: true, path: "/user.slice/u/s"}, true},
		{hybrid, groupRef{v2: true, path: "/srv/a"}, false},
		{hybrid, groupRef{opts: []string{"rw", "cpu", "cpuacct"}, path: "/srv/a"}, true},
		{hybrid, groupRef{opts: []string{"rw", "cpu"}, path: "/srv/a"}, false}, // a mount of cpu alone is another hierarchy
		{hybrid, groupRef{opts: []string{"rw", "pids"}, path: "/user.slice/u"}, true},
		{hybrid, groupRef{opts: []string{"rw", "pids"}, path: "/srv/a"}, false},
		{hybrid, groupRef{opts: []string{"rw", "xattr", "name=systemd"}, path: "/user.slice"}, true},
		{v2only, groupRef{v2: true, path: "/srv/b"}, true},
		{v2only, groupRef{opts: []string{"rw", "cpu"}, path: "/srv/b"}, false},
		{odd, groupRef{opts: []string{"rw", ""}, path: "/nohier"}, false},
		{odd, groupRef{v2: true, path: "/nohier"}, false},
		{odd, groupRef{opts: []string{"cpuset"}, path: "/z"}, true},
		{"4:cpuset:/z\n4:cpuset:/y\n", groupRef{opts: []string{"cpuset"}, path: "/y"}, false}, // the first line of the hierarchy
	} {
		if got := tc.ref.listedIn(tc.text); got != tc.in {
			t.Errorf("%+v listed in %q: %v, want %v", tc.ref, tc.text, got, tc.in)
		}
	}
}
