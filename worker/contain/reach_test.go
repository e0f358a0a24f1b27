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

	"golang.org/x/sys/unix"
)

// childReach takes no_new_privs and the reach filter, then tries the calls
// it bounds on itself and on CT_OTHER (a process of the same uid), and
// prints one "name errno" line each ("name ok" for none).
func childReach() {
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		die("no_new_privs: %v", err)
	}
	on, err := RestrictReach()
	if err != nil {
		die("RestrictReach: %v", err)
	}
	if !on {
		fmt.Println("unsupported")
		return
	}
	other, err := strconv.Atoi(os.Getenv("CT_OTHER"))
	if err != nil {
		die("CT_OTHER: %v", err)
	}
	var lim unix.Rlimit
	for _, c := range []struct {
		name string
		call func() error
	}{
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
		{"clone-parent", func() error { return rawClone(unix.CLONE_PARENT) }},
		{"clone", func() error { return rawClone(0) }},
		{"fork-exec", func() error { return exec.Command("true").Run() }},
		{"clone3", func() error {
			// No arguments: the kernel's EINVAL, where the filter lets it by.
			_, _, e := unix.RawSyscall(unix.SYS_CLONE3, 0, 0, 0)
			return e
		}},
	} {
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

// rawClone forks with clone(flags|SIGCHLD); the child exits at once, by a
// raw call (a forked Go process has none of its threads), and is reaped
// where it is this process's.
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
		unix.Wait4(int(pid), &ws, 0, nil)
	}
	return nil
}

// The reach filter lets a process change its own limits and nice level
// (pid 0 or its own, glibc's setrlimit, its own process group) and refuses
// another process's, however its pid is written, and a whole uid's. It
// refuses a child made its parent's (CLONE_PARENT) and clone3, and lets
// other clones by.
func TestRestrictReach(t *testing.T) {
	other := exec.Command("sleep", "60")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { other.Process.Kill(); other.Wait() }()
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
	} {
		if got[name] != want {
			t.Errorf("%s: %q, want %s (all: %s)", name, got[name], want, out)
		}
	}
}
