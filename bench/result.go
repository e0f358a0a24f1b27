package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"time"
)

// Result summarises a run. Times are in milliseconds.
type Result struct {
	Function      string  `json:"function"`
	Server        string  `json:"server"`
	Mode          string  `json:"mode"` // "closed" or "open"
	Concurrency   int     `json:"concurrency"`
	Rate          float64 `json:"rate_per_s,omitempty"` // offered load, open loop
	InputBytes    int     `json:"input_bytes"`
	DurationLimit float64 `json:"duration_limit_s"`
	RequestLimit  int64   `json:"request_limit"`
	// Warmup is the untimed requests sent before the run (Config.Warmup),
	// in no other figure; WarmupFailed, those of them without a 2xx
	// answer.
	Warmup       int64 `json:"warmup,omitempty"`
	WarmupFailed int64 `json:"warmup_failed,omitempty"`
	// Stopped says which bound ended the run: "requests", "duration",
	// "interrupted", or "errors" (the server never answered).
	Stopped string `json:"stopped"`
	// Elapsed is the run as its loop ran it: from the start to the last
	// response, or to the last connection's stop where that came later (a
	// closed-loop connection waiting out a Retry-After to --duration's end,
	// or an interrupt). A run stopped by --requests ends at its last
	// answer.
	Elapsed float64 `json:"elapsed_s"`
	// Requests is every request that ended, with a response or not.
	Requests int64 `json:"requests"`
	OK       int64 `json:"ok"`
	// Throughput is successful (2xx) requests per second of Elapsed.
	Throughput float64 `json:"throughput_per_s"`
	// Errors counts non-2xx responses by status; status 0 is a request
	// that got no HTTP response (connection refused, timeout).
	Errors []ErrorCount `json:"errors"`
	// Shed is how many of Errors' 429s and 503s carried a Retry-After:
	// a server shedding load, not failing. They stay in Errors (a request
	// shed is a request not served). RetryAfterWait is the seconds the
	// closed loop's connections spent waiting them out, summed over the
	// connections; the open loop does not wait, so it is 0 there.
	Shed           int64   `json:"shed"`
	RetryAfterWait float64 `json:"retry_after_wait_s"`
	// Latency is client-side, over 2xx responses: from the send (closed
	// loop) or the scheduled send time (open loop) to the whole response.
	Latency Summary `json:"latency_ms"`
	// LatencyHistogram is the same latencies in at most HistogramBins
	// bins spaced evenly on a log scale, with round edges.
	LatencyHistogram []Bin `json:"latency_histogram,omitempty"`
	// Timing is the Server-Timing breakdown of the 2xx responses.
	Timing ServerSummary `json:"server_ms"`
	Starts Starts        `json:"starts"`
	Open   *OpenLoop     `json:"open_loop,omitempty"`
}

// ErrorCount is the number of requests that ended with one status.
type ErrorCount struct {
	Status  int    `json:"status"`
	Count   int64  `json:"count"`
	Message string `json:"message,omitempty"` // the first one seen
}

// Summary describes a distribution, in milliseconds. Percentiles come from
// a histogram with 0.4% resolution; Mean and Max are exact.
type Summary struct {
	N    int64   `json:"n"`
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p999"`
	Max  float64 `json:"max"`
}

// ServerSummary is the Server-Timing breakdown; Responses is how many 2xx
// responses carried a complete header. An optional metric (sched, resolve,
// dispatch, handoff, handback) sums up only the responses that carried it:
// N 0 when the server sends none (older servers; handoff and handback only
// come from runs in worker processes).
type ServerSummary struct {
	Responses int64   `json:"responses"`
	Queue     Summary `json:"queue"`
	Load      Summary `json:"load"`
	CopyIn    Summary `json:"copyin"`
	Kernels   Summary `json:"kernels"`
	CopyOut   Summary `json:"copyout"`
	Total     Summary `json:"total"`
	Sched     Summary `json:"sched"`
	Resolve   Summary `json:"resolve"`
	Dispatch  Summary `json:"dispatch"`
	Handoff   Summary `json:"handoff"`
	Handback  Summary `json:"handback"`
}

// Metric returns the summary of Server-Timing metric i (Queue..Handback).
func (s *ServerSummary) Metric(i int) *Summary {
	return [...]*Summary{&s.Queue, &s.Load, &s.CopyIn, &s.Kernels, &s.CopyOut, &s.Total, &s.Sched, &s.Resolve, &s.Dispatch, &s.Handoff, &s.Handback}[i]
}

