package contain

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ioprio_set's which (IOPRIO_WHO_*) and values (class << 13 | level):
// golang.org/x/sys names none of them.
const (
	ioprioWhoPgrp = 2
	ioprioWhoUser = 3
	ioprioBE7     = 2<<13 | 7 // best effort, lowest level
	ioprioIdle    = 3 << 13
	ioprioBad     = 7 << 13 // no such class: EINVAL, before any process is looked for
)

// schedCalls are childReach's calls of the scheduler's and the I/O
// scheduler's setters, on the child itself and on other (a process of its
// uid), each as it would slow other: into SCHED_IDLE, to nice 19, onto
// CPU 0 alone, into the idle I/O class. On itself they change nothing it
// needs (SCHED_BATCH, its own CPUs, best effort I/O).
func schedCalls(other int) []reachCall {
	var mine, cpu0 unix.CPUSet
	if err := unix.SchedGetaffinity(0, &mine); err != nil {
		die("sched_getaffinity: %v", err)
	}
	cpu0.Set(0)
	return []reachCall{
		{"sched-self-0", schedSet(0, unix.SCHED_BATCH)},
		{"sched-self-pid", schedSet(os.Getpid(), unix.SCHED_BATCH)},
		{"schedattr-self-0", func() error { return unix.SchedSetAttr(0, &unix.SchedAttr{Policy: unix.SCHED_BATCH}, 0) }},
		{"schedattr-other", func() error { return unix.SchedSetAttr(other, &unix.SchedAttr{Policy: unix.SCHED_NORMAL, Nice: 19}, 0) }},
		{"sched-other", schedSet(other, unix.SCHED_IDLE)},
		{"sched-other-high-bits", schedSet(1<<32|other, unix.SCHED_IDLE)},
		// No parameters: the kernel's EINVAL, where the filter lets it by.
		{"schedparam-other", sysErr(unix.SYS_SCHED_SETPARAM, uintptr(other), 0, 0)},
		{"affinity-self-0", func() error { return unix.SchedSetaffinity(0, &mine) }},
		{"affinity-other", func() error { return unix.SchedSetaffinity(other, &cpu0) }},
		{"ioprio-self-0", sysErr(unix.SYS_IOPRIO_SET, ioprioWhoProcess, 0, ioprioBE7)},
		{"ioprio-self-pid", sysErr(unix.SYS_IOPRIO_SET, ioprioWhoProcess, uintptr(os.Getpid()), ioprioBE7)},
		{"ioprio-other", sysErr(unix.SYS_IOPRIO_SET, ioprioWhoProcess, uintptr(other), ioprioIdle)},
		// A class the kernel refuses: without the filter, no process
		// of the uid or group changes either.
		{"ioprio-user", sysErr(unix.SYS_IOPRIO_SET, ioprioWhoUser, 0, ioprioBad)},
		{"ioprio-pgrp", sysErr(unix.SYS_IOPRIO_SET, ioprioWhoPgrp, 0, ioprioBad)},
	}
}

// schedSet is sched_setscheduler(pid, policy) at priority 0.
func schedSet(pid, policy int) func() error {
	return func() error {
		var prio int32
		_, _, e := unix.Syscall(unix.SYS_SCHED_SETSCHEDULER, uintptr(pid), uintptr(policy), uintptr(unsafe.Pointer(&prio)))
		if e != 0 {
			return e
		}
		return nil
	}
}

// schedState is what the scheduler calls of schedCalls would change in
// process pid: its policy, nice level, CPUs and I/O priority.
func schedState(pid int) (string, error) {
	attr, err := unix.SchedGetAttr(pid, 0)
	if err != nil {
		return "", fmt.Errorf("sched_getattr(%d): %w", pid, err)
	}
	var cpus unix.CPUSet
	if err := unix.SchedGetaffinity(pid, &cpus); err != nil {
		return "", fmt.Errorf("sched_getaffinity(%d): %w", pid, err)
	}
	io, _, e := unix.Syscall(unix.SYS_IOPRIO_GET, ioprioWhoProcess, uintptr(pid), 0)
	if e != 0 {
		return "", fmt.Errorf("ioprio_get(%d): %w", pid, e)
	}
	return fmt.Sprintf("policy %d nice %d cpus %v ioprio %#x", attr.Policy, attr.Nice, cpus, io), nil
}
