package reqmetrics

import (
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/errdefs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// A request's name becomes a label only if a function could have it:
// bytes that are not UTF-8 would fail every scrape, and borrowed bytes
// would change under the series.
func TestLabels(t *testing.T) {
	for _, tc := range []struct {
		name      string
		code      int
		kind      errdefs.Kind
		wantLabel string
		version   string // the version the engine resolved, if it did
	}{
		{"cnn", 200, errdefs.KindInternal, "cnn", ""},
		{"cnn", 429, errdefs.KindBusy, "cnn", ""},
		{"\xff\xfe\xfd", 429, errdefs.KindBusy, "_unknown", ""},
		{"\xff\xfe\xfd", 401, errdefs.KindInternal, "_unknown", ""},
		{"Upper", 500, errdefs.KindInternal, "_unknown", ""},
		{"nope", 404, errdefs.KindNotFound, "_unknown", ""},
		{"digits", 404, errdefs.KindNotFound, "digits", "v3"}, // a pipeline's, one of whose steps was deleted
		{"fresh", 400, errdefs.KindBadRequest, "_unknown", ""},
		{"made-up", 503, errdefs.KindUnavailable, "_unknown", ""}, // a store outage: any name is a 503
		{"guessed", 504, errdefs.KindTimeout, "_unknown", ""},     // timed out while its record was read
		{"left", 499, errdefs.KindGone, "_unknown", ""},
		{"slow", 504, errdefs.KindTimeout, "slow", "v1"},             // a function's own: it queued past its deadline
		{"big", 400, errdefs.KindBadRequest, "big", "v1"},            // after its run: /v2's JSON answer over 16 MiB
		{"answered", 503, errdefs.KindUnavailable, "answered", "v1"}, // its version resolved: the name is a function's
	} {
		reg := prometheus.NewRegistry()
		m := New(reg)
		buf := []byte(tc.name)
		m.Record(call.BorrowName(buf), tc.code, tc.kind, &call.Request{Version: tc.version}) // borrowed, as the HTTP path's
		for i := range buf {
			buf[i] = 0xff // the request's buffer, reused
		}
		if _, err := reg.Gather(); err != nil {
			t.Fatalf("%q: gather: %v", tc.name, err)
		}
		if n := testutil.ToFloat64(m.requests.WithLabelValues(tc.wantLabel, strconv.Itoa(tc.code))); n != 1 {
			t.Errorf("%q %d: plover_requests_total{function=%q} = %v, want 1", tc.name, tc.code, tc.wantLabel, n)
		}
	}
}

// Past the limit of labels, new names share "_other" and are not kept:
// functions beyond it cannot grow the map any more than the series.
func TestOtherKeepsNoNames(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.fns.limit = 3
	var r call.Request
	for i := range 50 {
		m.Record(call.NameOf("fn-"+strconv.Itoa(i)), 500, errdefs.KindKernel, &r)
	}
	if n := len(m.fns.slots); n != 4 {
		t.Errorf("%d names kept for a limit of 3, want 3 and _other", n)
	}
	if got := testutil.ToFloat64(m.requests.WithLabelValues("_other", "500")); got != 47 {
		t.Errorf("_other counted %v requests, want 47", got)
	}
	if got := testutil.ToFloat64(m.requests.WithLabelValues("fn-2", "500")); got != 1 {
		t.Errorf("fn-2 counted %v, want 1", got)
	}
}

// A successful request's total lands in a bucket of its size, from tens
// of microseconds to past the default request timeout (plover serve
// --timeout 30s) and the longest (--max-timeout, 10 min): the buckets
// ended at 23 s, so that a request that took 25 or 29 s of its 30 read as
// +Inf, and a p99 over them as 23 s; then at 58 s.
func TestDurationBucketsReachPastTheTimeout(t *testing.T) {
	for _, d := range []time.Duration{10 * time.Microsecond, 300 * time.Millisecond, 25 * time.Second, 29 * time.Second, 45 * time.Second, 5 * time.Minute, 599 * time.Second} {
		m := New(prometheus.NewRegistry())
		r := &call.Request{Version: "v1"}
		r.Timing.Total = d
		m.Record(call.NameOf("fn"), 200, errdefs.KindInternal, r)
		var pb dto.Metric
		if err := m.fns.Take(call.NameOf("fn")).phases[6].(prometheus.Metric).Write(&pb); err != nil {
			t.Fatal(err)
		}
		le := math.Inf(1)
		for _, b := range pb.GetHistogram().GetBucket() {
			if b.GetCumulativeCount() > 0 {
				le = b.GetUpperBound()
				break
			}
		}
		if s := d.Seconds(); !(le >= s && le < 2.5*s*1.0001) {
			t.Errorf("a total of %v counted under le=%v, want the bucket above it", d, le)
		}
	}
}
