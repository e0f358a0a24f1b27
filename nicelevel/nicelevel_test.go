package nicelevel

import (
	"fmt"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// With CAP_SYS_NICE a thread may take its level back down from any level,
// the highest (19) too, and Try leaves it where it was.
func TestTryAtEveryLevel(t *testing.T) {
	if !HasCap(unix.CAP_SYS_NICE) {
		t.Skip("needs CAP_SYS_NICE")
	}
	for _, level := range []int{0, 10, 18, 19} {
		c := make(chan string)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
			if err := unix.Setpriority(unix.PRIO_PROCESS, 0, level); err != nil {
				c <- err.Error()
				return
			}
			got, lower := Try()
			raw, _ := unix.Getpriority(unix.PRIO_PROCESS, 0)
			switch {
			case got != level || !lower:
				c <- fmt.Sprintf("Try() = %d, %v; want %d, true", got, lower, level)
			case 20-raw != level:
				c <- fmt.Sprintf("left the thread at %d", 20-raw)
			default:
				c <- ""
			}
		}()
		if msg := <-c; msg != "" {
			t.Errorf("at nice %d: %s", level, msg)
		}
	}
}
