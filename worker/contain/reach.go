package contain

import (
	"fmt"
	"os"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// RestrictReach installs a seccomp filter, on every thread, that keeps
// the process and all it starts from changing another process's resource
// limits or nice level: prlimit64 only on itself (pid 0 or its own pid),
// setpriority only on itself (PRIO_PROCESS 0 or its own pid) or its own
// process group (PRIO_PGRP 0 or its own), never on a whole user
// (PRIO_USER). The kernel allows both to any process of the same uid
// without a capability and neither Landlock nor the signal scope sees
// them: workers sharing --worker-user, with no PID namespace to hide one
// from another, could set another's RLIMIT_CPU to 1 s (the kernel kills it
// by SIGXCPU once it used that), its RLIMIT_NOFILE or RLIMIT_NPROC to 0,
// or its nice level to 19; a worker of a server's own uid the server's.
// Refused calls fail with EPERM. A thread's setpriority by its own tid is
// refused too (a filter cannot tell a tid of the process from another
// process's pid); the server sets the workers' levels from outside.
//
// It also refuses clone with CLONE_PARENT (EPERM): the child would be the
// server's, outside its worker's tree, where the server's nice levels and
// the light boost's count of the worker's CPU do not look (it is still
// ended with its worker, a stray). clone3's flags are in memory, which a
// filter cannot read, so clone3 fails with ENOSYS, on which glibc (its
// pthread_create, posix_spawn) falls back to clone; Go uses clone.
//
// It must run after no_new_privs is set (Enter), before tenant code. It
// reports false, without error, where the kernel has no seccomp filters
// (asked first, so that a filter the kernel refuses is an error, not read
// as none) or the architecture is not one it knows; the server logs the
// former once (the ready message says).
func RestrictReach() (bool, error) {
	arch, ok := auditArch[runtime.GOARCH]
	if !ok {
		return false, nil
	}
	// A filter at address 0: EFAULT where the kernel has filters (it read
	// the arguments), EINVAL where it has seccomp without them (or no
	// seccomp(2) op for them), ENOSYS where it has no seccomp at all.
	switch _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, 0); e {
	case unix.EFAULT:
	case unix.EINVAL, unix.ENOSYS:
		return false, nil
	default:
		return false, fmt.Errorf("contain: seccomp filters: asking the kernel: %w", e)
	}
	prog := reachFilter(arch, uint32(os.Getpid()), uint32(unix.Getpgrp()))
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	r1, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	switch {
	case e != 0:
		return false, fmt.Errorf("contain: seccomp filter: %w", e)
	case r1 != 0:
		// TSYNC's failure: the id of a thread that could not take the
		// filter (in seccomp's strict mode, or with a filter of its own).
		return false, fmt.Errorf("contain: seccomp filter: thread %d could not take it", r1)
	}
	return true, nil
}

var auditArch = map[string]uint32{
	"amd64": unix.AUDIT_ARCH_X86_64,
	"arm64": unix.AUDIT_ARCH_AARCH64,
}

// Offsets in struct seccomp_data; an argument's low 32 bits (pid_t, int)
// on a little-endian machine.
const (
	seccompNR   = 0
	seccompArch = 4
	seccompArg0 = 16
	seccompArg1 = 24
	x32Bit      = 0x40000000 // __X32_SYSCALL_BIT: amd64's x32 numbers
)

// reachFilter is RestrictReach's program, for pid and process group pgrp.
// A call from another architecture (i386's int 0x80 on amd64) or through
// amd64's x32 numbers is refused whatever it is, since the numbers checked
// are the native ones.
func reachFilter(arch, pid, pgrp uint32) []unix.SockFilter {
	const (
		ld    = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeq   = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		jge   = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
		ja    = unix.BPF_JMP | unix.BPF_JA
		ret   = unix.BPF_RET | unix.BPF_K
		allow = unix.SECCOMP_RET_ALLOW
		deny  = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
		nosys = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
		jset  = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
	)
	// Labels: the index of each named instruction below.
	const (
		lPrio  = 9
		lPgrp  = 15
		lSelf  = 18
		lClone = 20
		lOK    = 22
		lNo    = 23
		lNoSys = 24
	)
	// to is the jump offset from instruction at to label.
	to := func(at, label int) uint8 { return uint8(label - at - 1) }
	return []unix.SockFilter{
		0:      {Code: ld, K: seccompArch},
		1:      {Code: jeq, K: arch, Jt: 0, Jf: to(1, lNo)},
		2:      {Code: ld, K: seccompNR},
		3:      {Code: jge, K: x32Bit, Jt: to(3, lNo), Jf: 0},
		4:      {Code: jeq, K: unix.SYS_CLONE, Jt: to(4, lClone), Jf: 0},
		5:      {Code: jeq, K: unix.SYS_CLONE3, Jt: to(5, lNoSys), Jf: 0},
		6:      {Code: jeq, K: unix.SYS_PRLIMIT64, Jt: 0, Jf: to(6, lPrio)},
		7:      {Code: ld, K: seccompArg0},
		8:      {Code: ja, K: uint32(to(8, lSelf))},
		lPrio:  {Code: jeq, K: unix.SYS_SETPRIORITY, Jt: 0, Jf: to(lPrio, lOK)},
		10:     {Code: ld, K: seccompArg0}, // which
		11:     {Code: jeq, K: unix.PRIO_PGRP, Jt: to(11, lPgrp), Jf: 0},
		12:     {Code: jeq, K: unix.PRIO_PROCESS, Jt: 0, Jf: to(12, lNo)},
		13:     {Code: ld, K: seccompArg1}, // who
		14:     {Code: ja, K: uint32(to(14, lSelf))},
		lPgrp:  {Code: ld, K: seccompArg1},
		16:     {Code: jeq, K: 0, Jt: to(16, lOK), Jf: 0},
		17:     {Code: jeq, K: pgrp, Jt: to(17, lOK), Jf: to(17, lNo)},
		lSelf:  {Code: jeq, K: 0, Jt: to(lSelf, lOK), Jf: 0},
		19:     {Code: jeq, K: pid, Jt: to(19, lOK), Jf: to(19, lNo)},
		lClone: {Code: ld, K: seccompArg0}, // flags, on amd64 and arm64
		21:     {Code: jset, K: unix.CLONE_PARENT, Jt: to(21, lNo), Jf: to(21, lOK)},
		lOK:    {Code: ret, K: allow},
		lNo:    {Code: ret, K: deny},
		lNoSys: {Code: ret, K: nosys},
	}
}
