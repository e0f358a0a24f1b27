package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/plover-run/plover/bench"
	"github.com/plover-run/plover/device"
)

// batchRun is the CNN with and without batching on one server, same run.
type batchRun struct {
	Clients  int          `json:"clients"`
	Closed   []batchRound `json:"closed_loop"`
	Capacity float64      `json:"capacity_per_s"` // unbatched closed-loop median: the sweep's 1.0
	Plain    []sweepPoint `json:"sweep_unbatched"`
	Batched  []sweepPoint `json:"sweep_batched"`
	// Sizes is requests per run of the batched function over each sweep
	// point (from plover_batch_size).
	Sizes []float64 `json:"sweep_mean_batch"`
	// Direct is the batched chain called in process (device.Device, no
	// server) on as many items per run as each entry says.
	Direct []directBatch `json:"direct"`
}

type directBatch struct {
	Items    int     `json:"items"`
	RunMs    float64 `json:"run_ms"` // median Instance.Run
	ItemsPer float64 `json:"items_per_s"`
}

type batchRound struct {
	Function   string  `json:"function"`
	Throughput float64 `json:"throughput_per_s"`
	P50        float64 `json:"p50_ms"`
	P99        float64 `json:"p99_ms"`
	MeanBatch  float64 `json:"mean_batch,omitempty"`
	Errors     int64   `json:"errors"`
}

// runBatch measures the CNN unbatched (samples/cnn-<suffix>) against its
// batching build (samples/cnn-batch-<suffix>) on one plover serve: closed
// loop with o.batchClients clients, alternating, then latency against
// offered load for both at the same rates.
func runBatch(ctx context.Context, o *options, res *results) error {
	plain, err := cnnWorkload(o.repo, o.samples, o.suffix)
	if err != nil {
		return err
	}
	batched := *plain
	batched.Name, batched.Dir = "cnn-batch", filepath.Join(o.samples, "cnn-batch-"+o.suffix)
	data, err := os.MkdirTemp("", "plover-batch-bench-")
	if err != nil {
		return err
	}
	defer removeAll(data)
	for _, w := range []*workload{plain, &batched} {
		if _, err := os.Stat(filepath.Join(w.Dir, "plover.json")); err != nil {
			return fmt.Errorf("bundle %s not built (make samples)", w.Dir)
		}
		if err := deployToStore(ctx, o.plover, w.Dir, data); err != nil {
			return err
		}
	}
	srv, err := startServer(o.plover, data, o.device, o.isolation)
	if err != nil {
		return err
	}
	defer srv.stop()
	br := &batchRun{Clients: o.batchClients}
	loads := []*workload{plain, &batched}
	for _, w := range loads { // loaded, instances made, before anything is timed
		if _, err := bench.Run(ctx, bench.Config{Server: srv.url, Function: w.Name, Input: w.Input, Concurrency: o.batchClients,
			Duration: time.Second, Requests: 1_000_000, Timeout: time.Minute}); err != nil {
			return err
		}
	}
	if err := br.closed(ctx, o, srv.url, loads); err != nil {
		return err
	}
	if err := br.open(ctx, o, srv.url, loads); err != nil {
		return err
	}
	if err := srv.stop(); err != nil {
		logf("stopping the server: %v", err)
	}
	if err := br.direct(o, &batched); err != nil {
		return err
	}
	res.LoadAfterRuns = loadAvg()
	return writeBatch(o, res, br)
}

// closed measures loads (unbatched, then batched) in a closed loop of
// o.batchClients clients, alternating, two rounds; the unbatched
// function's median throughput is the capacity the open loops scale.
func (br *batchRun) closed(ctx context.Context, o *options, url string, loads []*workload) error {
	plain, batched := loads[0], loads[1]
	for round := 0; round < 2; round++ {
		for _, w := range loads {
			logf("%s: closed loop, %d clients, %v (round %d)", w.Name, o.batchClients, o.batchTime, round+1)
			before := batchSizes(url, batched.Name)
			r, err := bench.Run(ctx, bench.Config{Server: url, Function: w.Name, Input: w.Input, Concurrency: o.batchClients,
				Duration: o.batchTime, Requests: 100_000_000, Timeout: time.Minute})
			if err != nil {
				return err
			}
			rd := batchRound{Function: w.Name, Throughput: r.Throughput, P50: r.Latency.P50, P99: r.Latency.P99}
			for _, e := range r.Errors {
				rd.Errors += e.Count
			}
			if w == batched {
				rd.MeanBatch = batchSizes(url, batched.Name).since(before)
			}
			br.Closed = append(br.Closed, rd)
		}
	}
	var caps []float64
	for _, rd := range br.Closed {
		if rd.Function == plain.Name {
			caps = append(caps, rd.Throughput)
		}
	}
	br.Capacity = median(caps)
	return nil
}

