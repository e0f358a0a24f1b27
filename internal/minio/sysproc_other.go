//go:build !linux

package minio

import "syscall"

func sysProcAttr() *syscall.SysProcAttr { return nil }
