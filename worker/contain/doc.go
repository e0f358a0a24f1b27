// Package contain holds the Linux containment primitives that keep a
// tenant's native code, running in a worker process, away from the
// server and from the rest of the machine.
//
// The server side keeps its own memory and environment out of reach
// (MakeNonDumpable), starts workers so that they die with it (Spawner)
// and can kill a worker together with anything it forked (KillGroup);
// with Contain, whatever a worker starts ends with the worker even when
// it left the worker's process group (a PID namespace per worker, else
// child subreapers: Containment), and a server ends what an earlier one
// of its data directory left running (EndLeftovers).
//
// The worker side, first thing after it starts and before any tenant
// code runs, makes itself the OOM killer's first choice and gives up
// privileges (Enter), takes a seccomp filter that keeps it off other
// processes' limits and nice levels, off the network and out of
// namespaces of its own, where it would hold capabilities
// (RestrictReach) and, once it knows which bundle it serves, confines its
// filesystem view with Landlock (RestrictFS).
//
// Every per-thread kernel attribute this package changes in the worker
// (capability sets, no_new_privs, the parent-death signal, the Landlock
// domain) is changed on every OS thread of the process, because Go
// moves goroutines between threads freely and a single unrestricted
// thread would be enough to escape. Credential changes go through the
// syscall package, which broadcasts them (through libc's setxid
// mechanism when cgo is linked); the rest goes through
// kernel.org/pub/linux/libs/security/libcap/psx, which runs a system
// call on each thread listed in /proc/self/task and loops until no new
// thread shows up. On kernels with Landlock ABI 8 or later go-landlock
// uses the kernel's own LANDLOCK_RESTRICT_SELF_TSYNC instead.
//
// The package is Linux-only.
package contain
