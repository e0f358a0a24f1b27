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
// It refuses prctl(PR_SET_DUMPABLE) but to 0 (EPERM): a worker makes
// itself non-dumpable as it starts (MakeNonDumpable), and its /proc files
// are then root's; dumpable again, they would be its own, and it could
// raise its own autogroup's weight (/proc/self/autogroup, which the kernel
// lets any writer of the file set to nice 0) where the server weighs
// workers by nice level and autogroups are in force, and, without
// Landlock, open its memory to workers of its uid. A program it runs
// (execve) is dumpable again all the same: only Landlock, which keeps
// /proc read-only, closes that way.
//
// It takes away the network: socket and socketpair succeed only for Unix
// and netlink sockets and fail with EPERM for every other family. Landlock
// refuses TCP bind and connect only from its ABI 4 (Linux 6.7) and UDP
// never, and a worker has no network namespace of its own, so without this
// a bundle could send UDP anywhere, and before ABI 4 fetch a cloud
// instance's credentials from 169.254.169.254. An allowlist, not the IP
// families alone: vsock reaches a virtual machine's host, and other
// families reach other networks (AF_SMC through a TCP socket of the
// kernel's own, which Landlock's TCP rule does not check). Unix sockets
// carry the CUDA driver's and MPS's traffic (and the worker's own
// channels, made by the server); netlink is kept as nothing shows that the
// CUDA driver does without it, and it reaches this kernel, not another
// host. io_uring_setup fails with ENOSYS, as on a kernel without io_uring:
// a ring makes sockets without socket(2) (IORING_OP_SOCKET); with no ring
// to be had, io_uring_enter and io_uring_register have nothing to act on.
// System V IPC's shmget, shmat, msgget and semget, and the keyrings'
// add_key, keyctl and request_key, fail with ENOSYS, as on a kernel built
// without them: their objects are the node's, not the worker's (a segment
// outlives its worker and the server, outside its memory group, and
// workers of every tenant share the uid's keyring), and nothing a
// function needs makes them.
// amd64 and arm64 have no socketcall(2); i386's, by int 0x80 on amd64, is
// refused with every call of another architecture.
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
		lPrio   = 20
		lPgrp   = 26
		lSelf   = 29
		lClone  = 31
		lFamily = 33
		lPrctl  = 36
		lOK     = 40
		lNo     = 41
		lNoSys  = 42
	)
	// to is the jump offset from instruction at to label.
	to := func(at, label int) uint8 { return uint8(label - at - 1) }
	return []unix.SockFilter{
		0: {Code: ld, K: seccompArch},
		1: {Code: jeq, K: arch, Jt: 0, Jf: to(1, lNo)},
		2: {Code: ld, K: seccompNR},
		3: {Code: jge, K: x32Bit, Jt: to(3, lNo), Jf: 0},
		4: {Code: jeq, K: unix.SYS_CLONE, Jt: to(4, lClone), Jf: 0},
		5: {Code: jeq, K: unix.SYS_CLONE3, Jt: to(5, lNoSys), Jf: 0},
		6: {Code: jeq, K: unix.SYS_SOCKET, Jt: to(6, lFamily), Jf: 0},
		7: {Code: jeq, K: unix.SYS_SOCKETPAIR, Jt: to(7, lFamily), Jf: 0},
		8: {Code: jeq, K: unix.SYS_IO_URING_SETUP, Jt: to(8, lNoSys), Jf: 0},
		// System V IPC objects and the kernel's keyrings belong to the
		// node (its IPC namespace, the uid all workers share), not to the
		// worker: a segment or a key outlives its function and the
		// server, outside any memory group, and another tenant's worker
		// can read it (a review's probe did both). Refused as a kernel
		// built without them refuses them, which libraries expect.
		9:      {Code: jeq, K: unix.SYS_SHMGET, Jt: to(9, lNoSys), Jf: 0},
		10:     {Code: jeq, K: unix.SYS_SHMAT, Jt: to(10, lNoSys), Jf: 0},
		11:     {Code: jeq, K: unix.SYS_MSGGET, Jt: to(11, lNoSys), Jf: 0},
		12:     {Code: jeq, K: unix.SYS_SEMGET, Jt: to(12, lNoSys), Jf: 0},
		13:     {Code: jeq, K: unix.SYS_ADD_KEY, Jt: to(13, lNoSys), Jf: 0},
		14:     {Code: jeq, K: unix.SYS_KEYCTL, Jt: to(14, lNoSys), Jf: 0},
		15:     {Code: jeq, K: unix.SYS_REQUEST_KEY, Jt: to(15, lNoSys), Jf: 0},
		16:     {Code: jeq, K: unix.SYS_PRCTL, Jt: to(16, lPrctl), Jf: 0},
		17:     {Code: jeq, K: unix.SYS_PRLIMIT64, Jt: 0, Jf: to(17, lPrio)},
		18:     {Code: ld, K: seccompArg0},
		19:     {Code: ja, K: uint32(to(19, lSelf))},
		lPrio:  {Code: jeq, K: unix.SYS_SETPRIORITY, Jt: 0, Jf: to(lPrio, lOK)},
		21:     {Code: ld, K: seccompArg0}, // which
		22:     {Code: jeq, K: unix.PRIO_PGRP, Jt: to(22, lPgrp), Jf: 0},
		23:     {Code: jeq, K: unix.PRIO_PROCESS, Jt: 0, Jf: to(23, lNo)},
		24:     {Code: ld, K: seccompArg1}, // who
		25:     {Code: ja, K: uint32(to(25, lSelf))},
		lPgrp:  {Code: ld, K: seccompArg1},
		27:     {Code: jeq, K: 0, Jt: to(27, lOK), Jf: 0},
		28:     {Code: jeq, K: pgrp, Jt: to(28, lOK), Jf: to(28, lNo)},
		lSelf:  {Code: jeq, K: 0, Jt: to(lSelf, lOK), Jf: 0},
		30:     {Code: jeq, K: pid, Jt: to(30, lOK), Jf: to(30, lNo)},
		lClone: {Code: ld, K: seccompArg0}, // flags, on amd64 and arm64
		32:     {Code: jset, K: unix.CLONE_PARENT, Jt: to(32, lNo), Jf: to(32, lOK)},
		// socket's and socketpair's domain: an int, so the kernel reads
		// the argument's low 32 bits, as this does.
		lFamily: {Code: ld, K: seccompArg0},
		34:      {Code: jeq, K: unix.AF_UNIX, Jt: to(34, lOK), Jf: 0},
		35:      {Code: jeq, K: unix.AF_NETLINK, Jt: to(35, lOK), Jf: to(35, lNo)},
		// prctl's option (an int) and, for PR_SET_DUMPABLE, its value: the
		// kernel takes only 0 and 1 there, so its low 32 bits say which.
		lPrctl: {Code: ld, K: seccompArg0},
		37:     {Code: jeq, K: unix.PR_SET_DUMPABLE, Jt: 0, Jf: to(37, lOK)},
		38:     {Code: ld, K: seccompArg1},
		39:     {Code: jeq, K: 0, Jt: to(39, lOK), Jf: to(39, lNo)},
		lOK:    {Code: ret, K: allow},
		lNo:    {Code: ret, K: deny},
		lNoSys: {Code: ret, K: nosys},
	}
}