// open measures loads' latency against offered load: the same rates,
// fractions of the capacity, for both.
func (br *batchRun) open(ctx context.Context, o *options, url string, loads []*workload) error {
	plain, batched := loads[0], loads[1]
	fractions, err := parseFractions(o.batchFractions)
	if err != nil {
		return err
	}
	for _, f := range fractions {
		rate := roundRate(f * br.Capacity)
		for _, w := range loads {
			logf("%s: open loop at %g req/s for %v", w.Name, rate, o.sweepTime)
			before := batchSizes(url, batched.Name)
			p, err := openLoop(ctx, url, w, rate, o.sweepTime)
			if err != nil {
				return err
			}
			if w == plain {
				br.Plain = append(br.Plain, p)
			} else {
				br.Batched = append(br.Batched, p)
				br.Sizes = append(br.Sizes, batchSizes(url, batched.Name).since(before))
			}
		}
	}
	return nil
}

// direct runs the same batched chain in process, for the HTTP path's
// share of it.
func (br *batchRun) direct(o *options, batched *workload) error {
	devs, err := device.Open(o.device, 0, nil)
	if err != nil {
		return fmt.Errorf("direct calls: %w", err)
	}
	defer func() {
		for _, d := range devs {
			d.Close()
		}
	}()
	for _, k := range []int{1, 8, 64} {
		logf("cnn-batch: in process, %d items per run", k)
		d, err := measureDirect(devs[0], batched.Dir, bytes.Repeat(batched.Input, k), k, 1, 100_000, 3*time.Second)
		if err != nil {
			return fmt.Errorf("cnn-batch direct: %w", err)
		}
		runMs := median(mapSlice(d.Repeats, func(r directRepeat) float64 { return r.RunMs }))
		br.Direct = append(br.Direct, directBatch{Items: k, RunMs: runMs, ItemsPer: float64(k) / runMs * 1000})
	}
	return nil
}

// sizeCount is plover_batch_size's sum and count at one moment.
type sizeCount struct{ sum, count float64 }

func (s sizeCount) since(b sizeCount) float64 {
	if s.count <= b.count {
		return 0
	}
	return (s.sum - b.sum) / (s.count - b.count)
}

var (
	sizeSumRE   = regexp.MustCompile(`(?m)^plover_batch_size_sum\{function="([^"]+)"\} (\S+)`)
	sizeCountRE = regexp.MustCompile(`(?m)^plover_batch_size_count\{function="([^"]+)"\} (\S+)`)
)

// batchSizes reads the function's plover_batch_size from /metrics; zeros
// when it cannot.
func batchSizes(url, fn string) sizeCount {
	text, err := getText(context.Background(), url+"/metrics")
	if err != nil {
		return sizeCount{}
	}
	b := []byte(text)
	var sc sizeCount
	for _, m := range sizeSumRE.FindAllSubmatch(b, -1) {
		if string(m[1]) == fn {
			sc.sum, _ = strconv.ParseFloat(string(m[2]), 64)
		}
	}
	for _, m := range sizeCountRE.FindAllSubmatch(b, -1) {
		if string(m[1]) == fn {
			sc.count, _ = strconv.ParseFloat(string(m[2]), 64)
		}
	}
	return sc
}

