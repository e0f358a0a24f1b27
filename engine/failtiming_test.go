package engine_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
)

// A request that fails before it runs is timed as one that ran: its
// total, and its parts where its time went (what it failed in holding the
// rest, none of it Dispatch, the hand-over of a run it never had), from
// when it reached the engine. It had a Total of 0, and its trace, laid
// out from Total, showed only the request's span: a 504 after a long
// queue or a slow fetch said nothing of either.
func TestAFailureBeforeItRanIsTimed(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	slow := testkit.Slow("q", 1000)
	slow.MaxInstances = 1
	testkit.Deploy(t, e, testkit.BundleDir(t, slow, nil))
	small := testkit.Manifest("small")
	small.MaxInputBytes = 4
	testkit.Deploy(t, e, testkit.BundleDir(t, small, nil))
	ctx := context.Background()
	// behind runs req on q while another request holds its one
	// instance; goAhead, if set, is called once req is seen queued.
	behind := func(t *testing.T, req *call.Request, goAhead func()) error {
		busy := make(chan error, 1)
		go func() { busy <- e.Invoke(ctx, "q", &call.Request{Input: []byte("x")}) }()
		testkit.WaitFor(t, e, "q", "a request running", testkit.Busy(1, 0))
		errc := make(chan error, 1)
		go func() { errc <- e.Invoke(ctx, "q", req) }()
		if goAhead != nil {
			testkit.WaitFor(t, e, "q", "a request queued", testkit.Busy(1, 1))
			goAhead()
		}
		err := <-errc
		if berr := <-busy; berr != nil {
			t.Fatalf("the request holding the instance: %v", berr)
		}
		return err
	}
	for _, tc := range []struct {
		name  string
		run   func(t *testing.T) (*call.Request, error)
		want  errdefs.Kind
		part  func(*call.Timing) time.Duration // where its time went
		least time.Duration
	}{
		{"deadline passed in its queue", func(t *testing.T) (*call.Request, error) {
			req := &call.Request{Input: []byte("x"), Deadline: time.Now().Add(300 * time.Millisecond)}
			return req, behind(t, req, nil)
		}, errdefs.KindTimeout, func(tm *call.Timing) time.Duration { return tm.Queue }, 200 * time.Millisecond},
		{"client gone from its queue", func(t *testing.T) (*call.Request, error) {
			var left atomic.Bool
			req := &call.Request{Input: []byte("x"), Gone: left.Load}
			return req, behind(t, req, func() { left.Store(true) })
		}, errdefs.KindGone, func(tm *call.Timing) time.Duration { return tm.Queue }, 1},
		{"deadline passed in its fetch", func(t *testing.T) (*call.Request, error) {
			node := coldNode(t, func(fs objectstore.Store) objectstore.Store { return stallingBundles{fs} })
			req := &call.Request{Input: []byte("x"), Deadline: time.Now().Add(200 * time.Millisecond)}
			return req, node.Invoke(ctx, "echo", req)
		}, errdefs.KindTimeout, func(tm *call.Timing) time.Duration { return min(tm.Load, tm.Prep) }, 100 * time.Millisecond},
		{"input over its bound", func(t *testing.T) (*call.Request, error) {
			req := &call.Request{Input: []byte("too large")}
			return req, e.Invoke(ctx, "small", req)
		}, errdefs.KindTooLarge, func(tm *call.Timing) time.Duration { return tm.Resolve }, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			began := time.Now()
			req, err := tc.run(t)
			if errdefs.KindOf(err) != tc.want {
				t.Fatalf("got %v, want kind %d", err, tc.want)
			}
			tm := &req.Timing
			if tm.Total <= 0 || req.Reached.Before(began) {
				t.Fatalf("total %v, reached %v after the test began: not timed", tm.Total, req.Reached.Sub(began))
			}
			if sum := tm.Resolve + tm.Queue + tm.Load + tm.Sched + tm.CopyIn + tm.Kernels + tm.CopyOut + tm.Dispatch; sum != tm.Total || tm.Dispatch != 0 {
				t.Errorf("parts %+v add up to %v of total %v, dispatch %v: want all of it, none dispatch", *tm, sum, tm.Total, tm.Dispatch)
			}
			if p := tc.part(tm); p < tc.least {
				t.Errorf("the part it failed in is %v, want at least %v (timing %+v)", p, tc.least, *tm)
			}
		})
	}
}
