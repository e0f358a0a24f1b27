package engine_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
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
	nextNotBehind(t, e, "late", t0, "the first began", "run past every deadline")
}

// nextNotBehind sends name the next request and fails unless it is
// answered within 1.2 s of t0 (when what happened): not behind the first
// request's 1.5 s chain, run for no one (how).
func nextNotBehind(t *testing.T, e *engine.Engine, name string, t0 time.Time, what, how string) {
	t.Helper()
	r := <-invokeAsync(e, name, item(2, 0), time.Now().Add(5*time.Second))
	if r.err != nil || r.value != 3 {
		t.Fatalf("the next request: %+v", r)
	}
	if el := time.Since(t0); el > 1200*time.Millisecond {
		t.Fatalf("the next request was answered %v after %s: it waited behind the first's 1.5 s chain, %s", el, what, how)
	}
}

// A batch whose every request gave up (here cancelled) while its instance
// was being made runs nothing once it has one: it held the only instance
// for its 1.5 s chain, for nobody, and the next request waited behind it.
func TestBatchWhoseRequestsAllGaveUpRunsNothing(t *testing.T) {
	m := testkit.BatchManifest("gaveup", 4, "")
	m.MaxInstances = 1
	mark := filepath.Join(t.TempDir(), "init")
	dir := batchBundle(t, m, "-DSLOW_INIT_MS=500", `-DINIT_MARK="`+mark+`"`)
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, dir)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := make(chan error, 1)
	go func() {
		first <- e.Invoke(ctx, "gaveup", &call.Request{Input: item(1, 1500), Deadline: time.Now().Add(10 * time.Second)})
	}()
	// Its run is making the instance (plover_instance_init has begun).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, err := os.Stat(mark); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no instance was ever made for the first request")
		}
	}
	cancel()
	t0 := time.Now()
	if err := <-first; errdefs.KindOf(err) != errdefs.KindUnavailable {
		t.Fatalf("the cancelled request: %v", err)
	}
	nextNotBehind(t, e, "gaveup", t0, "the first was cancelled", "run for nobody")
}

// A free instance holds a partial batch for company (max_delay) only while
// that costs no request in it its deadline: a request whose deadline comes
// before the hold would end runs at once. It was held until its 504 with
// an instance free.
func TestBatchHoldEndsBeforeARequestsDeadline(t *testing.T) {
	m := testkit.BatchManifest("hold", 16, "500ms")
	m.MaxInstances = 2
	e := batchEngine(t, m)
	busy := invokeAsync(e, "hold", item(1, 1500), time.Time{}) // a run in flight: a free instance holds
	waitBusy(t, e, "hold", 1)
	r := <-invokeAsync(e, "hold", item(2, 0), time.Now().Add(150*time.Millisecond))
	if r.err != nil || r.value != 3 {
		t.Fatalf("a request with a 150 ms deadline, an instance free, max_delay 500ms: value %d, err %v", r.value, r.err)
	}
	if r := <-busy; r.err != nil {
		t.Fatal(r.err)
	}
}

// A request held for company must still have time to run once the hold
// ends: with runs taking about 300 ms, one whose deadline is 100 ms past
// the hold's end runs at once and not after the hold (it then missed its
// deadline by 200 ms, held while an instance stood free).
func TestBatchHoldLeavesARequestTimeToRun(t *testing.T) {
	m := testkit.BatchManifest("hold", 16, "500ms")
	m.MaxInstances = 2
	e := batchEngine(t, m)
	for i := range 2 { // runs of 300 ms: what the batcher expects a run to take (the first a cold start)
		if r := <-invokeAsync(e, "hold", item(uint32(i), 300), time.Time{}); r.err != nil {
			t.Fatal(r.err)
		}
	}
	busy := invokeAsync(e, "hold", item(1, 1500), time.Time{}) // a run in flight: a free instance holds
	waitBusy(t, e, "hold", 1)
	r := <-invokeAsync(e, "hold", item(2, 300), time.Now().Add(600*time.Millisecond))
	if r.err != nil || r.value != 3 {
		t.Fatalf("a 300 ms request with a 600 ms deadline, an instance free, max_delay 500ms: value %d, err %v", r.value, r.err)
	}
	if r := <-busy; r.err != nil {
		t.Fatal(r.err)
	}
}

