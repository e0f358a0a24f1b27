package pipeline_test

import (
	"context"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/racebuild"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/pipeline"
)

// A parallel step fanning out to one function past what it takes at once
// (max_instances running, max_queue waiting) runs on an idle server: its
// own branches wait for each other, not in the function's queue, where
// they filled it and failed with a 429 on every request (a review found
// it: with defaults, 16 branches of 16 nested ones). Others' requests
// to the function still find its queue's room.
func TestAFanOutPastTheQueueWaitsForItsOwnBranches(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps func(e *engine.Engine) []any
		width int
	}{
		{"four branches, one instance and two waiting", func(*engine.Engine) []any {
			return []any{map[string]any{"parallel": []string{"one", "one", "one", "one"}}}
		}, 4},
		{"nested: three of three", func(e *engine.Engine) []any {
			testkit.Deploy(t, e, pipelineDir(t, "inner", map[string]any{"parallel": []string{"one", "one", "one"}}))
			return []any{map[string]any{"parallel": []string{"inner", "inner", "inner"}}}
		}, 9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := testkit.Engine(t, engine.Config{})
			m := testkit.Slow("one", 20)
			m.MaxInstances, m.MaxQueue = 1, 2
			testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
			testkit.Deploy(t, e, pipelineDir(t, "fan", tc.steps(e)...))
			r := pipeline.New(e, prometheus.NewRegistry())
			for i := range 3 {
				req := &call.Request{Input: []byte("abcdefgh")}
				if err := r.Invoke(context.Background(), "fan", req); err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				if want := tc.width * 8; len(req.Output) < want {
					t.Fatalf("request %d: %d bytes, want %d or more", i, len(req.Output), want)
				}
			}
			fi, err := e.Control().Function(context.Background(), "one")
			if err != nil {
				t.Fatal(err)
			}
			if fi.Requests != int64(3*tc.width) {
				t.Errorf("one served %d requests, want %d", fi.Requests, 3*tc.width)
			}
		})
	}
}

// A branch waiting for its siblings' runs of its function gives up when
// another branch fails: the function runs no more of the request's steps.
func TestAFanOutWaitingStopsWhenABranchFails(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	m := testkit.Slow("one", 300)
	m.MaxInstances, m.MaxQueue = 1, 1
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	testkit.Deploy(t, e, testkit.UnloadableBundleDir(t, testkit.Manifest("bad")))
	testkit.Deploy(t, e, pipelineDir(t, "fan", map[string]any{"parallel": []string{"one", "one", "one", "one", "bad"}}))
	r := pipeline.New(e, prometheus.NewRegistry())
	err := r.Invoke(context.Background(), "fan", &call.Request{Input: []byte("abcdefgh")})
	if err == nil || !strings.Contains(err.Error(), "step 0 (bad)") {
		t.Fatalf("err = %v, want bad's failure", err)
	}
	fi, err := e.Control().Function(context.Background(), "one")
	if err != nil {
		t.Fatal(err)
	}
	// A step that waited in one's queue when bad failed gave its wait up,
	// counted as one's 499 (a client error): whether one was loaded and
	// had taken it by then is a race of this test's.
	if ran := fi.Requests - fi.ClientErrors; ran != 1 || fi.Errors != 0 {
		t.Errorf("one ran %d of the request's steps (%d requests, %d client errors, %d errors), want the one it had started", ran, fi.Requests, fi.ClientErrors, fi.Errors)
	}
}

// A wide parallel step's answer is allocated once: appended a branch at a
// time, 16 x 16 branches of 1 MiB allocated 2.7 GiB for a 256 MiB answer
// (a review's probe; 0.6-0.8 GiB since: the branches' outputs, the
// nested joins and the answer). Here 8 x 8 of 256 KiB: 16 MiB.
func TestAWideJoinIsAllocatedOnce(t *testing.T) {
	if racebuild.Enabled {
		t.Skip("the race detector drops sync.Pool's items on purpose: allocations are not the program's")
	}
	e := testkit.Engine(t, engine.Config{})
	m := testkit.Manifest("big")
	m.OutBytes = 256 << 10
	m.MaxQueue = 1000
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	par := func(name string) map[string]any {
		return map[string]any{"parallel": []string{name, name, name, name, name, name, name, name}}
	}
	testkit.Deploy(t, e, pipelineDir(t, "inner", par("big")))
	testkit.Deploy(t, e, pipelineDir(t, "outer", par("inner")))
	r := pipeline.New(e, prometheus.NewRegistry())
	least := uint64(1 << 62)
	for range 3 { // the least of three: a run beside the test's other goroutines' garbage
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		req := &call.Request{Input: []byte{1}}
		if err := r.Invoke(context.Background(), "outer", req); err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&after)
		if int64(len(req.Output)) != 64*m.OutBytes {
			t.Fatalf("answer %d bytes, want %d", len(req.Output), 64*m.OutBytes)
		}
		least = min(least, after.TotalAlloc-before.TotalAlloc)
	}
	if answer := uint64(64 * m.OutBytes); least > 4*answer {
		t.Errorf("a 16 MiB answer of 8 x 8 branches allocated %d MiB, over 4 times it", least>>20)
	}
}

