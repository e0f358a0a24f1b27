package minio

import "syscall"

// A test binary killed by a timeout or a crash never runs its cleanups;
// Pdeathsig makes the kernel take the MinIO child down with it.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