func writeBatch(o *options, res *results, br *batchRun) error {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p("## Batching: the CNN with and without it (%s device)\n\n", res.Device)
	p("Written by `%s` on %s: %s, %d cores, %s; `plover serve --isolation %s`, client and server on this machine; load average before %s, after %s.\n\n",
		res.Command, res.Started.Format("2006-01-02"), res.Machine.CPU, res.Machine.Cores, res.Machine.OS, o.isolation, res.LoadBefore, res.LoadAfterRuns)
	p("`cnn` is `samples/cnn` (one digit per run); `cnn-batch` is the same source built with `-DCNN_BATCH=64` and `plover-batch.json` (up to 64 digits per run, `max_delay` 200 µs). Both on one server, the same digit, measured alternately.\n\n")
	p("Closed loop, %d clients, %v per run:\n\n", br.Clients, o.batchTime)
	p("| function | round | throughput/s | p50 ms | p99 ms | requests per run | errors |\n|---|---:|---:|---:|---:|---:|---:|\n")
	var plainT, batchT []float64
	for i, rd := range br.Closed {
		mb := "1"
		if rd.Function != "cnn" {
			mb = fmt.Sprintf("%.1f", rd.MeanBatch)
			batchT = append(batchT, rd.Throughput)
		} else {
			plainT = append(plainT, rd.Throughput)
		}
		p("| %s | %d | %.0f | %s | %s | %s | %d |\n", rd.Function, i/2+1, rd.Throughput, fmtMs(rd.P50), fmtMs(rd.P99), mb, rd.Errors)
	}
	p("\nBatched over unbatched throughput (medians): **%s**.\n\n", ratio(median(batchT), median(plainT)))
	p("The same batched chain called in process (`device.Device`, no server, no HTTP; one instance, median of repeated runs):\n\n")
	p("| items per run | run ms | items/s |\n|---:|---:|---:|\n")
	best := 0.0
	for _, d := range br.Direct {
		p("| %d | %s | %.0f |\n", d.Items, fmtMs(d.RunMs), d.ItemsPer)
		best = max(best, d.ItemsPer)
	}
	p("\nBatched throughput through HTTP (%d clients) over the in-process chain's best items/s: **%s**", br.Clients, ratio(median(batchT), best))
	p(" (one in-process instance on one thread; the server runs up to its instance cap, on this machine's %d cores shared with the load generator).\n\n", res.Machine.Cores)
	p("Open loop (at most %d in flight), %v per rate, rates as fractions of the unbatched closed-loop throughput (%.0f/s); chart: `%s`.\n\n",
		sweepInFlight, o.sweepTime, br.Capacity, o.batchChart)
	p("| offered/s | cnn achieved/s | cnn p50 | cnn p99 | cnn-batch achieved/s | cnn-batch p50 | cnn-batch p99 | requests per run |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for i := range br.Plain {
		a, c := br.Plain[i], br.Batched[i]
		mark := func(p sweepPoint) string {
			if p.saturated() {
				return " (not kept)"
			}
			return ""
		}
		p("| %g | %.0f%s | %s | %s | %.0f%s | %s | %s | %.1f |\n", a.Offered, a.Achieved, mark(a), fmtMs(a.P50), fmtMs(a.P99),
			c.Achieved, mark(c), fmtMs(c.P50), fmtMs(c.P99), br.Sizes[i])
	}
	svg := drawChart(chart{
		title:    fmt.Sprintf("CNN on the %s device, with and without batching: latency against offered load", res.Device),
		subtitle: machineLine(res),
		vline:    br.Capacity, vlabel: fmt.Sprintf("unbatched closed-loop throughput %.0f/s ", br.Capacity),
		series: []chartSeries{
			sweepSeries("unbatched p50", "#1f77b4", false, br.Plain, func(p *sweepPoint) float64 { return p.P50 }),
			sweepSeries("unbatched p99", "#d62728", false, br.Plain, func(p *sweepPoint) float64 { return p.P99 }),
			sweepSeries("batched p50", "#2ca02c", true, br.Batched, func(p *sweepPoint) float64 { return p.P50 }),
			sweepSeries("batched p99", "#9467bd", true, br.Batched, func(p *sweepPoint) float64 { return p.P99 }),
		},
	})
	if !o.dryRun {
		if err := os.WriteFile(inRepo(o, o.batchChart), []byte(svg), 0o644); err != nil {
			return err
		}
		logf("wrote %s", o.batchChart)
	}
	return writeSection(o, "batch-"+o.device, b.String(), br)
}
