package engine_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
)

// RefuseQueued (the end of plover serve's --grace) fails at once the
// requests that have not started to run, wherever they wait: for one of
// their function's instances, for their turn on the device, for their
// batch; each a 503 that says the server is shutting down, with a
// Retry-After, to try another node. The run in progress goes on, and a
// request that comes after is refused, a slot free or not. They waited
// until their deadlines, and the process's exit cut them unanswered.
func TestRefuseQueuedFailsWhatHasNotStarted(t *testing.T) {
	slow := func(instances int) func(t *testing.T) string {
		return func(t *testing.T) string {
			m := testkit.Slow("fn", 1000)
			m.MaxInstances = instances
			return testkit.BundleDir(t, m, nil)
		}
	}
	for _, tc := range []struct {
		name   string
		sched  engine.SchedConfig
		bundle func(t *testing.T) string
		in     []byte // every request's: the first's run outlasts the refusal
		waited string // what the refused say they waited for
		late   string // and one that came after, refused before it waited
	}{
		{"for an instance", engine.SchedConfig{}, slow(1), []byte("abcdefgh"), "one of its 1 instances", "about to take one of its instances"},
		{"for the device", engine.SchedConfig{MaxRuns: 1, NoReserve: true}, slow(4), []byte("abcdefgh"), "its turn on", "about to take one of its instances"},
		{"for a batch", engine.SchedConfig{}, func(t *testing.T) string {
			m := testkit.BatchManifest("fn", 4, "")
			m.MaxInstances = 1
			return batchBundle(t, m)
		}, item(1, 1000), "its batch", "its batch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := testkit.Engine(t, engine.Config{Sched: tc.sched})
			testkit.Deploy(t, e, tc.bundle(t))
			ended := make(chan error, 3) // in the order they end
			start := func() {
				ch := invokeAsync(e, "fn", tc.in, time.Time{})
				go func() { ended <- (<-ch).err }()
			}
			start()
			waitInfo(t, e, "fn", "a request running", func(fi api.FunctionInfo) bool { return fi.Busy >= 1 })
			start()
			start()
			waitQueued(t, e, "fn", 2)
			if !e.RefuseQueued() {
				t.Error("RefuseQueued says no request was in the engine")
			}
			for range 2 {
				refused(t, <-ended, tc.waited)
			}
			if inFlight, _ := e.Unfinished(); inFlight != 1 {
				t.Errorf("%d requests in flight as the queued ones were refused, want the one running (a second's run)", inFlight)
			}
			if err := <-ended; err != nil {
				t.Errorf("the request running as the others were refused: %v", err)
			}
			refused(t, (<-invokeAsync(e, "fn", tc.in, time.Time{})).err, tc.late)
			if inFlight, n := e.Unfinished(); inFlight != 0 || n != 3 {
				t.Errorf("Unfinished: %d in flight, %d refused; want 0 and 3", inFlight, n)
			}
		})
	}
}

// refused fails the test unless err is a refusal by RefuseQueued of a
// request that waited for what.
func refused(t *testing.T, err error, what string) {
	t.Helper()
	if errdefs.KindOf(err) != errdefs.KindUnavailable || !strings.Contains(err.Error(), "shutting down") ||
		!strings.Contains(err.Error(), what) || errdefs.RetryAt(err).IsZero() {
		t.Errorf("a request that had not started: %v; want a 503 saying the server is shutting down (it waited for %s), with a time to retry", err, what)
	}
}

// A request waiting for another request's fetch of its bundle, or for its
// load of the function's program on a device, is refused by RefuseQueued
// as a request waiting for an instance is, and counted so; the request
// fetching or loading goes on. Both waited until their deadlines (or the
// other's end), and the process's exit cut them unanswered.
func TestRefuseQueuedFailsTheWaitsForAnothersLoad(t *testing.T) {
	for _, tc := range []struct {
		name string
		// node is an engine whose echo's first request holds its fetch
		// or load until its context ends or release; loading tells once
		// it does.
		node   func(t *testing.T) (e *engine.Engine, loading <-chan struct{}, release func())
		frame  string // where both requests are then: the holder and the waiter
		waited string
	}{
		{"for its bundle's fetch", func(t *testing.T) (*engine.Engine, <-chan struct{}, func()) {
			fetching := make(chan struct{}, 1)
			e := coldNode(t, func(fs objectstore.Store) objectstore.Store { return signallingStall{stallingBundles{fs}, fetching} })
			return e, fetching, func() {}
		}, "(*Engine).load(", "another request's fetch of its bundle"},
		{"for its program's load", func(t *testing.T) (*engine.Engine, <-chan struct{}, func()) {
			d := &holdLoads{Device: device.NewHost(0), loading: make(chan struct{}), release: make(chan struct{})}
			e := testkit.Engine(t, engine.Config{Devices: []device.Device{d}})
			m := testkit.Manifest("echo")
			m.MaxInstances = 2 // the second request has a slot of its own: it waits for the load alone
			testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
			return e, d.loading, func() { close(d.release) }
		}, "(*Engine).place(", "another request's load of it on"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, loading, release := tc.node(t)
			far := time.Now().Add(10 * time.Second)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			first, second := make(chan error, 1), make(chan error, 1)
			go func() { first <- e.Invoke(ctx, "echo", &call.Request{Input: []byte("x"), Deadline: far}) }()
			<-loading
			go func() { second <- e.Invoke(ctx, "echo", &call.Request{Input: []byte("x"), Deadline: far}) }()
			engine.WaitFor(t, "the second request waiting for the first's", func() bool {
				return testkit.Goroutines(tc.frame, "TestRefuseQueuedFailsTheWaitsForAnothersLoad") == 2
			})
			if !e.RefuseQueued() {
				t.Error("RefuseQueued says no request was in the engine")
			}
			refused(t, <-second, tc.waited)
			if inFlight, n := e.Unfinished(); inFlight != 1 || n != 1 {
				t.Errorf("Unfinished: %d in flight, %d refused; want the one loading and the one refused", inFlight, n)
			}
			release()
			cancel()
			<-first // refused further on, or cancelled: it had not run either
		})
	}
}
