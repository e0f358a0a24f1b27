package pipeline_test

import (
	"context"
	"testing"
	"time"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/netguard"
)

// A hot two-step pipeline request without a bound and with one
// (--max-pipeline-memory): the reckoning and the reservation per request.
func BenchmarkPipelineMemory(b *testing.B) {
	e := testkit.Engine(b, engine.Config{})
	testkit.Deploy(b, e, testkit.BundleDir(b, testkit.Manifest("a"), nil))
	testkit.Deploy(b, e, testkit.PipelineDir(b, "p", "a", "a"))
	for _, bc := range []struct {
		name  string
		bound bool
	}{{"unbound", false}, {"bound", true}} {
		b.Run(bc.name, func(b *testing.B) {
			run := runner(e)
			if bc.bound {
				run.Bound(netguard.NewOrderedBudget(1 << 30))
			}
			req := &call.Request{Input: []byte("abcdefgh")}
			for b.Loop() {
				req.Deadline = time.Time{} // each its own, as from the door
				if err := run.Invoke(context.Background(), "p", req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
