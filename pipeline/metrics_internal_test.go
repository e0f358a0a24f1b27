package pipeline

import (
	"errors"
	"strconv"
	"testing"
	"time"

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
	stepSeries(m, s, s.seconds, stepKey{1, "b", 0}, func() prometheus.Observer { return m.seconds.WithLabelValues("p", "1", "b") })
	stepSeries(m, s, s.errors, stepKey{1, "b", 500}, func() prometheus.Counter { return m.errors.WithLabelValues("p", "1", "b", "500") })
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

// Met and Forget are told under the engine's table lock on every version
// switch of any function, plain ones too: they look at the step series
// that mention the name alone, none for a name no step mentions, however
// many pipelines have series (they walked all of them: 16,000 here, 1.5
// to 24 ms under that lock). The index goes with the series.
func TestMetLooksAtTheNamesSeriesAlone(t *testing.T) {
	r := New(nil, prometheus.NewRegistry())
	m := r.met
	for i := range reqmetrics.MaxLabels {
		p := "p" + strconv.Itoa(i)
		for s := range 8 {
			fn := "inner" + strconv.Itoa(s) + "/fn" + strconv.Itoa(i)
			m.observe(p, s, fn, 1, nil)
			m.observe(p, s, fn, 0, errors.New("failed"))
		}
	}
	r.Met("plain")
	r.Forget("plain")
	if n := m.named.examined.Load(); n != 0 {
		t.Fatalf("Met and Forget of a name no step mentions looked at %d step series, want 0", n)
	}
	r.Met("inner3") // nested in 1,000 pipelines' step 3: a seconds and an errors series each
	if n := m.named.examined.Load(); n != 2*reqmetrics.MaxLabels {
		t.Errorf("Met of inner3 looked at %d step series, want %d", n, 2*reqmetrics.MaxLabels)
	}
	r.Forget("fn7") // p7's other 7 steps
	if n, want := testutil.CollectAndCount(m.seconds)+testutil.CollectAndCount(m.errors), 2*7*reqmetrics.MaxLabels-2*7; n != want {
		t.Errorf("%d step series, want %d", n, want)
	}
	for i := range reqmetrics.MaxLabels {
		r.Forget("p" + strconv.Itoa(i))
	}
	if n := len(m.named.of); n != 0 {
		t.Errorf("%d names indexed after every pipeline was forgotten, want none", n)
	}
}

// A step's time lands under a finite bound up to its request's deadline
// (30 s by default): the buckets ended at 3.3 s, and every slower step
// (a cold load, a long queue) read as +Inf, its quantiles as 3.3 s.
func TestStepBucketsReachTheDeadline(t *testing.T) {
	for _, tc := range []struct {
		took   time.Duration
		bucket float64 // the bound of the bucket it lands in
	}{
		{30 * time.Microsecond, 50e-6},
		{2 * time.Second, 3.2768},
		{5 * time.Second, 6.5536},
		{29 * time.Second, 52.4288},
		{599 * time.Second, 838.8608}, // --max-timeout's 10 min
	} {
		reg := prometheus.NewRegistry()
		New(nil, reg).met.observe("p", 0, "fn", tc.took, nil)
		mfs, err := reg.Gather()
		if err != nil || len(mfs) != 1 {
			t.Fatalf("gathered %d families: %v", len(mfs), err)
		}
		counted := "+Inf"
		for _, b := range mfs[0].GetMetric()[0].GetHistogram().GetBucket() {
			if b.GetCumulativeCount() == 1 {
				counted = strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64)
				break
			}
		}
		if want := strconv.FormatFloat(tc.bucket, 'g', -1, 64); counted != want {
			t.Errorf("a step of %v counted under le=%s, want %s", tc.took, counted, want)
		}
	}
}
