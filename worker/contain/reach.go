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
// limits, nice level, scheduling or I/O priority: prlimit64 and the
// scheduler's setters (selfCalls) only on itself (pid 0 or its own pid),
// ioprio_set likewise and only for a process (IOPRIO_WHO_PROCESS),
// setpriority only on itself (PRIO_PROCESS 0 or its own pid) or its own
// process group (PRIO_PGRP 0 or its own), never on a whole user
// (PRIO_USER, IOPRIO_WHO_USER). The kernel allows them all without a
// capability on any process of the same uid (but for prlimit64, only one
// that holds no capability the caller lacks), and neither Landlock nor
// the signal scope sees them: workers sharing --worker-user, with no PID
// namespace to hide one from another, could set another's RLIMIT_CPU to
// 1 s (the kernel kills it by SIGXCPU once it used that), its
// RLIMIT_NOFILE or RLIMIT_NPROC to 0, its nice level to 19, its threads
// to SCHED_IDLE or one CPU; a worker of a server's own uid the server's,
// which stays so after the worker is gone. Refused calls fail with EPERM.
// A thread's call by its own tid is refused too (a filter cannot tell a
// tid of the process from another process's pid); the server sets the
// workers' levels from outside.
//
// It also refuses clone with CLONE_PARENT (EPERM): the child would be the
// server's, outside its worker's tree, where the server's nice levels and
// the light boost's count of the worker's CPU do not look (it is still
// ended with its worker, a stray). clone3's flags are in memory, which a
// filter cannot read, so clone3 fails with ENOSYS, on which glibc (its
// pthread_create, posix_spawn) falls back to clone; Go uses clone.
//
// It refuses unshare and setns outright, and clone with any of
// cloneNamespaces (EPERM): a user namespace of its own gives a process
// every capability there (a review's probe: CapEff 000001ffffffffff
// after unshare(CLONE_NEWUSER) in a worker's child), and with a network
// namespace of its own CAP_NET_ADMIN over it, which opens the kernel's
// nf_tables, tc, xfrm and rtnetlink code to it (an nf_tables batch was
// acked): the classic way from an unprivileged process to the kernel's
// bugs (CVE-2024-1086). Nothing in the worker needs them after Enter:
// the setns and the namespaces of a worker's start (Spawner.Start) are
// the server's, made before the worker's exec, and the CUDA driver makes
// none. unshare without a namespace's flag (CLONE_FILES, CLONE_FS) is
// refused too: nothing a function needs does it, and one comparison
// covers every flag, those of kernels to come included.
//
// It refuses prctl(PR_SET_CHILD_SUBREAPER) (EPERM), whatever the value:
// Enter made the worker a subreaper before this filter (with subreapers),
// and a bundle that cleared the flag had what it orphaned (a double fork's
// grandchild) go to the next subreaper up, the server, out of its
// worker's tree as a CLONE_PARENT child is, for as long as the worker
// lived. Setting it gives a bundle's process nothing it needs, and one
// comparison (the option) refuses both.
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
// It refuses setsid (EPERM): where the server weighs workers by nice
// level and the kernel schedules sessions as groups (autogroups), a new
// session is a new group at nice 0, the server's weight, about 9 times a
// default function's worker's, until the server finds it (at the
// worker's next change, or the light boost's next window): a tenant whose
// children each made a session of their own took 0.76-1.45 CPUs where an
// honest one beside it took 0.61 (a review's probe). The worker already
// leads a session of its own (Spawner.Start) and nothing in it, nor in the
// CUDA driver (whose helpers are threads of the worker), makes another; a
// bundle's daemon can still leave its worker's process group (setpgid),
// which is no scheduling group.
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
// System V IPC, POSIX message queues and the keyrings fail with ENOSYS
// too, as on a kernel built without them (nosysCalls): their objects are
// the node's, not the worker's, and nothing a function needs makes them.
// amd64 and arm64 have no socketcall(2); i386's, by int 0x80 on amd64, is
// refused with every call of another architecture.
//
// It must run after Enter (which sets no_new_privs, without which the
// kernel refuses the filter, and the subreaper flag, which the filter
// then keeps from being set), before tenant code. It
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
		allow = unix.SECCOMP_RET_ALLOW
		deny  = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
		nosys = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
	)
	var a bpfAsm
	a.ld(seccompArch)
	a.jeq(arch, "", "no")
	a.ld(seccompNR)
	a.jge(x32Bit, "no", "")
	a.jeq(unix.SYS_CLONE, "clone", "")
	a.jeq(unix.SYS_SOCKET, "family", "")
	a.jeq(unix.SYS_SOCKETPAIR, "family", "")
	for _, nr := range nosysCalls {
		a.jeq(nr, "nosys", "")
	}
	a.jeq(unix.SYS_PRCTL, "prctl", "")
	a.jeq(unix.SYS_SETSID, "no", "")
	a.jeq(unix.SYS_UNSHARE, "no", "")
	a.jeq(unix.SYS_SETNS, "no", "")
	a.jeq(unix.SYS_SETPRIORITY, "prio", "")
	a.jeq(unix.SYS_IOPRIO_SET, "ioprio", "")
	for _, nr := range selfCalls {
		a.jeq(nr, "arg0", "")
	}
	a.ja("ok")

	a.label("arg0") // a pid_t, whose low 32 bits the kernel reads
	a.ld(seccompArg0)
	a.ja("self")

	// ioprio_set's which and who, ints: a process alone, never a whole
	// process group or uid (IOPRIO_WHO_PGRP, IOPRIO_WHO_USER).
	a.label("ioprio")
	a.ld(seccompArg0)
	a.jeq(ioprioWhoProcess, "", "no")
	a.ld(seccompArg1)
	a.ja("self")

	a.label("prio")
	a.ld(seccompArg0) // which
	a.jeq(unix.PRIO_PGRP, "pgrp", "")
	a.jeq(unix.PRIO_PROCESS, "", "no")
	a.ld(seccompArg1) // who
	a.ja("self")

	a.label("pgrp")
	a.ld(seccompArg1)
	a.jeq(0, "ok", "")
	a.jeq(pgrp, "ok", "no")

	a.label("self")
	a.jeq(0, "ok", "")
	a.jeq(pid, "ok", "no")

	// clone's flags, on amd64 and arm64: the kernel reads their low 32
	// bits, as this does.
	a.label("clone")
	a.ld(seccompArg0)
	a.jset(unix.CLONE_PARENT|cloneNamespaces, "no", "ok")

	// socket's and socketpair's domain, an int, so the kernel reads the
	// argument's low 32 bits, as this does.
	a.label("family")
	a.ld(seccompArg0)
	a.jeq(unix.AF_UNIX, "ok", "")
	a.jeq(unix.AF_NETLINK, "ok", "no")

	// prctl's option (an int) and, for PR_SET_DUMPABLE, its value: the
	// kernel takes only 0 and 1 there, so its low 32 bits say which.
	a.label("prctl")
	a.ld(seccompArg0)
	a.jeq(unix.PR_SET_CHILD_SUBREAPER, "no", "")
	a.jeq(unix.PR_SET_DUMPABLE, "", "ok")
	a.ld(seccompArg1)
	a.jeq(0, "ok", "no")

	a.label("ok")
	a.ret(allow)
	a.label("no")
	a.ret(deny)
	a.label("nosys")
	a.ret(nosys)
	return a.assemble()
}

