package main

import (
	"strings"
	"testing"
)

// A percentile of the burst table's few readings is the slowest of them
// and says so: p99 of the listing's 20 timings, or of the bursts' 3
// slowest, is their max, not a percentile.
func TestBurstTableQuantilesAtTheMax(t *testing.T) {
	spread := func(n int) []float64 {
		v := make([]float64, n)
		for i := range v {
			v[i] = float64(i + 1)
		}
		return v
	}
	run := &burstRun{Plover: "bin/plover", Sequence: spread(200), SeqLoad: spread(200), Wide: [][]float64{spread(16), spread(16), spread(16)},
		Deploys: spread(1000), List: spread(20), Metrics: spread(20)}
	before := *run
	before.Plover, before.List = "old/plover", spread(100)
	out := renderBurst(&options{isolation: "process"}, &results{}, []*burstRun{run, &before})
	for _, tt := range []struct{ row, cells string }{
		{"| cold start, 200 functions in turn", "| 100 | 198 | 200 | p50 <= 6, p99 <= 15 | 100 / 198 / 200 | 1.00× |"},
		{"| 16 cold starts at once", "| 16.0 | = max (n=3) | 16.0 | max <= 30 | 16.0 / = max (n=3) / 16.0 | 1.00× |"},
		{"| `GET /v1/functions`", "| 10.5 | = max (n=20) | 20.0 | p50 <= 50 | 50.5 / 99.0 / 100 | 0.21× |"},
	} {
		var line string
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, tt.row) {
				line = l
			}
		}
		if !strings.HasSuffix(line, tt.cells) {
			t.Errorf("row %q:\n%s\nwant it to end %q", tt.row, line, tt.cells)
		}
	}
}
