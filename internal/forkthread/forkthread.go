// Package forkthread starts processes from one OS thread that never ends.
//
// A child's parent-death signal (Pdeathsig, PR_SET_PDEATHSIG) is sent when
// the thread that forked it ends, not its parent process; and Go ends a
// thread when a goroutine locked to it returns (a closed contain.Spawner's
// does), on a thread any goroutine may have forked from before it was
// locked. A child with a death signal started from an arbitrary thread
// can so be killed while its parent lives on. Starting it here cannot.
package forkthread

import (
	"os/exec"
	"runtime"
	"sync"
)

var thread = sync.OnceValue(func() chan<- func() {
	c := make(chan func())
	go func() {
		runtime.LockOSThread() // for good: the thread never ends
		for fn := range c {
			fn()
		}
	}()
	return c
})

// Start is cmd.Start on the thread.
func Start(cmd *exec.Cmd) error {
	done := make(chan error, 1)
	thread() <- func() { done <- cmd.Start() }
	return <-done
}
