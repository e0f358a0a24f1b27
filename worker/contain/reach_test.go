package contain

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// childReach takes no_new_privs and the reach filter, then tries the calls
// it bounds on itself and on CT_OTHER (a process of the same uid), and
// prints one "name errno" line each ("name ok" for none).
func childReach() {
	if !takeReachFilter() {
		return
	}
	other, err := strconv.Atoi(os.Getenv("CT_OTHER"))
	if err != nil {
		die("CT_OTHER: %v", err)
	}
	var lim unix.Rlimit
	for _, c := range append([]reachCall{
		{"prlimit-self-0", func() error { return unix.Prlimit(0, unix.RLIMIT_NOFILE, nil, &lim) }},
		{"prlimit-self-pid", func() error { return unix.Prlimit(os.Getpid(), unix.RLIMIT_NOFILE, nil, &lim) }},
		{"setrlimit", func() error {
			unix.Getrlimit(unix.RLIMIT_NOFILE, &lim)
			return unix.Setrlimit(unix.RLIMIT_NOFILE, &lim)
		}},
		{"prlimit-other", func() error { return unix.Prlimit(other, unix.RLIMIT_NOFILE, nil, &lim) }},
		{"prlimit-other-high-bits", func() error {
			_, _, e := unix.Syscall6(unix.SYS_PRLIMIT64, uintptr(1<<32|other), unix.RLIMIT_NOFILE, 0, uintptr(0), 0, 0)
			if e != 0 {
				return e
			}
			return nil
		}},
		{"nice-self-0", func() error { return unix.Setpriority(unix.PRIO_PROCESS, 0, 19) }},
		{"nice-other", func() error { return unix.Setpriority(unix.PRIO_PROCESS, other, 19) }},
		{"nice-user", func() error { return unix.Setpriority(unix.PRIO_USER, 0, 19) }},
		{"nice-own-group", func() error { return unix.Setpriority(unix.PRIO_PGRP, 0, 19) }},
		{"setsid", func() error { return inChild(unix.SYS_SETSID, 0, 0) }},
		{"setpgid", func() error { return inChild(unix.SYS_SETPGID, 0, 0) }},
		{"clone-parent", func() error { return rawClone(unix.CLONE_PARENT) }},
		{"clone", func() error { return rawClone(0) }},
		{"fork-exec", func() error { return exec.Command("true").Run() }},
		{"dumpable-0", func() error { return unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0) }},
		{"dumpable-1", func() error { return unix.Prctl(unix.PR_SET_DUMPABLE, 1, 0, 0, 0) }},
		{"dumpable-high-bits", func() error { return unix.Prctl(unix.PR_SET_DUMPABLE, 1<<32|1, 0, 0, 0) }},
		{"subreaper-clear", func() error { return unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0) }},
		{"subreaper-set", func() error { return unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) }},
		{"prctl-other", func() error {
			return unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(&[]byte("reach\x00")[0])), 0, 0, 0)
		}},
		// Arguments each call refuses (no object is made where the filter
		// lets one by): the kernel's EINVAL, ENOENT, EFAULT, EOPNOTSUPP.
		{"shmget", sysErr(unix.SYS_SHMGET, unix.IPC_PRIVATE, 0, 0o600)},
		{"shmat", sysErr(unix.SYS_SHMAT, ^uintptr(0), 0, 0)},
		{"msgget", sysErr(unix.SYS_MSGGET, 0x504c4f56, 0, 0)},
		{"semget", sysErr(unix.SYS_SEMGET, unix.IPC_PRIVATE, ^uintptr(0), 0o600)},
		{"shmctl", sysErr(unix.SYS_SHMCTL, ^uintptr(0), 0, 0)},
		{"shmdt", sysErr(unix.SYS_SHMDT, 1, 0, 0)},
		{"msgsnd", sysErr(unix.SYS_MSGSND, ^uintptr(0), 0, 0)},
		{"msgrcv", sysErr(unix.SYS_MSGRCV, ^uintptr(0), 0, 0)},
		{"msgctl", sysErr(unix.SYS_MSGCTL, ^uintptr(0), 0, 0)},
		{"semop", sysErr(unix.SYS_SEMOP, ^uintptr(0), 0, 0)},
		{"semtimedop", sysErr(unix.SYS_SEMTIMEDOP, ^uintptr(0), 0, 0)},
		{"semctl", sysErr(unix.SYS_SEMCTL, ^uintptr(0), 0, 0)},
		{"mq_open", sysErr(unix.SYS_MQ_OPEN, 0, 0, 0)},
		{"mq_unlink", sysErr(unix.SYS_MQ_UNLINK, 0, 0, 0)},
		{"mq_timedsend", sysErr(unix.SYS_MQ_TIMEDSEND, ^uintptr(0), 0, 0)},
		{"mq_timedreceive", sysErr(unix.SYS_MQ_TIMEDRECEIVE, ^uintptr(0), 0, 0)},
		{"mq_notify", sysErr(unix.SYS_MQ_NOTIFY, ^uintptr(0), 0, 0)},
		{"mq_getsetattr", sysErr(unix.SYS_MQ_GETSETATTR, ^uintptr(0), 0, 0)},
		{"add_key", sysErr(unix.SYS_ADD_KEY, 0, 0, 0)},
		{"keyctl", sysErr(unix.SYS_KEYCTL, 9999, 0, 0)},
		{"request_key", sysErr(unix.SYS_REQUEST_KEY, 0, 0, 0)},
		{"clone3", func() error {
			// No arguments: the kernel's EINVAL, where the filter lets it by.
			_, _, e := unix.RawSyscall(unix.SYS_CLONE3, 0, 0, 0)
			return e
		}},
	}, append(schedCalls(other), nsCalls()...)...) {
		err := c.call()
		var e unix.Errno
		switch {
		case err == nil:
			fmt.Printf("%s ok\n", c.name)
		case errors.As(err, &e):
			fmt.Printf("%s %s\n", c.name, unix.ErrnoName(e))
		default:
			fmt.Printf("%s %v\n", c.name, err)
		}
	}
}

