package ioshare

import (
	"runtime"
	"testing"
	"time"

	"github.com/plover-run/plover/nicelevel"
)

// Where the server's threads run with a short slice, a thread moving a
// piece at a function's level runs with the kernel's default slice, as
// that function's worker does, and takes the short one back with the
// server's level: a thread moving a flood's bytes with the short slice
// preempted a light function's threads (its p99 beside a 4 MB flood in a
// pod rose by a fifth to two fifths). Without Light only the level moves.
func TestNiceLevelsMoveTheSliceWithTheLevel(t *testing.T) {
	def := nicelevel.DefaultSlice()
	if def == 0 {
		t.Skip("this kernel keeps no slice per thread (Linux 6.12 and later do)")
	}
	if _, lower := nicelevel.Probe(); !lower {
		t.Skip("a level taken back down takes CAP_SYS_NICE")
	}
	const light = 200 * time.Microsecond
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		home, err := nicelevel.Thread(0)
		if err != nil {
			t.Error(err)
			return
		}
		if err := nicelevel.SetThread(0, home.Nice, light); err != nil {
			t.Errorf("the thread's own slice: %v", err)
			return
		}
		sliced := true
		nl, err := SlicedNiceLevels(light, func() bool { return sliced })
		if err != nil {
			t.Error(err)
			return
		}
		for _, tc := range []struct {
			level int
			slice time.Duration
		}{{nl.Home + 7, def}, {nl.Home, light}, {nl.Home + 3, def}, {nl.Home, light}} {
			if err := nl.Set(tc.level); err != nil {
				t.Errorf("Set(%d): %v", tc.level, err)
				return
			}
			a, err := nicelevel.Thread(0)
			if err != nil || a.Nice != tc.level || a.Slice != tc.slice {
				t.Errorf("after Set(%d): nice %d, slice %v (%v); want nice %d, slice %v", tc.level, a.Nice, a.Slice, err, tc.level, tc.slice)
			}
		}
		// Once the slices are off (the weights turned off), back to the
		// server's level is back to the default slice.
		sliced = false
		if err := nl.Set(nl.Home + 1); err != nil {
			t.Error(err)
			return
		}
		if err := nl.Set(nl.Home); err != nil {
			t.Error(err)
			return
		}
		if a, _ := nicelevel.Thread(0); a.Slice != def {
			t.Errorf("slices off: back at the server's level with slice %v; want the default, %v", a.Slice, def)
		}
		if err := nicelevel.SetThread(0, nl.Home, light); err != nil {
			t.Error(err)
			return
		}
		// Without Light the slice stays as it is.
		if err := (NiceLevels{}).Set(nl.Home + 2); err != nil {
			t.Error(err)
			return
		}
		if a, _ := nicelevel.Thread(0); a.Slice != light || a.Nice != nl.Home+2 {
			t.Errorf("without Light: nice %d, slice %v; want nice %d, slice kept at 200µs", a.Nice, a.Slice, nl.Home+2)
		}
	}()
	<-done
}
