package pipeline_test

import (
	"strings"
	"testing"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/errdefs"
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
		if errdefs.KindOf(err) != errdefs.KindUnavailable || !strings.Contains(err.Error(), "shutting down") {
			t.Errorf("the pipeline's request: %v, want a 503, the server shutting down", err)
		}
	case err := <-busy:
		t.Fatalf("the running request ended (%v) before the queued step was refused", err)
	}
	if err := <-busy; err != nil {
		t.Errorf("the request running as the step was refused: %v", err)
	}
}
