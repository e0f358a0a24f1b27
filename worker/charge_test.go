package worker

import (
	"testing"
	"time"

	"github.com/plover-run/plover/device"
)

// A chain that computes on threads of its own is charged their CPU time:
// its run's device time (what its function is billed and its share is
// charged) is the worker process's CPU time over the run. On the calling
// thread's clock alone, a chain doing 80 ms of work on 4 threads was
// charged about 0, and could take the device from every other tenant.
func TestHelperThreadsAreChargedToTheirRun(t *testing.T) {
	d := newDevice(t, 1)
	p, m := loadHostile(t, d, "helpers")
	in := newInst(t, p, m)
	helpers, err := p.Entry("helpers")
	if err != nil {
		t.Fatal(err)
	}
	r := &device.Run{Input: []byte("x"), Output: make([]byte, m.OutBytes), TmpLen: m.TmpBytes, Chain: []device.Step{{Entry: helpers, Grid: 1, Block: 1}}}
	if err := in.Run(r); err != nil {
		t.Fatal(err)
	}
	const work = 4 * 20 * time.Millisecond
	if r.Timing.Busy < work*9/10 || r.Timing.Busy > work*3 {
		t.Fatalf("a run of %v of CPU on 4 helper threads was charged %v of device time", work, r.Timing.Busy)
	}
}