// reachCall is one of childReach's calls, named as its line says.
type reachCall struct {
	name string
	call func() error
}

// sysErr is a call of trap with a, b, c, returning its errno (nil: none).
func sysErr(trap, a, b, c uintptr) func() error {
	return func() error {
		if _, _, e := unix.Syscall(trap, a, b, c); e != 0 {
			return e
		}
		return nil
	}
}

// takeReachFilter takes no_new_privs and the reach filter; where the
// kernel has no seccomp filters it prints "unsupported" and reports false.
func takeReachFilter() bool {
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		die("no_new_privs: %v", err)
	}
	on, err := RestrictReach()
	if err != nil {
		die("RestrictReach: %v", err)
	}
	if !on {
		fmt.Println("unsupported")
	}
	return on
}

// rawClone forks with clone(flags|SIGCHLD); the child exits at once, by a
// raw call (a forked Go process has none of its threads), and is reaped
// where it is this process's: by __WALL, as flags may change the exit
// signal (their low byte is ORed into it), and a child that signals
// anything but SIGCHLD is a "clone" child, which wait4 otherwise skips.
func rawClone(flags uintptr) error {
	pid, _, e := unix.RawSyscall(unix.SYS_CLONE, flags|uintptr(unix.SIGCHLD), 0, 0)
	if e != 0 {
		return e
	}
	if pid == 0 {
		unix.RawSyscall(unix.SYS_EXIT_GROUP, 0, 0, 0)
	}
	if flags&unix.CLONE_PARENT == 0 {
		var ws unix.WaitStatus
		unix.Wait4(int(pid), &ws, unix.WALL, nil)
	}
	return nil
}

