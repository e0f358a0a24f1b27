package pipeline_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/pipeline"
)

// A pipeline whose first step's queue is full is refused before its body
// is read (Admit: 429) as Invoke refuses it: naming the pipeline and the
// step, not only a function the client never called.
func TestAdmitFullFirstStepNamesTheStep(t *testing.T) {
	e := testkit.Engine(t, engine.Config{MaxInstances: 1, MaxQueue: 1})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Slow("slow", 2000), nil))
	testkit.Deploy(t, e, pipelineDir(t, "p", "slow", "slow"))
	r := pipeline.New(e, nil)
	done := make(chan error, 2)
	for range 2 {
		go func() { done <- r.Invoke(context.Background(), "slow", &call.Request{Input: []byte("x")}) }()
	}
	testkit.WaitFor(t, e, "slow", "one run and one queued", testkit.Busy(1, 1))
	admitErr := func() error { _, err := r.Admit(context.Background(), "p", time.Time{}); return err }()
	invokeErr := r.Invoke(context.Background(), "p", &call.Request{Input: []byte("x")})
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		err  error
	}{{"Admit", admitErr}, {"Invoke", invokeErr}} {
		if errdefs.KindOf(tc.err) != errdefs.KindBusy || !strings.Contains(tc.err.Error(), "pipeline p: step 0 (slow)") {
			t.Errorf("%s: %v; want busy naming pipeline p: step 0 (slow)", tc.name, tc.err)
		}
	}
}
