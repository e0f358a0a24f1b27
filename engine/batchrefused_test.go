package engine_test

import (
	"testing"
	"time"

	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
)

// A batching function's request that no run took (its queue full, or its
// deadline passed while it waited for a batch) was not dispatched: none of
// its time is Dispatch (the hand-over to the device and back), which a
// trace would show as a dispatch span. As an unbatched function's request
// that failed in its queue, it is timed all the same: what it spent after
// its resolve is its queue.
func TestBatchRefusedRequestHasNoDispatch(t *testing.T) {
	m := testkit.BatchManifest("rf", 4, "")
	m.MaxInstances, m.MaxQueue = 1, 2
	e := batchEngine(t, m)

	for _, tt := range []struct {
		name     string
		deadline time.Duration // 0: none
		fill     int           // requests queued first behind the busy run
		want     errdefs.Kind
	}{
		{"queue full", 0, 6, errdefs.KindBusy},
		{"deadline while waiting for a batch", 50 * time.Millisecond, 0, errdefs.KindTimeout},
	} {
		t.Run(tt.name, func(t *testing.T) {
			busy := invokeAsync(e, "rf", item(1, 400), time.Time{})
			waitBusy(t, e, "rf", 1)
			var waiting []chan batchResult
			for i := range tt.fill {
				waiting = append(waiting, invokeAsync(e, "rf", item(uint32(10+i), 0), time.Time{}))
			}
			waitQueued(t, e, "rf", tt.fill)
			var deadline time.Time
			if tt.deadline > 0 {
				deadline = time.Now().Add(tt.deadline)
			}
			r := <-invokeAsync(e, "rf", item(99, 0), deadline)
			if errdefs.KindOf(r.err) != tt.want {
				t.Fatalf("got %v, want %v", r.err, tt.want)
			}
			if tm := r.req.Timing; tm.Dispatch != 0 || tm.Total <= 0 || tm.Queue != tm.Total-tm.Resolve-tm.Load {
				t.Errorf("a request no run took has dispatch %v, queue %v of total %v (resolve %v, load %v), want no dispatch and the rest queue", tm.Dispatch, tm.Queue, tm.Total, tm.Resolve, tm.Load)
			}
			if tt.deadline > 0 && r.req.Timing.Queue < tt.deadline/2 {
				t.Errorf("queue %v for a request that waited out its %v deadline", r.req.Timing.Queue, tt.deadline)
			}
			if r := <-busy; r.err != nil {
				t.Fatal(r.err)
			}
			for _, ch := range waiting {
				if r := <-ch; r.err != nil {
					t.Fatal(r.err)
				}
			}
		})
	}
}
