package engine

import (
	"context"
	"testing"
	"time"

	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/sched"
)

// panicky is an instance whose run panics (a bug in a device's Go code).
type panicky struct{}

func (panicky) Run(*device.Run) error { panic("a device bug") }
func (panicky) DeviceBytes() int64    { return 0 }
func (panicky) Close()                {}

// A run that panics between its admission and its end gives its slot back
// as the panic goes by (net/http recovers a handler's panic and the server
// goes on): the slot was held until the request's deadline, minutes, and
// with no deadline for ever.
func TestRunThatPanicsGivesItsSlotBack(t *testing.T) {
	s := sched.New(sched.Config{MaxRuns: 1})
	f, other := s.Flow("f"), s.Flow("other")
	in := &instance{inst: panicky{}, dev: &placement{flow: f}}
	p := &pool{}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the run's panic did not go on up")
			}
		}()
		p.runOn(context.Background(), in, &device.Run{}, time.Now(), time.Now().Add(time.Hour), nil)
	}()
	tk, wait, err := other.Admit(context.Background(), time.Now().Add(2*time.Second), nil)
	if err != nil || wait != 0 {
		t.Fatalf("the next run on the one slot: waited %v, %v: the panicked run still holds it", wait, err)
	}
	tk.Done()
}
