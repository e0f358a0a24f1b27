package engine_test

import (
	"context"
	"sync"
	"testing"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/sched"
)

// A pipeline floods by its first step's function (nested pipelines
// through), for its I/O touches: by its own name, which has no device
// flow, a pipeline flooding small requests counted light and kept a slot
// of the server's I/O from the floods of large bodies (a review found
// it). A function running beside it, or a pipeline starting elsewhere,
// does not.
func TestAPipelineFloodsByItsFirstStep(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Slow("inner", 400), nil))
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("other"), nil))
	testkit.Deploy(t, e, testkit.PipelineDir(t, "outer", "inner", "other"))
	testkit.Deploy(t, e, testkit.PipelineDir(t, "nested", "outer"))
	testkit.Deploy(t, e, testkit.PipelineDir(t, "elsewhere", "other", "inner"))
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// The pipelines' runs are their steps' (package pipeline):
			// inner's two at once, whoever called them.
			if err := e.Invoke(context.Background(), "inner", &call.Request{Input: []byte{1}}); err != nil {
				t.Error(err)
			}
		}()
	}
	defer wg.Wait()
	engine.WaitFor(t, "inner's two runs at once", func() bool { return e.Flooding("inner", sched.DefaultOverlap) })
	for name, want := range map[string]bool{"inner": true, "outer": true, "nested": true, "other": false, "elsewhere": false, "absent": false} {
		if got := e.FloodingIO(name); got != want {
			t.Errorf("FloodingIO(%q) = %v, want %v", name, got, want)
		}
	}
}
