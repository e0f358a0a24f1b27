package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
)

// functionMetric is the series of metric name for function fn in reg, or
// nil.
func functionMetric(t *testing.T, reg *prometheus.Registry, name, fn string) *dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "function" && l.GetValue() == fn {
					return m
				}
			}
		}
	}
	return nil
}

// batchSizeCount is plover_batch_size's count and sum for fn in reg; ok is
// false when it has no series.
func batchSizeCount(t *testing.T, reg *prometheus.Registry, fn string) (count uint64, sum float64, ok bool) {
	t.Helper()
	m := functionMetric(t, reg, "plover_batch_size", fn)
	if m == nil {
		return 0, 0, false
	}
	return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum(), true
}

// plover_batch_size is a function's, like its other counters
// (plover_starts_total): a redeploy or a rollback keeps its runs counted,
// neither dropping them (a counter that went back, read by Prometheus as
// a restart) nor bringing back an earlier version's.
func TestBatchSizeSurvivesRedeployAndRollback(t *testing.T) {
	m := testkit.BatchManifest("bs", 16, "")
	e := testkit.Engine(t, engine.Config{})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(e.Collector())
	v1 := testkit.Deploy(t, e, batchBundle(t, m))

	want := uint64(0)
	var check func(step string)
	run := func(step string) {
		t.Helper()
		if r := <-invokeAsync(e, "bs", item(1, 0), time.Time{}); r.err != nil || r.items != 1 {
			t.Fatalf("%s: %+v", step, r)
		}
		want++
		check(step)
	}
	check = func(step string) {
		t.Helper()
		if n, sum, ok := batchSizeCount(t, reg, "bs"); !ok || n != want || sum != float64(want) {
			t.Fatalf("%s: plover_batch_size count %d sum %v (series %v), want %d runs of one", step, n, sum, ok, want)
		}
	}

	run("v1")
	run("v1 again")
	m.MaxInstances = 3 // a new version of the same function
	testkit.Deploy(t, e, batchBundle(t, m))
	check("after the redeploy")
	run("v2")
	if _, err := e.Control().Rollback(context.Background(), "bs", v1.Version); err != nil {
		t.Fatal(err)
	}
	check("after the rollback")
	run("v1 rolled back to")
}
