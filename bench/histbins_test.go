package bench

import (
	"math"
	"strings"
	"testing"
	"time"
)

// LogBins: at most the bins asked for, round edges evenly spaced on a log
// scale, from at or below the least value to above the largest, holding
// every value once.
func TestLogBins(t *testing.T) {
	for _, tt := range []struct {
		name     string
		values   []time.Duration
		wantBins int // 0: any number up to HistogramBins
		first    float64
	}{
		{"one value", []time.Duration{time.Millisecond, time.Millisecond}, 1, 1},
		{"a decade", spread(time.Millisecond, 9*time.Millisecond, 500), 10, 1},
		{"two decades, the top one an edge", spread(100*time.Microsecond, 10*time.Millisecond, 500), 13, 0.1},
		{"four decades", spread(20*time.Microsecond, 200*time.Millisecond, 500), 13, 0.02},
		{"seven decades", spread(time.Microsecond, 10*time.Second, 500), 8, 0.001},
		{"a narrow band", spread(1010*time.Microsecond, 1090*time.Microsecond, 50), 1, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var h Histogram
			for _, v := range tt.values {
				h.Record(v)
			}
			bins := h.LogBins(HistogramBins)
			if tt.wantBins > 0 && len(bins) != tt.wantBins || len(bins) > HistogramBins || len(bins) == 0 {
				t.Fatalf("%d bins, want %d (at most %d): %+v", len(bins), tt.wantBins, HistogramBins, bins)
			}
			if bins[0].LoMs != tt.first {
				t.Errorf("first bin starts at %v ms, want %v", bins[0].LoMs, tt.first)
			}
			var n int64
			for i, b := range bins {
				n += b.Count
				if i > 0 && b.LoMs != bins[i-1].HiMs {
					t.Errorf("bin %d starts at %v, the one before ends at %v", i, b.LoMs, bins[i-1].HiMs)
				}
				if m := b.LoMs / math.Pow(10, math.Floor(math.Log10(b.LoMs)+1e-9)); !roundEdge(m) {
					t.Errorf("edge %v ms is not a round number (%v)", b.LoMs, m)
				}
			}
			if n != int64(len(tt.values)) {
				t.Errorf("bins hold %d values, %d recorded", n, len(tt.values))
			}
			if lo, hi := ms(h.Min()), ms(h.Max()); bins[0].LoMs > lo || bins[len(bins)-1].HiMs <= hi {
				t.Errorf("bins span [%v, %v) ms, values [%v, %v]", bins[0].LoMs, bins[len(bins)-1].HiMs, lo, hi)
			}
		})
	}
	var empty Histogram
	if b := empty.LogBins(HistogramBins); b != nil {
		t.Errorf("empty histogram: %+v", b)
	}
}

func spread(lo, hi time.Duration, n int) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		f := float64(i) / float64(n-1)
		out[i] = time.Duration(float64(lo) * math.Pow(float64(hi)/float64(lo), f))
	}
	return out
}

func roundEdge(m float64) bool {
	for _, steps := range binSteps {
		for _, s := range steps {
			if math.Abs(m-s) < 1e-9 {
				return true
			}
		}
	}
	return false
}

// The text report draws the histogram under the percentiles: one row per
// bin, a run of empty bins as one row, the percentiles marked in their bins.
func TestWriteTextHistogram(t *testing.T) {
	var h Histogram
	for range 900 {
		h.Record(300 * time.Microsecond)
	}
	for range 100 {
		h.Record(7 * time.Millisecond)
	}
	res := &Result{Function: "f", Server: "http://s", Concurrency: 1, Requests: h.Count(), OK: h.Count(),
		Latency: summarize(&h), LatencyHistogram: h.LogBins(HistogramBins)}
	var b strings.Builder
	if err := res.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"latency distribution (client, 2xx; bins even on a log scale; the longest bar is 900 requests)\n",
		"    300µs - 400µs   |" + strings.Repeat("#", histogramWidth) + "     900  90.0%  p50 p90\n",
		"    400µs - 6ms     |" + strings.Repeat(" ", histogramWidth) + "       0   0.0%\n",
		"      6ms - 8ms     |" + strings.Repeat("#", 4) + strings.Repeat(" ", histogramWidth-4) + "     100  10.0%  p99 p99.9 max\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("lacks %q:\n%s", want, out)
		}
	}
	if strings.Index(out, "latency distribution") < strings.Index(out, "p99.9") {
		t.Errorf("the histogram is not under the percentiles:\n%s", out)
	}
}