// inChild makes system call trap with a and b in a child forked for it
// and returns the child's errno, passed back as its exit status: this
// process leads a session, where setsid and setpgid fail with EPERM
// whatever the filter says. The child makes raw calls alone (a forked Go
// process has none of its threads).
func inChild(trap, a, b uintptr) error {
	pid, _, e := unix.RawSyscall(unix.SYS_CLONE, uintptr(unix.SIGCHLD), 0, 0)
	if e != 0 {
		return e
	}
	if pid == 0 {
		_, _, e := unix.RawSyscall(trap, a, b, 0)
		unix.RawSyscall(unix.SYS_EXIT_GROUP, uintptr(e), 0, 0)
	}
	var ws unix.WaitStatus
	if _, err := unix.Wait4(int(pid), &ws, 0, nil); err != nil {
		return fmt.Errorf("wait for the child: %w", err)
	}
	if !ws.Exited() {
		return fmt.Errorf("the child: %v", ws)
	}
	if n := ws.ExitStatus(); n != 0 {
		return unix.Errno(n)
	}
	return nil
}

// The reach filter lets a process change its own limits, nice level,
// scheduling and I/O priority (pid 0 or its own, glibc's setrlimit, its
// own process group for setpriority) and refuses another process's,
// however its pid is written, and a whole uid's (the other's scheduling
// stays as it was). It refuses a session of its own to a child (setsid),
// not a process group, and the subreaper flag, set or cleared. It refuses
// a child made its parent's (CLONE_PARENT) and clone3, and lets other
// clones by; System V IPC and the keyrings are ENOSYS (before, a worker's
// segment outlived it and another tenant's worker read it: a review's
// probe). It refuses a namespace of its own to a process without any
// capability, as a worker is (before, a user namespace gave a worker's
// child every capability in it: a review's probe), and setns.
func TestRestrictReach(t *testing.T) {
	other := exec.Command("sleep", "60")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { other.Process.Kill(); other.Wait() }()
	before, err := schedState(other.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	cmd := childCommand(t, "reach", "CT_OTHER="+strconv.Itoa(other.Process.Pid))
	// A session of its own, as a worker has: its own group's nice level
	// is then its own, not this test's.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if strings.TrimSpace(string(out)) == "unsupported" {
		t.Skip("this kernel has no seccomp filters")
	}
	got := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if name, res, ok := strings.Cut(l, " "); ok {
			got[name] = res
		}
	}
	for name, want := range map[string]string{
		"prlimit-self-0": "ok", "prlimit-self-pid": "ok", "setrlimit": "ok", "nice-self-0": "ok", "nice-own-group": "ok",
		"prlimit-other": "EPERM", "prlimit-other-high-bits": "EPERM", "nice-other": "EPERM", "nice-user": "EPERM",
		// A child of this process's parent (the server's) is out of its
		// worker's tree; clone3 is left to glibc's fallback to clone.
		"clone-parent": "EPERM", "clone": "ok", "fork-exec": "ok", "clone3": "ENOSYS",
		// A user namespace is every capability in it, and with a network
		// namespace CAP_NET_ADMIN over it (nf_tables, tc, xfrm). More
		// in TestRestrictReachRefusesNamespaces.
		"unshare-user": "EPERM", "unshare-user-net": "EPERM", "unshare-net": "EPERM", "clone-user": "EPERM",
		"clone-user-net": "EPERM", "setns-own-net": "EPERM", "setns-bad-fd": "EPERM", "clone-time-bit": "ok",
		// A session of its own is an autogroup of its own, at nice 0
		// (a review's probe: a tenant's setsid children took 0.76-1.45
		// CPUs beside an honest one's 0.61); a process group is none.
		"setsid": "EPERM", "setpgid": "ok",
		// Dumpable again, a worker's /proc files would be its own: its
		// autogroup's weight among them. Other prctl options pass.
		"dumpable-0": "ok", "dumpable-1": "EPERM", "dumpable-high-bits": "EPERM", "prctl-other": "ok",
		// A worker that cleared its subreaper flag had its orphans go
		// to the server, out of its tree.
		"subreaper-clear": "EPERM", "subreaper-set": "EPERM",
		// The node's System V IPC objects and the uid's keyrings.
		"shmget": "ENOSYS", "shmat": "ENOSYS", "shmctl": "ENOSYS", "shmdt": "ENOSYS",
		"msgget": "ENOSYS", "msgsnd": "ENOSYS", "msgrcv": "ENOSYS", "msgctl": "ENOSYS",
		"semget": "ENOSYS", "semop": "ENOSYS", "semtimedop": "ENOSYS", "semctl": "ENOSYS",
		// POSIX message queues: Landlock refuses mq_open, yet the queue
		// was made (a review's probe), and the calls by descriptor.
		"mq_open": "ENOSYS", "mq_unlink": "ENOSYS", "mq_timedsend": "ENOSYS", "mq_timedreceive": "ENOSYS",
		"mq_notify": "ENOSYS", "mq_getsetattr": "ENOSYS",
		"add_key": "ENOSYS", "keyctl": "ENOSYS", "request_key": "ENOSYS",
		// Another's policy, nice level, priority, CPUs and I/O class,
		// which outlive the caller: the server's, where workers have its
		// uid. On itself only as 0 or its pid.
		"sched-self-0": "ok", "sched-self-pid": "ok", "sched-other": "EPERM", "sched-other-high-bits": "EPERM",
		"schedparam-other": "EPERM", "schedattr-self-0": "ok", "schedattr-other": "EPERM",
		"affinity-self-0": "ok", "affinity-other": "EPERM",
		"ioprio-self-0": "ok", "ioprio-self-pid": "ok", "ioprio-other": "EPERM", "ioprio-user": "EPERM", "ioprio-pgrp": "EPERM",
	} {
		if got[name] != want {
			t.Errorf("%s: %q, want %s (all: %s)", name, got[name], want, out)
		}
	}
	if after, err := schedState(other.Process.Pid); err != nil {
		t.Error(err)
	} else if after != before {
		t.Errorf("the other process's scheduling changed: %s, was %s", after, before)
	}
}

