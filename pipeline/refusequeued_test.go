package pipeline_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/netguard"
	"github.com/plover-run/plover/pipeline"
)

// A pipeline's step waiting in its function's queue when the node stops
// taking runs (the end of plover serve's --grace: engine.RefuseQueued) is
// refused as any queued request is: the pipeline's request ends at once,
// a 503 saying the server is shutting down, and its step never runs; the
// request running beside it goes on.
func TestAStepQueuedWhenTheGraceEndsIsRefused(t *testing.T) {
	e, busy, done := queuedAtStep(t, 1000, nil, &call.Request{Input: []byte("x")})
	e.RefuseQueued()
	select {
	case err := <-done:
		refusedWaiting(t, err, "pipeline p:", "")
	case err := <-busy:
		t.Fatalf("the running request ended (%v) before the queued step was refused", err)
	}
	if err := <-busy; err != nil {
		t.Errorf("the request running as the step was refused: %v", err)
	}
}

// A pipeline's request waiting for room for its steps' outputs in
// --max-pipeline-memory when the grace ends is refused as a request
// waiting in the engine is, counted so (engine.Unfinished), and runs no
// step: in line for room, needing the whole budget (tried for out of
// line), or come after the refusal. RefuseQueued counts it in the engine,
// so that the transports give its answer time to be written. They waited
// on for room (a 503 to retry shortly after 5 s), and the process's exit
// cut them unanswered.
func TestAWaitForRoomIsRefusedAtTheGracesEnd(t *testing.T) {
	defer pipeline.SetMemoryWait(10 * time.Second)()
	for _, tc := range []struct {
		name, pipeline string
		waiting        string // the wait's frame, seen before the refusal; "": the request comes after it
	}{
		{"in line", "p", "(*Budget).Acquire("},
		{"needing the whole budget", "whole", "wholeWait.func"}, // inlined in hold: "hold.wholeWait.func4("
		{"come after the refusal", "p", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := testkit.Engine(t, engine.Config{})
			whole := testkit.Manifest("whole-out")
			whole.OutBytes = 1 << 20 // the budget's
			testkit.Deploy(t, e, testkit.BundleDir(t, whole, nil))
			testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("a"), nil))
			testkit.Deploy(t, e, pipelineDir(t, "whole", "whole-out"))
			testkit.Deploy(t, e, pipelineDir(t, "p", "a", "a"))
			mem := netguard.NewOrderedBudget(1 << 20)
			if !mem.TryAcquire(1 << 20) { // others' requests hold it all
				t.Fatal("the budget is not empty")
			}
			run := runner(e)
			run.Bound(mem)
			if tc.waiting == "" {
				e.RefuseQueued()
			}
			req := &call.Request{Input: []byte("abcdefgh")}
			done := make(chan error, 1)
			go func() { done <- run.Invoke(context.Background(), tc.pipeline, req) }()
			if tc.waiting != "" {
				testkit.Until(t, "the request waiting for room", func() bool {
					return testkit.Goroutines(tc.waiting, "TestAWaitForRoomIsRefusedAtTheGracesEnd") == 1
				})
				if !e.RefuseQueued() {
					t.Error("RefuseQueued says no request was in the engine: the transports would not wait for the refusal's answer")
				}
			}
			refusedWaiting(t, <-done, "pipeline "+tc.pipeline+":", "room for its steps' outputs")
			if len(req.Steps) != 0 {
				t.Errorf("%d steps ran", len(req.Steps))
			}
			if inFlight, n := e.Unfinished(); inFlight != 0 || n != 1 {
				t.Errorf("Unfinished: %d in flight, %d refused; want 0 and the 1 request", inFlight, n)
			}
			if got := mem.InUse(); got != 1<<20 {
				t.Errorf("%d bytes held after the request, want the others' %d", got, 1<<20)
			}
		})
	}
}

// A parallel step waiting for its siblings' runs of its function (the
// request's own steps hold what the function takes at once) when the
// grace ends is refused then, not once its sibling ends, and counted; its
// sibling, held before it asked its function, is refused as it does. The
// pipeline's answer is the waiting step's refusal. It waited for the
// sibling's run, which the process's exit cut.
func TestASiblingWaitIsRefusedAtTheGracesEnd(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("one"), nil))
	testkit.Deploy(t, e, pipelineDir(t, "fan", map[string]any{"parallel": []string{"one", "one"}}))
	var calls atomic.Int32
	hold := make(chan struct{})
	defer pipeline.SetInvokingHook(func() {
		if calls.Add(1) == 1 {
			<-hold // the first branch, counted, holds its function (not loaded: one step at a time)
		}
	})()
	done := make(chan error, 1)
	go func() {
		done <- runner(e).Invoke(context.Background(), "fan", &call.Request{Input: []byte("abcdefgh"), Deadline: time.Now().Add(10 * time.Second)})
	}()
	// Either branch may wait, on the request's goroutine or one of
	// parallel's own (whose stack does not name the test): no other test
	// leaves a step waiting for its siblings, each waits for its
	// request's end.
	testkit.Until(t, "a branch waiting for its sibling", func() bool { return testkit.Goroutines("(*run).waitUntil(") >= 1 })
	if !e.RefuseQueued() {
		t.Error("RefuseQueued says no request was in the engine: the transports would not wait for the refusal's answer")
	}
	testkit.Until(t, "the waiting branch refused while its sibling is held", func() bool {
		_, n := e.Unfinished()
		return n == 1
	})
	close(hold)
	// The waiting branch's refusal, or the held one's (refused as it was
	// about to fetch its bundle) if that reached the request first: the
	// waiting branch counts its refusal before it fails the request.
	err := <-done
	refusedWaiting(t, err, "pipeline fan:")
	if !strings.Contains(err.Error(), "parallel siblings") && !strings.Contains(err.Error(), "was about to") {
		t.Errorf("the pipeline's answer: %v; want a branch's refusal", err)
	}
	if inFlight, n := e.Unfinished(); inFlight != 0 || n != 2 {
		t.Errorf("Unfinished: %d in flight, %d refused; want 0 and both steps", inFlight, n)
	}
}

// refusedWaiting fails the test unless err is a refusal by RefuseQueued
// (a 503 saying the server is shutting down, with a time to retry) whose
// message holds each of says.
func refusedWaiting(t *testing.T, err error, says ...string) {
	t.Helper()
	ok := errdefs.KindOf(err) == errdefs.KindUnavailable && strings.Contains(err.Error(), "shutting down") && !errdefs.RetryAt(err).IsZero()
	for _, s := range says {
		ok = ok && strings.Contains(err.Error(), s)
	}
	if !ok {
		t.Errorf("the pipeline's request: %v; want a 503, the server shutting down (saying %q), with a time to retry", err, says)
	}
}
