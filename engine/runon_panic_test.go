package engine

import (
	"context"
	"testing"
	"time"

	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/sched"
)

// panicky is an instance whose run panics (a bug in a device's Go code);
// it records its Close.
type panicky struct{ closed *bool }

func (panicky) Run(*device.Run) error { panic("a device bug") }
func (panicky) DeviceBytes() int64    { return 0 }
func (p panicky) Close()              { *p.closed = true }

// A run that panics between its admission and its end gives back what it
// held as the panic goes by, on its way to the transport that recovers it
// (a 500): its slot, which was held until the request's deadline, minutes,
// and with no deadline for ever; and its instance, closed and out of the
// pool, which was never put back: it stayed counted among the pool's
// instances (busy for ever, the version never idle enough to unload) and
// its memory and its worker's copy of it were never freed. Put back idle,
// it would serve the next request in whatever state the panic left it.
func TestRunThatPanicsGivesItsSlotAndInstanceBack(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sched bool
	}{{"scheduled", true}, {"no scheduler", false}} {
		t.Run(tc.name, func(t *testing.T) {
			s := sched.New(sched.Config{MaxRuns: 1})
			f, other := s.Flow("f"), s.Flow("other")
			closed := false
			in := &instance{inst: panicky{&closed}, dev: &placement{}}
			if tc.sched {
				in.dev.flow = f
			}
			p := &pool{live: 1} // in, taken for the run
			func() {
				defer func() {
					if recover() == nil {
						t.Fatal("the run's panic did not go on up")
					}
				}()
				p.runOn(context.Background(), in, &device.Run{}, time.Now(), time.Now().Add(time.Hour), nil, nil)
			}()
			if live, _ := p.instances(); !closed || live != 0 || len(p.idle) != 0 {
				t.Errorf("after the panic: instance closed %v, the pool's instances %d (idle %d), want closed and none", closed, live, len(p.idle))
			}
			if !tc.sched {
				return
			}
			tk, wait, err := other.Admit(context.Background(), time.Now().Add(2*time.Second), nil)
			if err != nil || wait != 0 {
				t.Fatalf("the next run on the one slot: waited %v, %v: the panicked run still holds it", wait, err)
			}
			tk.Done()
		})
	}
}