// childReachSockets tries each way of making a socket, and io_uring_setup,
// before and after taking no_new_privs and the reach filter, and prints
// one "before|after name errno" line each ("ok" for none).
func childReachSockets() {
	beforeAndAfter([]reachCall{
		{"inet-dgram", sock(unix.AF_INET, unix.SOCK_DGRAM, 0)},
		{"inet6-stream", sock(unix.AF_INET6, unix.SOCK_STREAM, 0)},
		{"inet-icmp", sock(unix.AF_INET, unix.SOCK_DGRAM, unix.IPPROTO_ICMP)},
		{"inet-raw", sock(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_UDP)},
		{"packet", sock(unix.AF_PACKET, unix.SOCK_RAW, 0)},
		{"vsock", sock(unix.AF_VSOCK, unix.SOCK_STREAM, 0)},
		// The kernel takes the family as an int, its low 32 bits: what
		// the filter reads too.
		{"inet-high-bits", rawSock(1<<32 | unix.AF_INET)},
		{"unix-high-bits", rawSock(1<<32 | unix.AF_UNIX)},
		{"unix-stream", sock(unix.AF_UNIX, unix.SOCK_STREAM, 0)},
		{"unix-dgram", sock(unix.AF_UNIX, unix.SOCK_DGRAM, 0)},
		{"unix-seqpacket", sock(unix.AF_UNIX, unix.SOCK_SEQPACKET, 0)},
		{"netlink-route", sock(unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE)},
		{"socketpair-unix", sockpair(unix.AF_UNIX)},
		{"socketpair-inet", sockpair(unix.AF_INET)},
		{"io-uring-setup", func() error {
			// struct io_uring_params: 120 bytes, all zero asks for
			// the defaults.
			var params [120]byte
			fd, _, e := unix.Syscall(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&params)), 0)
			if e != 0 {
				return e
			}
			return unix.Close(int(fd))
		}},
	})
}

