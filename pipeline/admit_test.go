package pipeline_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

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
	reg := prometheus.NewRegistry()
	r := pipeline.New(e, reg)
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
	// Both are the step's 429, whether the body was large enough to be
	// admitted first or not: counted once each.
	var got []string
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "plover_pipeline_step_errors_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			got = append(got, fmt.Sprintf("%v %v", m.GetLabel(), m.GetCounter().GetValue()))
		}
	}
	if len(got) != 1 || !strings.Contains(got[0], `value:"429"`) || !strings.HasSuffix(got[0], " 2") {
		t.Errorf("step errors after a refusal at Admit and one at Invoke: %q, want step 0's 429 counted twice", got)
	}
}
