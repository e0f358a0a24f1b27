package forkthread

import (
	"errors"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// A child whose death signal is armed survives the end of the thread that
// asked for its start; after a plain cmd.Start from that thread it does
// not (the control: the test can fail).
func TestChildOutlivesCallersThread(t *testing.T) {
	for _, tc := range []struct {
		name     string
		start    func(*exec.Cmd) error
		killedBy syscall.Signal // the signal the child ends by
	}{
		{"plain start", (*exec.Cmd).Start, syscall.SIGKILL}, // its death signal
		{"forkthread.Start", Start, syscall.SIGTERM},        // the test's own
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command("sleep", "60")
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			type started struct {
				tid int
				err error
			}
			c := make(chan started)
			held := make(chan struct{})
			defer close(held)
			var s started
			for s.tid == 0 {
				go func() {
					runtime.LockOSThread()
					if syscall.Gettid() == os.Getpid() {
						// The runtime never ends the main thread: keep
						// it busy and try again elsewhere.
						c <- started{}
						<-held
						return
					}
					// Locked and returning without unlocking: Go ends
					// the thread.
					c <- started{syscall.Gettid(), tc.start(cmd)}
				}()
				if s = <-c; s.err != nil {
					t.Fatal(s.err)
				}
			}
			// The kernel sends the death signal as the thread exits,
			// before the thread leaves /proc/self/task: wait for that.
			task := "/proc/self/task/" + strconv.Itoa(s.tid)
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
				if _, err := os.Stat(task); errors.Is(err, os.ErrNotExist) {
					break
				}
				if time.Now().After(deadline) {
					cmd.Process.Kill()
					cmd.Wait()
					t.Fatal("the locked thread did not end")
				}
			}
			// A SIGKILL already sent wins over this one.
			cmd.Process.Signal(syscall.SIGTERM)
			cmd.Wait()
			ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
			if !ws.Signaled() || ws.Signal() != tc.killedBy {
				t.Fatalf("child ended with %v, want killed by %v", cmd.ProcessState, tc.killedBy)
			}
		})
	}
}