// beforeAndAfter makes each call before and after taking no_new_privs and
// the reach filter, and prints one "before|after name errno" line each
// ("ok" for none): what the kernel answers without the filter shows that
// a refusal after it is the filter's.
func beforeAndAfter(calls []reachCall) {
	run := func(when string) {
		for _, c := range calls {
			fmt.Printf("%s %s %s\n", when, c.name, outcome(c.call()))
		}
	}
	run("before")
	if !takeReachFilter() {
		return
	}
	run("after")
}

// beforeAndAfterLines runs cmd, a child that prints beforeAndAfter's
// lines, and returns them by "before|after name"; it skips the test where
// the kernel has no seccomp filters.
func beforeAndAfterLines(t *testing.T, cmd *exec.Cmd) (map[string]string, []byte) {
	t.Helper()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "unsupported") {
		t.Skip("this kernel has no seccomp filters")
	}
	got := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(l); len(f) == 3 {
			got[f[0]+" "+f[1]] = f[2]
		}
	}
	return got, out
}

// sock makes a socket and closes it.
func sock(family, typ, proto int) func() error {
	return func() error {
		fd, err := unix.Socket(family, typ|unix.SOCK_CLOEXEC, proto)
		if err != nil {
			return err
		}
		return unix.Close(fd)
	}
}

// rawSock is sock with a family of 64 bits, which unix.Socket cannot pass.
func rawSock(family uint64) func() error {
	return func() error {
		fd, _, e := unix.Syscall(unix.SYS_SOCKET, uintptr(family), unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if e != 0 {
			return e
		}
		return unix.Close(int(fd))
	}
}

// sockpair makes a pair of datagram sockets and closes them.
func sockpair(family int) func() error {
	return func() error {
		fds, err := unix.Socketpair(family, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		unix.Close(fds[0])
		return unix.Close(fds[1])
	}
}

// The reach filter lets a worker make Unix sockets (its channels, the CUDA
// driver's and MPS's, syslog's) and netlink ones, and refuses every other
// family with EPERM, whatever the kernel would have said: no UDP, no TCP
// (which Landlock refuses only from its ABI 4, and UDP never), no raw or
// packet sockets, no vsock to a hypervisor. io_uring, which makes sockets
// without socket(2) (IORING_OP_SOCKET), answers ENOSYS, as on a kernel
// without it.
func TestRestrictReachRefusesNetworkSockets(t *testing.T) {
	got, out := beforeAndAfterLines(t, childCommand(t, "reach-sockets"))
	// Without the filter the kernel makes these (this test's own
	// sockets): what the filter refuses is then refused by it.
	for _, name := range []string{"inet-dgram", "inet6-stream", "unix-stream"} {
		if got["before "+name] != "ok" {
			t.Errorf("before the filter, %s: %q, want ok (all:\n%s)", name, got["before "+name], out)
		}
	}
	for name, want := range map[string]string{
		"inet-dgram": "EPERM", "inet6-stream": "EPERM", "inet-icmp": "EPERM", "inet-raw": "EPERM",
		"packet": "EPERM", "vsock": "EPERM", "inet-high-bits": "EPERM", "socketpair-inet": "EPERM",
		"unix-high-bits": "ok", "unix-stream": "ok", "unix-dgram": "ok", "unix-seqpacket": "ok",
		"netlink-route": "ok", "socketpair-unix": "ok",
		"io-uring-setup": "ENOSYS",
	} {
		if g := got["after "+name]; g != want {
			t.Errorf("%s: %q, want %s (before the filter: %q)", name, g, want, got["before "+name])
		}
	}
}
