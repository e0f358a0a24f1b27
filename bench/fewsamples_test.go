package bench

import (
	"context"
	"strings"
	"testing"
	"time"
)

// A percentile of too few requests is the slowest of them, the cold start
// among them, and the report says so instead of printing it as a
// percentile: p99 and p99.9 of 50 requests are the max.
func TestWriteTextQuantilesAtTheMax(t *testing.T) {
	for _, tt := range []struct {
		n     int
		cells string // the latency row's p50 .. p99.9
		note  string // "": none
	}{
		{1, "= max    = max    = max    = max", "= max (n=1): too few requests for p50, p90, p99, p99.9, each only the slowest of them\n"},
		{50, "= max    = max", "= max (n=50): too few requests for p99, p99.9, each only the slowest of them\n"},
		{100, "= max", "= max (n=100): too few requests for p99.9, each only the slowest of them\n"},
		{1001, "", ""},
	} {
		var h Histogram
		for i := range tt.n - 1 {
			h.Record(time.Duration(1000+i) * time.Microsecond)
		}
		h.Record(500 * time.Millisecond) // the cold start
		res := &Result{Function: "f", Server: "http://s", Concurrency: 1, Requests: h.Count(), OK: h.Count(), Latency: summarize(&h)}
		res.Timing.Responses, res.Timing.Total = h.Count(), summarize(&h)
		var b strings.Builder
		if err := res.WriteText(&b); err != nil {
			t.Fatal(err)
		}
		out := b.String()
		lines := strings.Split(out, "\n")
		var row, total string
		for i, l := range lines {
			if strings.HasPrefix(l, "latency (client, 2xx)") {
				row = lines[i+1]
			}
			if strings.HasPrefix(l, "  total") {
				total = l
			}
		}
		if got := strings.Count(row, "= max"); got != strings.Count(tt.cells, "= max") || !strings.Contains(row, tt.cells) {
			t.Errorf("n=%d: latency row %q, want %q in it", tt.n, row, tt.cells)
		}
		if !strings.HasSuffix(row, "500ms") && !strings.Contains(row, "500ms ") {
			t.Errorf("n=%d: latency row %q lacks the max, 500ms", tt.n, row)
		}
		if hasNote := strings.Contains(out, "= max (n="); hasNote != (tt.note != "") || tt.note != "" && !strings.Contains(out, tt.note) {
			t.Errorf("n=%d: want the note %q:\n%s", tt.n, tt.note, out)
		}
		// The Server-Timing table's p99 alike (p50 of 1 too).
		if want := QuantileIsMax(0.99, int64(tt.n)); strings.Contains(total, "= max") != want {
			t.Errorf("n=%d: server total row %q; p99 at the max: %v", tt.n, total, want)
		}
	}
}

// --warmup's requests come before the run, in no figure but their own:
// the first request's cold start is not among the run's.
func TestWarmupIsUntimed(t *testing.T) {
	f := startFake(t, 0, 8)
	for _, tt := range []struct {
		fn         string
		warmup     int64
		failed     int64
		cold, hits int64
	}{
		{"echo", 0, 0, 1, 20},
		{"echo", 3, 0, 0, 23},
		{"missing", 2, 2, 0, 0},
	} {
		f.hits.Store(0)
		res, err := Run(context.Background(), Config{Server: f.url, Function: tt.fn, Concurrency: 2, Requests: 20, Warmup: tt.warmup})
		if err != nil {
			t.Fatal(err)
		}
		if res.Requests != 20 || res.Warmup != tt.warmup || res.WarmupFailed != tt.failed || res.Starts.Cold != tt.cold || f.hits.Load() != tt.hits {
			t.Errorf("%s, warmup %d: %d requests, warmup %d (%d failed), %d cold, the server saw %d; want 20, %d (%d), %d cold, %d",
				tt.fn, tt.warmup, res.Requests, res.Warmup, res.WarmupFailed, res.Starts.Cold, f.hits.Load(), tt.warmup, tt.failed, tt.cold, tt.hits)
		}
		var b strings.Builder
		res.WriteText(&b)
		if said := strings.Contains(b.String(), "untimed request"); said != (tt.warmup > 0) {
			t.Errorf("%s, warmup %d: the report says of it: %v\n%s", tt.fn, tt.warmup, said, b.String())
		}
	}
}