// Starts counts X-Plover-Start values of 2xx responses.
type Starts struct {
	Cold    int64 `json:"cold"`
	Warm    int64 `json:"warm"`
	Hot     int64 `json:"hot"`
	Missing int64 `json:"missing,omitempty"`
}

// OpenLoop reports how well the schedule was kept.
type OpenLoop struct {
	// Scheduled is the requests due within the run (rate × duration,
	// bounded by the request limit); of a run interrupted or stopped by
	// errors, those due before it was.
	Scheduled int64 `json:"scheduled"`
	Sent      int64 `json:"sent"`
	// Late were sent more than LateSlack after their scheduled time
	// because every connection was busy (or the client fell behind).
	Late int64 `json:"late"`
	// Unsent were due before the end but could not be sent by then; their
	// latency is in no percentile, so a nonzero count means the offered
	// load was above what the server (or client) sustained.
	Unsent   int64   `json:"unsent"`
	MaxLagMs float64 `json:"max_lag_ms"`
	// WakeLag is how late workers that were waiting for a request's time
	// woke up (the client's timer, not counted as latency up to
	// MaxWakeLag).
	WakeLagMeanMs float64 `json:"wake_lag_mean_ms"`
	WakeLagMaxMs  float64 `json:"wake_lag_max_ms"`
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

func summarize(h *Histogram) Summary {
	if h.Count() == 0 {
		return Summary{}
	}
	return Summary{N: h.Count(), Mean: ms(h.Mean()), P50: ms(h.Quantile(0.50)), P90: ms(h.Quantile(0.90)),
		P99: ms(h.Quantile(0.99)), P999: ms(h.Quantile(0.999)), Max: ms(h.Max())}
}

func (r *run) result() *Result {
	c := &r.cfg
	res := &Result{
		Function: c.Function, Server: c.Server, Mode: "closed", Concurrency: c.Concurrency,
		InputBytes: len(c.Input), DurationLimit: c.Duration.Seconds(), RequestLimit: c.Requests,
		Warmup: r.warmSent, WarmupFailed: r.warmFailed,
		Stopped: r.stopped, Elapsed: time.Duration(max(r.lastEnd.Load(), r.lastExit.Load())).Seconds(),
		Requests: r.done.Load(), OK: r.ok.Load(), Latency: summarize(&r.latency), LatencyHistogram: r.latency.LogBins(HistogramBins),
		Shed: r.shed.Load(), RetryAfterWait: time.Duration(r.shedWait.Load()).Seconds(),
		Starts: Starts{Cold: r.starts[Cold].Load(), Warm: r.starts[Warm].Load(), Hot: r.starts[Hot].Load(), Missing: r.startNone.Load()},
	}
	if res.Elapsed > 0 {
		res.Throughput = float64(res.OK) / res.Elapsed
	}
	res.Timing.Responses = r.timed.Load()
	for i := range r.server {
		*res.Timing.Metric(i) = summarize(&r.server[i])
	}
	for code := range r.status {
		if n := r.status[code].Load(); n > 0 && (code < 200 || code > 299) {
			e := ErrorCount{Status: code, Count: n, Message: r.errBody[code]}
			if code == 0 && r.firstErr != nil {
				e.Message = r.firstErr.Error()
			}
			res.Errors = append(res.Errors, e)
		}
	}
	if n := r.other.Load(); n > 0 {
		res.Errors = append(res.Errors, ErrorCount{Status: -1, Count: n, Message: "status outside 100..599"})
	}
	if c.Rate > 0 {
		res.Mode, res.Rate = "open", c.Rate
		window := c.Duration
		if r.stopped == "interrupted" || r.stopped == "errors" {
			window = min(window, r.stopAt.Sub(r.start))
		}
		scheduled := min(c.Requests, r.dueWithin(window))
		sent := r.attempted.Load()
		res.Open = &OpenLoop{Scheduled: scheduled, Sent: sent, Late: r.late.Load(),
			Unsent: max(0, scheduled-sent), MaxLagMs: ms(time.Duration(r.maxLag.Load())),
			WakeLagMaxMs: ms(time.Duration(r.maxWake.Load()))}
		if n := r.slept.Load(); n > 0 {
			res.Open.WakeLagMeanMs = ms(time.Duration(r.wakeLag.Load() / n))
		}
	}
	return res
}

// errorMessage extracts the message of a Plover JSON error body, or the
// start of any other body.
func errorMessage(body []byte) string {
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error.Code != "" {
		return e.Error.Code + ": " + e.Error.Message
	}
	s := strings.TrimSpace(string(body))
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// FormatDuration prints milliseconds with a unit that keeps 3-4
// significant digits: 812µs, 3.41ms, 2.05s.
func FormatDuration(msec float64) string {
	switch {
	case math.IsNaN(msec):
		return "-"
	case msec == 0:
		return "0"
	case msec < 1:
		return fmt.Sprintf("%.3gµs", msec*1000)
	case msec < 1000:
		return fmt.Sprintf("%.3gms", msec)
	}
	return fmt.Sprintf("%.3gs", msec/1000)
}

// WriteText prints res as the human-readable report of plover bench.
func (res *Result) WriteText(w io.Writer) error {
	var b strings.Builder
	mode := fmt.Sprintf("closed loop, %d connection%s", res.Concurrency, plural(res.Concurrency))
	if res.Mode == "open" {
		mode = fmt.Sprintf("open loop at %g req/s, at most %d in flight", res.Rate, res.Concurrency)
	}
	fmt.Fprintf(&b, "%s at %s: %s, %d-byte input, stopped by %s\n", res.Function, res.Server, mode, res.InputBytes, stopWhy(res))
	if res.Warmup > 0 {
		fmt.Fprintf(&b, "warmup      %d untimed request%s before the run, in no figure below: %d failed\n", res.Warmup, plural(int(res.Warmup)), res.WarmupFailed)
	}
	shed := ""
	if res.Shed > 0 {
		shed = fmt.Sprintf(" (%d of them shed)", res.Shed)
	}
	fmt.Fprintf(&b, "requests    %d in %.2fs: %d ok, %d failed%s; throughput %.1f req/s\n",
		res.Requests, res.Elapsed, res.OK, res.Requests-res.OK, shed, res.Throughput)
	if res.Shed > 0 {
		if res.Mode == "open" {
			fmt.Fprintf(&b, "shed        %d answered 429/503 with Retry-After; the open loop keeps its schedule and did not wait\n", res.Shed)
		} else {
			fmt.Fprintf(&b, "shed        %d answered 429/503 with Retry-After; waited %.2fs for Retry-After in all (summed over connections; in the elapsed time, not in latency)\n",
				res.Shed, res.RetryAfterWait)
		}
	}
	fmt.Fprintf(&b, "starts      cold %d, warm %d, hot %d", res.Starts.Cold, res.Starts.Warm, res.Starts.Hot)
	if res.Starts.Missing > 0 {
		fmt.Fprintf(&b, ", no X-Plover-Start %d", res.Starts.Missing)
	}
	b.WriteString("\n")
	if o := res.Open; o != nil {
		fmt.Fprintf(&b, "schedule    %d due, %d sent, %d late (> %v behind), %d never sent; max lag %s; timer wake-up lag mean %s, max %s\n",
			o.Scheduled, o.Sent, o.Late, LateSlack, o.Unsent, FormatDuration(o.MaxLagMs), FormatDuration(o.WakeLagMeanMs), FormatDuration(o.WakeLagMaxMs))
		if o.Late > 0 || o.Unsent > 0 {
			b.WriteString("            latency counts from the scheduled send time, so it includes the wait for a connection\n")
		}
	}
	for _, e := range res.Errors {
		st := fmt.Sprint(e.Status)
		if e.Status == 0 {
			st = "no response"
		}
		fmt.Fprintf(&b, "error       %s × %d: %s\n", st, e.Count, e.Message)
	}
	b.WriteString("\n")
	if l := res.Latency; l.N > 0 {
		fmt.Fprintf(&b, "%-24s%9s%9s%9s%9s%9s%9s\n", "latency (client, 2xx)", "p50", "p90", "p99", "p99.9", "max", "mean")
		fmt.Fprintf(&b, "%-24s%9s%9s%9s%9s%9s%9s\n", "", quantileCell(0.50, l.P50, l.N), quantileCell(0.90, l.P90, l.N),
			quantileCell(0.99, l.P99, l.N), quantileCell(0.999, l.P999, l.N), FormatDuration(l.Max), FormatDuration(l.Mean))
		var maxed []string
		for _, q := range latencyQuantiles {
			if QuantileIsMax(q.q, l.N) {
				maxed = append(maxed, q.name)
			}
		}
		if len(maxed) > 0 {
			fmt.Fprintf(&b, "%-24s= max (n=%d): too few requests for %s, each only the slowest of them\n", "", l.N, strings.Join(maxed, ", "))
		}
		b.WriteString("\n")
	}
	writeHistogram(&b, res)
	if res.OK == 0 {
		b.WriteString("no successful response\n")
	} else if res.Timing.Responses == 0 {
		b.WriteString("server      no response carried a Server-Timing header\n")
	} else {
		fmt.Fprintf(&b, "%-24s%9s%9s%9s%9s   (%d responses)\n", "server (Server-Timing)", "mean", "p50", "p99", "max", res.Timing.Responses)
		for i, name := range MetricNames {
			if i == Handoff || i == Handback {
				name = "  " + name // parts of dispatch, the row above
			}
			s := res.Timing.Metric(i)
			if s.N == 0 { // a metric this server does not send: not a zero
				fmt.Fprintf(&b, "  %-22s%9s%9s%9s%9s\n", name, "-", "-", "-", "-")
				continue
			}
			fmt.Fprintf(&b, "  %-22s%9s%9s%9s%9s\n", name, FormatDuration(s.Mean), quantileCell(0.50, s.P50, s.N), quantileCell(0.99, s.P99, s.N), FormatDuration(s.Max))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// latencyQuantiles are the report's quantiles below the max.
var latencyQuantiles = []struct {
	name string
	q    float64
}{{"p50", 0.50}, {"p90", 0.90}, {"p99", 0.99}, {"p99.9", 0.999}}

// QuantileIsMax says whether quantile q of n values is, by nearest rank
// (the ceil(q·n)th smallest, as Histogram.Quantile takes it), the largest
// of them: p99 and p99.9 of 50 requests are the slowest one, a cold start
// among them, and no percentile.
func QuantileIsMax(q float64, n int64) bool {
	return n > 0 && int64(math.Ceil(q*float64(n))) >= n
}

// quantileCell is a report's cell for quantile q (ms) of n values: "= max"
// where it is only the largest of them.
func quantileCell(q, v float64, n int64) string {
	if QuantileIsMax(q, n) {
		return "= max"
	}
	return FormatDuration(v)
}

// HistogramBins bounds the bins of a Result's LatencyHistogram: rows of
// plover bench's text report, bars of its chart.
const HistogramBins = 16

// histogramWidth is the longest bar of the text histogram, in characters.
const histogramWidth = 40

// writeHistogram draws the latency distribution below the percentiles:
// a row per log-scaled bin, a bar of '#' in proportion to its count ('.'
// for a count too small for one), the count, its share, and the
// percentiles that fall in it.
func writeHistogram(b *strings.Builder, res *Result) {
	bins := res.LatencyHistogram
	if len(bins) == 0 || res.Latency.N == 0 {
		return
	}
	var peak int64
	for _, bin := range bins {
		peak = max(peak, bin.Count)
	}
	fmt.Fprintf(b, "latency distribution (client, 2xx; bins even on a log scale; the longest bar is %d requests)\n", peak)
	l := res.Latency
	for i := 0; i < len(bins); i++ {
		bin := bins[i]
		// A run of empty bins is one row: the gap, not its length.
		for bin.Count == 0 && i+1 < len(bins) && bins[i+1].Count == 0 {
			i++
			bin.HiMs = bins[i].HiMs
		}
		bar := int(math.Round(float64(bin.Count) * histogramWidth / float64(peak)))
		cells := strings.Repeat("#", bar)
		if bar == 0 && bin.Count > 0 {
			cells = "."
		}
		var marks []string
		for _, q := range []struct {
			name string
			v    float64
		}{{"p50", l.P50}, {"p90", l.P90}, {"p99", l.P99}, {"p99.9", l.P999}, {"max", l.Max}} {
			if q.v >= bin.LoMs && (q.v < bin.HiMs || i == len(bins)-1) {
				marks = append(marks, q.name)
			}
		}
		row := fmt.Sprintf("  %7s - %-7s |%-*s %7d %5.1f%%  %s", FormatDuration(bin.LoMs), FormatDuration(bin.HiMs), histogramWidth, cells,
			bin.Count, 100*float64(bin.Count)/float64(l.N), strings.Join(marks, " "))
		b.WriteString(strings.TrimRight(row, " ") + "\n")
	}
	b.WriteString("\n")
}

func stopWhy(res *Result) string {
	switch res.Stopped {
	case "requests":
		return fmt.Sprintf("--requests %d", res.RequestLimit)
	case "duration":
		return fmt.Sprintf("--duration %v", time.Duration(res.DurationLimit*float64(time.Second)))
	case "errors":
		return "errors (the server did not answer)"
	case "interrupted":
		return "an interrupt (^C)"
	}
	return res.Stopped
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