// A step refused because others' requests took the room its sibling's
// end made, with none of its siblings left in flight, is the request's
// 429 at once: it waited for an end that could not come, until the
// request's deadline (a review's probe: 5 s for a 429).
func TestARefusedStepWithNoSiblingLeftIsTheRequests429(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	m := testkit.Slow("one", 200)
	m.MaxInstances, m.MaxQueue = 1, 2
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	testkit.Deploy(t, e, pipelineDir(t, "fan", map[string]any{"parallel": []string{"one", "one"}}))
	ctx := context.Background()
	if err := e.Invoke(ctx, "one", &call.Request{Input: []byte("abcdefgh")}); err != nil {
		t.Fatal(err) // loaded: the request's two steps go at once
	}
	var calls atomic.Int32
	hold := make(chan struct{})
	defer pipeline.SetInvokingHook(func() {
		if calls.Add(1) == 2 {
			<-hold // the second branch asks once the first ended and others filled the queue
		}
	})()
	done := make(chan error, 1)
	go func() {
		done <- pipeline.New(e, prometheus.NewRegistry()).Invoke(ctx, "fan",
			&call.Request{Input: []byte("abcdefgh"), Deadline: time.Now().Add(20 * time.Second)})
	}()
	testkit.WaitFor(t, e, "one", "the first branch's run", testkit.Busy(1, 0))
	testkit.WaitFor(t, e, "one", "its end", testkit.Busy(0, 0))
	others := make(chan error, 3)
	for range 3 {
		go func() { others <- e.Invoke(ctx, "one", &call.Request{Input: []byte("abcdefgh")}) }()
	}
	testkit.WaitFor(t, e, "one", "others' requests holding its room", testkit.Busy(1, 2))
	close(hold)
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the refused step waited on (for its deadline)")
	}
	if errdefs.KindOf(err) != errdefs.KindBusy {
		t.Errorf("err = %v, want the function's 429", err)
	}
	for range 3 {
		if err := <-others; err != nil {
			t.Error(err)
		}
	}
}

// A branch's wait for its siblings is its step's queue time: with one
// instance and one waiting (two of the request's steps at once, the rest
// waiting for them in the request), four branches run one after another,
// and what their steps report outside their queues fits in the span their
// steps cover (it did not: a step's timing began when its function took
// it, not when it began to wait for its siblings).
func TestASiblingWaitIsQueueTime(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	m := testkit.Slow("one", 40)
	m.MaxInstances, m.MaxQueue = 1, 1
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	testkit.Deploy(t, e, pipelineDir(t, "fan", map[string]any{"parallel": []string{"one", "one", "one", "one"}}))
	r := pipeline.New(e, prometheus.NewRegistry())
	for i := range 2 { // cold, then hot
		req := &call.Request{Input: []byte("abcdefgh")}
		if err := r.Invoke(context.Background(), "fan", req); err != nil {
			t.Fatal(err)
		}
		if len(req.Steps) != 4 {
			t.Fatalf("%d steps, want 4", len(req.Steps))
		}
		from, to := req.Steps[0].Begin, time.Duration(0)
		var outside time.Duration
		for _, s := range req.Steps {
			from, to = min(from, s.Begin), max(to, s.Begin+s.Timing.Total)
			if s.Timing.Queue > s.Timing.Total {
				t.Errorf("request %d: a step's queue %v is over its total %v", i, s.Timing.Queue, s.Timing.Total)
			}
			outside += s.Timing.Total - s.Timing.Queue
		}
		// A step's run ends (its instance free for the next) before its
		// timing does: under load the two overlapped by 1.2 ms in one
		// run. 10 ms of slack, against the 80 ms a sibling's wait
		// outside its queue added with steps of 40 ms.
		if outside > to-from+10*time.Millisecond {
			t.Errorf("request %d: the steps report %v outside their queues, one run at a time, within a span of %v", i, outside, to-from)
		}
	}
}

// A step refused while its sibling held its function's room, and served
// when it asked again, is one request of the function's, not a 429 beside
// it: no client got that refusal. Before, the function showed a client
// error for each such try.
func TestARefusedTryAskedAgainIsNotCounted(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	m := testkit.Slow("one", 100)
	m.MaxInstances, m.MaxQueue = 1, 1
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	testkit.Deploy(t, e, pipelineDir(t, "fan", map[string]any{"parallel": []string{"one", "one"}}))
	ctx := context.Background()
	if err := e.Invoke(ctx, "one", &call.Request{Input: []byte("abcdefgh")}); err != nil {
		t.Fatal(err) // loaded: the request's two steps go at once
	}
	var calls atomic.Int32
	hold := make(chan struct{})
	defer pipeline.SetInvokingHook(func() {
		if calls.Add(1) == 2 {
			<-hold // the second branch asks once another request took the queue
		}
	})()
	done := make(chan error, 1)
	go func() {
		done <- pipeline.New(e, prometheus.NewRegistry()).Invoke(ctx, "fan", &call.Request{Input: []byte("abcdefgh")})
	}()
	testkit.WaitFor(t, e, "one", "the first branch's run", testkit.Busy(1, 0))
	other := make(chan error, 1)
	go func() { other <- e.Invoke(ctx, "one", &call.Request{Input: []byte("abcdefgh")}) }()
	testkit.WaitFor(t, e, "one", "another request in its queue", testkit.Busy(1, 1))
	close(hold) // the second branch is refused (1 running, 1 waiting), and asks again at the first's end
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-other; err != nil {
		t.Fatal(err)
	}
	fi, err := e.Control().Function(ctx, "one")
	if err != nil {
		t.Fatal(err)
	}
	if fi.Requests != 4 || fi.ClientErrors != 0 || fi.Errors != 0 {
		t.Errorf("one: %d requests, %d client errors, %d errors; want 4, 0, 0 (the first, the other and the two steps)", fi.Requests, fi.ClientErrors, fi.Errors)
	}
}
