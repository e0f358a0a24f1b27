package ioshare

import (
	"errors"
	"fmt"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"github.com/plover-run/plover/nicelevel"
)

// NiceLevels weighs a thread by its nice level (a nice level is a
// thread's on Linux). Light, where set, is the EEVDF slice the server's
// threads run with (package worker's CPUGroups.LightSlice): a thread
// moving a piece takes the kernel's default slice with the function's
// level, as that function's worker has, and Light back with Home, the
// server's level, while Sliced says the slices are still in force (the
// weights may turn off). A thread moving a flood's bytes with the
// server's short slice would preempt a light function's threads as they
// do it (beside 8 clients of 4 MB vecadd in a pod, the light function's
// p99 rose by a fifth to two fifths).
type NiceLevels struct {
	Light  time.Duration
	Home   int
	Sliced func() bool
}

// SlicedNiceLevels is NiceLevels for a server whose threads run with
// slice light while sliced says so: its level read from the calling
// thread.
func SlicedNiceLevels(light time.Duration, sliced func() bool) (NiceLevels, error) {
	a, err := nicelevel.Thread(0)
	if err != nil {
		return NiceLevels{}, err
	}
	return NiceLevels{Light: light, Home: a.Nice, Sliced: sliced}, nil
}

// Set sets the calling thread's nice level, and with Light its slice.
func (l NiceLevels) Set(n int) error {
	if l.Light == 0 {
		return unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), n)
	}
	slice := time.Duration(0) // the default
	if n == l.Home && (l.Sliced == nil || l.Sliced()) {
		slice = l.Light
	}
	return nicelevel.SetThread(0, n, slice)
}

// Base is the nice level of this process's threads, and whether it may
// take a thread's level back to it once it raised it (nicelevel.Probe):
// without, a thread that moved one piece niced would stay so.
func (NiceLevels) Base() (int, bool) { return nicelevel.Probe() }

// nice moves the calling goroutine's thread to level n for a piece
// (Config.Threads), if pieces may move niced and fewer threads than the Go
// scheduler has Ps less one are niced now (a niced thread the kernel
// leaves waiting still holds its P: the others must not all wait on such
// threads). With one P, none is: its thread waiting at a flood's level
// would hold up every goroutine of the server. It reports whether it
// did; unnice undoes it.
func (s *Shares) nice(n int) bool {
	if n <= s.base || !s.niceOK.Load() || (s.cfg.Weighing != nil && !s.cfg.Weighing()) {
		return false
	}
	if s.niced.Add(1) > int32(runtime.GOMAXPROCS(0)-1) {
		s.niced.Add(-1)
		return false
	}
	runtime.LockOSThread()
	if err := s.setThread(n); err != nil {
		s.niced.Add(-1)
		if errors.Is(err, errSetPanicked) {
			// Its level is unknown: the thread stays the goroutine's,
			// as after a failed unnice.
			s.stopNicing(err)
			return false
		}
		runtime.UnlockOSThread()
		return false
	}
	return true
}

// unnice takes the thread back to the server's level. Where that fails
// (it did not at start: a group removed under the server, say) the
// goroutine keeps its thread, rather than have others run at the light
// level on it (Go ends the thread with the goroutine), and the error is
// returned for stopNicing, once the turn has ended (a logger that panics
// must not keep the turn's slot).
func (s *Shares) unnice() error {
	s.niced.Add(-1)
	if err := s.setThread(s.base); err != nil {
		s.niceOK.Store(false)
		return err
	}
	runtime.UnlockOSThread()
	return nil
}

// errSetPanicked marks a Config.Threads.Set that panicked.
var errSetPanicked = errors.New("ioshare: moving a thread's nice level panicked")

// setThread is Config.Threads.Set with a panic made an error: the turn
// that called it must still end, and give its slot and its niced thread
// back (a panic in Set from Done would keep both for good).
func (s *Shares) setThread(n int) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("%w: level %d: %v", errSetPanicked, n, v)
		}
	}()
	return s.cfg.Threads.Set(n)
}

// stopNicing turns the nice levels off after a thread's level could not be
// set, and logs it once.
func (s *Shares) stopNicing(err error) {
	s.niceOK.Store(false)
	if s.cfg.Log != nil && !s.lostLogged.Swap(true) {
		s.cfg.Log.Warn("the server's I/O no longer moves at its functions' CPU weights: a thread's nice level could not be set", "error", err)
	}
}
