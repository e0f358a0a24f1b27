package pipeline_test

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/pipeline"
)

// A pipeline loads no program: its steps' functions do, and count their
// starts. The pipeline's name counted its request's start too (the
// coldest step's), so one load showed as two cold starts in
// plover_starts_total summed by kind (the dashboard's panel). A step's
// run is its function's request in plover ls (REQUESTS), while
// plover_requests_total counts the pipeline's transport request alone.
func TestPipelineCountsNoStartsOfItsOwn(t *testing.T) {
	for _, tc := range []struct {
		name, invoke string
	}{
		{"function", "echo"},
		{"pipeline", "p"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := testkit.Engine(t, engine.Config{})
			testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
			testkit.Deploy(t, e, pipelineDir(t, "p", "echo"))
			reg := prometheus.NewRegistry()
			reg.MustRegister(e.Collector())
			if err := pipeline.New(e, reg).Invoke(context.Background(), tc.invoke, &call.Request{Input: []byte{1}}); err != nil {
				t.Fatal(err)
			}
			mfs, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			starts := map[string]float64{} // by kind, over every function, as the dashboard sums them
			for _, mf := range mfs {
				if mf.GetName() != "plover_starts_total" {
					continue
				}
				for _, m := range mf.GetMetric() {
					for _, l := range m.GetLabel() {
						if l.GetName() == "kind" {
							starts[l.GetValue()] += m.GetCounter().GetValue()
						}
					}
				}
			}
			if starts["cold"] != 1 || starts["warm"] != 0 || starts["hot"] != 0 {
				t.Errorf("plover_starts_total by kind %v after one load, want 1 cold", starts)
			}
			fi, err := e.Control().Function(context.Background(), "echo")
			if err != nil || fi.Cold != 1 || fi.Requests != 1 {
				t.Errorf("echo: %d cold starts, %d requests (%v); want 1 and 1 (its run, a step's or not)", fi.Cold, fi.Requests, err)
			}
			pi, err := e.Control().Function(context.Background(), "p")
			want := int64(0)
			if tc.invoke == "p" {
				want = 1
			}
			if err != nil || pi.Cold+pi.Warm+pi.Hot != 0 || pi.Requests != want || pi.Requests-pi.ClientErrors-pi.Errors != want {
				t.Errorf("p: %d/%d/%d cold/warm/hot, %d requests, %d client errors, %d errors (%v); want no starts and %d succeeded",
					pi.Cold, pi.Warm, pi.Hot, pi.Requests, pi.ClientErrors, pi.Errors, err, want)
			}
			if want == 1 && pi.MeanUs <= 0 {
				t.Errorf("p: mean %d µs over its success, want its time", pi.MeanUs)
			}
		})
	}
}
