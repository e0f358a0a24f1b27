package contain

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// namespaces are the kinds of namespace a process could make for itself,
// by the flag that asks for one.
var namespaces = []struct {
	name string
	flag uintptr
}{
	{"user", unix.CLONE_NEWUSER}, {"mnt", unix.CLONE_NEWNS}, {"pid", unix.CLONE_NEWPID},
	{"net", unix.CLONE_NEWNET}, {"ipc", unix.CLONE_NEWIPC}, {"uts", unix.CLONE_NEWUTS},
	{"cgroup", unix.CLONE_NEWCGROUP},
}

// nsCalls are the ways into a namespace, new or another's: unshare of each
// kind (and of the time namespace, which clone cannot make), clone with
// each, setns into this process's own network namespace and on no
// descriptor (the kernel's EBADF, where the filter lets it by). unshare and
// setns run in a child forked for them: the kernel refuses
// unshare(CLONE_NEWUSER) to a process of more than one thread, as a Go one
// is (EINVAL, whatever the filter says), and they must not change the
// caller's namespaces. clone's time bit is its exit signal's (0x80 |
// SIGCHLD is no signal), not CLONE_NEWTIME: that clone is let by.
func nsCalls() []reachCall {
	unshare := func(flags uintptr) func() error {
		return func() error { return inChild(unix.SYS_UNSHARE, flags, 0) }
	}
	clone := func(flags uintptr) func() error { return func() error { return rawClone(flags) } }
	calls := []reachCall{
		{"unshare-time", unshare(unix.CLONE_NEWTIME)},
		// The review's probe: a user namespace, and in it a network
		// namespace over which it holds CAP_NET_ADMIN.
		{"unshare-user-net", unshare(unix.CLONE_NEWUSER | unix.CLONE_NEWNET)},
		{"unshare-files", unshare(unix.CLONE_FILES)},
		{"clone-user-net", clone(unix.CLONE_NEWUSER | unix.CLONE_NEWNET)},
		{"clone-time-bit", clone(unix.CLONE_NEWTIME)},
		{"setns-own-net", func() error {
			fd, err := unix.Open("/proc/self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			return inChild(unix.SYS_SETNS, uintptr(fd), unix.CLONE_NEWNET)
		}},
		{"setns-bad-fd", func() error { return inChild(unix.SYS_SETNS, ^uintptr(0), 0) }},
	}
	for _, ns := range namespaces {
		calls = append(calls, reachCall{"unshare-" + ns.name, unshare(ns.flag)}, reachCall{"clone-" + ns.name, clone(ns.flag)})
	}
	return calls
}

// childReachNamespaces makes nsCalls before and after the reach filter.
func childReachNamespaces() { beforeAndAfter(nsCalls()) }

// The reach filter refuses every way into a namespace: a user namespace
// gives a process every capability in it, and a network namespace of its
// own then CAP_NET_ADMIN over it, which opens nf_tables, tc, xfrm and
// rtnetlink to a worker's bundle (a review's probe: a forked child's
// unshare(CLONE_NEWUSER) had CapEff 000001ffffffffff, and an nf_tables
// batch in a new network namespace was acked). The child runs as root of
// a user and network namespace of its own, so that without the filter
// the kernel makes every namespace asked for, whoever runs the test: a
// refusal after the filter is the filter's, flag by flag.
func TestRestrictReachRefusesNamespaces(t *testing.T) {
	own := &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNET,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
	}
	if err := (&exec.Cmd{Path: "/bin/true", SysProcAttr: own}).Run(); err != nil {
		t.Skipf("the kernel makes no user namespace here: %v", err)
	}
	cmd := childCommand(t, "reach-ns")
	cmd.SysProcAttr = own
	got, out := beforeAndAfterLines(t, cmd)
	// Every call but these makes its namespace before the filter (the
	// kernel's answers: "|" between those it may give) and is refused
	// with EPERM after.
	odd := map[string]struct{ before, after string }{
		"setns-bad-fd": {"EBADF", "EPERM"},
		// A kernel without time namespaces answers EINVAL.
		"unshare-time": {"ok|EINVAL", "EPERM"},
		// An exit signal, no namespace: the filter leaves it be.
		"clone-time-bit": {"ok", "ok"},
	}
	for _, c := range nsCalls() {
		want, ok := odd[c.name]
		if !ok {
			want.before, want.after = "ok", "EPERM"
		}
		if before := got["before "+c.name]; !slices.Contains(strings.Split(want.before, "|"), before) {
			t.Errorf("before the filter, %s: %q, want %s (all:\n%s)", c.name, before, want.before, out)
		}
		if after := got["after "+c.name]; after != want.after {
			t.Errorf("%s: %q, want %s (before the filter: %q)", c.name, after, want.after, got["before "+c.name])
		}
	}
}
