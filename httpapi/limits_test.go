package httpapi

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plover-run/plover/auth"
)

// The token bucket over explicit times: a full burst at first, then the
// rate, and the wait a refused request is told; concurrency counts
// requests until done.
func TestTokenLimitsAdmit(t *testing.T) {
	l := newTokenLimits(prometheus.NewRegistry())
	p := &auth.Principal{Name: "t", Limits: auth.Limits{Rate: 4, Burst: 2}}
	t0 := time.Unix(1000, 0)
	steps := []struct {
		at    time.Duration
		over  string
		retry time.Duration
	}{
		{0, "", 0}, {0, "", 0}, // the burst
		{0, "rate", 250 * time.Millisecond}, // empty: a token in 1/4 s
		{100 * time.Millisecond, "rate", 150 * time.Millisecond},
		{250 * time.Millisecond, "", 0},        // refilled one
		{time.Hour, "", 0}, {time.Hour, "", 0}, // refills to the burst, not beyond
		{time.Hour, "rate", 250 * time.Millisecond},
	}
	for i, st := range steps {
		_, over, retry := l.admit(p, t0.Add(st.at))
		if over != st.over || (over != "" && (retry < st.retry-time.Millisecond || retry > st.retry+time.Millisecond)) {
			t.Fatalf("step %d at %v: over %q retry %v; want %q %v", i, st.at, over, retry, st.over, st.retry)
		}
	}
	c := &auth.Principal{Name: "c", Limits: auth.Limits{Concurrency: 2}}
	a, _, _ := l.admit(c, t0)
	b, _, _ := l.admit(c, t0)
	if _, over, _ := l.admit(c, t0); over != "concurrency" {
		t.Fatalf("third in flight: over %q", over)
	}
	a.done()
	if _, over, _ := l.admit(c, t0); over != "" {
		t.Fatalf("after one ended: over %q", over)
	}
	b.done()
}
