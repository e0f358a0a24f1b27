package pipeline

import (
	"errors"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/reqmetrics"
)

// A step that ends after its pipeline was forgotten, holding its series
// from before, makes none again (they would be no pipeline's, for good);
// past the labels' limit pipelines share _other, their steps' functions
// too, so that its series stay as few as the steps.
func TestStepSeriesStayBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := New(nil, reg)
	m := r.met
	m.observe("p", 0, "a", 1, nil)
	s := m.tab.Take(call.NameOf("p")) // a step's lookup, before the delete
	r.Forget("p")
	stepSeries(s, s.seconds, stepKey{1, "b", 0}, func() prometheus.Observer { return m.seconds.WithLabelValues("p", "1", "b") })
	stepSeries(s, s.errors, stepKey{1, "b", 500}, func() prometheus.Counter { return m.errors.WithLabelValues("p", "1", "b", "500") })
	if n := testutil.CollectAndCount(m.seconds) + testutil.CollectAndCount(m.errors); n != 0 {
		t.Fatalf("%d series after p was forgotten, want none", n)
	}
	// Past the limit, pipelines whose steps run other functions.
	for i := range reqmetrics.MaxLabels + 50 {
		name := "q" + strconv.Itoa(i)
		m.observe(name, 0, name+"-fn", 1, nil)
		m.observe(name, 1, "inner/"+name+"-fn", 1, errors.New("failed"))
	}
	if n := testutil.CollectAndCount(m.seconds); n != reqmetrics.MaxLabels+1 {
		t.Errorf("%d step histograms, want %d: a pipeline's own each, and _other's", n, reqmetrics.MaxLabels+1)
	}
	if n := testutil.CollectAndCount(m.errors); n != reqmetrics.MaxLabels+1 {
		t.Errorf("%d step error series, want %d", n, reqmetrics.MaxLabels+1)
	}
}