// selfCalls take a pid (a tid: they act on one thread) as their first
// argument, and are allowed only on the caller (0) or the worker's pid:
// each changes what the kernel lets any process of the same uid change
// in another (the scheduler's setters: one holding no capability the
// caller lacks), which neither Landlock nor the signal scope sees, and
// which outlives the caller.
// prlimit64: another's limits (RLIMIT_CPU 1 s, a kill by SIGXCPU). The
// scheduler's setters: another thread's policy (SCHED_IDLE), its nice
// level (sched_setattr's sched_nice, around setpriority's rule), its
// real-time priority (down: sched_setparam) or the CPUs it may run on.
// Without a PID namespace the server is among them where workers have
// its uid (pods: getppid() names it), and other workers of --worker-user
// are. Refusing the server's pid alone would not do: the calls act on
// one thread, and the server's threads are listed in /proc/<server>/task,
// each a tid a filter cannot know.
//
// The cost: a thread must name itself as 0 (sched_setaffinity(0, ...)
// passes); by its tid it is refused, but for the worker's main thread,
// whose tid is the worker's pid. glibc's pthread_setaffinity_np and
// pthread_setschedparam pass a thread's tid, and so does pthread_create
// for a thread made with an affinity attribute, which then fails. Nothing
// in the worker's own code makes these calls; whether the CUDA driver
// does by tid is not yet seen on a GPU (a refusal is EPERM, not a kill).
var selfCalls = []uint32{
	unix.SYS_PRLIMIT64,
	unix.SYS_SCHED_SETSCHEDULER, unix.SYS_SCHED_SETPARAM, unix.SYS_SCHED_SETATTR, unix.SYS_SCHED_SETAFFINITY,
}

// cloneNamespaces are clone's flags that make a namespace for the child.
// CLONE_NEWTIME is not among them: its bit (0x80) is in clone's CSIGNAL
// byte, which the kernel takes as the child's exit signal, never as a
// flag, so clone cannot make a time namespace (a child of clone(0x80 |
// SIGCHLD) is in its parent's); only unshare and clone3 can, both refused.
const cloneNamespaces = unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWNET |
	unix.CLONE_NEWIPC | unix.CLONE_NEWUTS | unix.CLONE_NEWCGROUP

// ioprioWhoProcess is ioprio_set's IOPRIO_WHO_PROCESS (linux/ioprio.h),
// which golang.org/x/sys does not name.
const ioprioWhoProcess = 1

// nosysCalls fail with ENOSYS, as on a kernel without them. clone3: glibc
// falls back to clone, whose flags the filter can read (clone3's are in
// memory). io_uring_setup: a ring makes sockets without socket(2)
// (IORING_OP_SOCKET). System V IPC and POSIX message queues: their
// objects belong to the node (its IPC namespace), not to the worker: a
// segment or a queue outlives its worker and the server, outside any
// memory group, and a worker could use another's (the calls by id reach
// objects made by any process of the worker's uid); a review's probe left
// a segment that another tenant's worker read. The keyrings: every worker
// of --worker-user shares its keyring, a channel between tenants that
// outlives them.
var nosysCalls = []uint32{
	unix.SYS_CLONE3, unix.SYS_IO_URING_SETUP,
	unix.SYS_SHMGET, unix.SYS_SHMAT, unix.SYS_SHMCTL, unix.SYS_SHMDT,
	unix.SYS_MSGGET, unix.SYS_MSGSND, unix.SYS_MSGRCV, unix.SYS_MSGCTL,
	unix.SYS_SEMGET, unix.SYS_SEMOP, unix.SYS_SEMTIMEDOP, unix.SYS_SEMCTL,
	unix.SYS_MQ_OPEN, unix.SYS_MQ_UNLINK, unix.SYS_MQ_TIMEDSEND, unix.SYS_MQ_TIMEDRECEIVE, unix.SYS_MQ_NOTIFY, unix.SYS_MQ_GETSETATTR,
	unix.SYS_ADD_KEY, unix.SYS_KEYCTL, unix.SYS_REQUEST_KEY,
}
