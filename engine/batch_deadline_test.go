package engine_test

import (
	"testing"
	"time"

	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
)

// A batch whose instance took longer to make than every request in it may
// wait runs nothing once it has one: with the device schedulers off (which
// would refuse it too) its 1.5 s chain held the only instance for nobody,
// and the next request waited behind it.
func TestBatchPastItsDeadlineRunsNothing(t *testing.T) {
	m := testkit.BatchManifest("late", 4, "")
	m.MaxInstances = 1
	dir := batchBundle(t, m, "-DSLOW_INIT_MS=400")
	e := testkit.Engine(t, engine.Config{Sched: engine.SchedConfig{Off: true}})
	testkit.Deploy(t, e, dir)
	t0 := time.Now()
	first := <-invokeAsync(e, "late", item(1, 1500), t0.Add(150*time.Millisecond))
	if first.err == nil {
		t.Fatalf("a request with a 150 ms deadline was answered after a 400 ms instance init: %+v", first)
	}
	r := <-invokeAsync(e, "late", item(2, 0), time.Now().Add(5*time.Second))
	if r.err != nil || r.value != 3 {
		t.Fatalf("the next request: %+v", r)
	}
	if el := time.Since(t0); el > 1200*time.Millisecond {
		t.Fatalf("the next request was answered %v after the first began: it waited behind the first's 1.5 s chain, run past every deadline", el)
	}
}