// A batch whose every request gave up (here cancelled) while its run
// waited for the device's scheduler runs nothing: it left the scheduler's
// queue as an unbatched request does, rather than holding its place behind
// another function's run and then running its chain, charged to the
// function, for nobody.
func TestBatchWhoseRequestsAllLeftWhileItWaitedForTheDeviceRunsNothing(t *testing.T) {
	e, mark, hog := batchBehindAHog(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	left := make(chan error, 1)
	go func() {
		left <- e.Invoke(ctx, "left", &call.Request{Input: item(2, 0), Deadline: time.Now().Add(10 * time.Second)})
	}()
	// Its run holds the instance and waits for the device.
	testkit.WaitFor(t, e, "left", "a run waiting for the device", testkit.Busy(1, 1))
	cancel()
	if err := <-left; errdefs.KindOf(err) != errdefs.KindUnavailable {
		t.Fatalf("the cancelled request: %v", err)
	}
	if err := <-hog; err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, e, "left", "its instance back", testkit.Busy(0, 0))
	if _, err := os.Stat(mark); err == nil {
		t.Fatal("the batch's chain ran after every request in it had left while it waited for the device")
	}
}

// A request whose goroutine panics while its batch waits for the device
// (here its transport's Gone check; the transport recovers such a panic
// and pools the request for another) is taken out of the batch as it
// leaves: the batch runs nothing for it and writes nothing into it. Left
// in, the run copied its answer into a request by then another's.
func TestBatchItemOfAPanickedRequestIsTakenBack(t *testing.T) {
	e, mark, hog := batchBehindAHog(t)
	req := &call.Request{Input: item(2, 0), Deadline: time.Now().Add(10 * time.Second)}
	waiting := make(chan struct{})
	req.Gone = func() bool {
		<-waiting // asked first while the batch waits for the device
		panic("the transport's Gone check")
	}
	panicked := make(chan any, 1)
	go func() {
		defer func() { panicked <- recover() }()
		e.Invoke(context.Background(), "left", req)
	}()
	testkit.WaitFor(t, e, "left", "a run waiting for the device", testkit.Busy(1, 1))
	close(waiting)
	if p := <-panicked; p == nil {
		t.Fatal("the request's goroutine did not panic")
	}
	req.Output = nil // as a transport's pool would reuse it
	if err := <-hog; err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, e, "left", "its instance back", testkit.Busy(0, 0))
	if _, err := os.Stat(mark); err == nil {
		t.Fatal("the batch's chain ran for a request whose goroutine had panicked out of it")
	}
	if req.Output != nil {
		t.Fatalf("the batch wrote %d bytes into a request whose goroutine had left it", len(req.Output))
	}
}

// batchBehindAHog is an engine of one device run at a time, running
// hog's 1.5 s chain, and a batching function "left" of one instance
// whose chain writes mark as it runs (removed after its first request),
// so that left's next batch waits for the device; hog says when its
// request ends.
func batchBehindAHog(t *testing.T) (e *engine.Engine, mark string, hog <-chan error) {
	t.Helper()
	e = testkit.Engine(t, engine.Config{Sched: engine.SchedConfig{MaxRuns: 1, NoReserve: true}})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Slow("hog", 1500), nil))
	m := testkit.BatchManifest("left", 4, "")
	m.MaxInstances = 1
	mark = filepath.Join(t.TempDir(), "ran")
	testkit.Deploy(t, e, batchBundle(t, m, `-DRUN_MARK="`+mark+`"`))
	if r := <-invokeAsync(e, "left", item(1, 0), time.Time{}); r.err != nil || r.value != 2 {
		t.Fatalf("first request: %+v", r)
	}
	if err := os.Remove(mark); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- e.Invoke(context.Background(), "hog", &call.Request{Input: []byte{1}}) }()
	testkit.WaitFor(t, e, "hog", "a run on the device", testkit.Busy(1, 0))
	return e, mark, done
}
