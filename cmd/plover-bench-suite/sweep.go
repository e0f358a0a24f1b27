package main

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/plover-run/plover/bench"
)

// sweepResult is latency against offered load on one warm server.
type sweepResult struct {
	Function  string    `json:"function"`
	Note      string    `json:"note,omitempty"`
	Fractions []float64 `json:"fractions"`
	// Capacity is the closed-loop throughput at ProbeConcurrency: the
	// rates are fractions of it.
	Capacity         float64      `json:"capacity_per_s"`
	ProbeConcurrency int          `json:"probe_concurrency"`
	MaxInFlight      int          `json:"max_in_flight"`
	Seconds          float64      `json:"seconds_per_rate"`
	Points           []sweepPoint `json:"points"`
}

type sweepPoint struct {
	Offered  float64 `json:"offered_per_s"`
	Achieved float64 `json:"achieved_per_s"`
	P50      float64 `json:"p50_ms"`
	P90      float64 `json:"p90_ms"`
	P99      float64 `json:"p99_ms"`
	Max      float64 `json:"max_ms"`
	Sent     int64   `json:"sent"`
	Late     int64   `json:"late"`
	Unsent   int64   `json:"unsent"`
	Errors   int64   `json:"errors"`
	WakeLag  float64 `json:"wake_lag_mean_ms"`
}

// saturated marks a point where the schedule was not kept: over 1% of the
// requests due were never sent, or any failed.
func (p *sweepPoint) saturated() bool {
	return p.Errors > 0 || float64(p.Unsent) > 0.01*float64(p.Sent+p.Unsent)
}

// probeConcurrency is the closed-loop load that finds the server's
// throughput: the server's default instance cap (4), so every instance is
// busy.
const (
	probeConcurrency = 4
	sweepInFlight    = 64
)

func runSweep(ctx context.Context, o *options, url string, w *workload, sw *sweepResult) error {
	logf("%s: throughput probe, closed loop, %d connections, %v", w.Name, probeConcurrency, o.probe)
	res, err := bench.Run(ctx, bench.Config{Server: url, Function: w.Name, Input: w.Input, Concurrency: probeConcurrency,
		Duration: o.probe, Requests: 10_000_000, Timeout: time.Minute})
	if err != nil {
		return err
	}
	if res.Throughput <= 0 {
		return fmt.Errorf("probe: no throughput (%+v)", res.Errors)
	}
	sw.Capacity, sw.ProbeConcurrency, sw.MaxInFlight, sw.Seconds = res.Throughput, probeConcurrency, sweepInFlight, o.sweepTime.Seconds()
	for _, f := range sw.Fractions {
		rate := roundRate(f * sw.Capacity)
		logf("%s: open loop at %g req/s (%.0f%% of %.0f) for %v", w.Name, rate, 100*f, sw.Capacity, o.sweepTime)
		p, err := openLoop(ctx, url, w, rate, o.sweepTime)
		if err != nil {
			return err
		}
		sw.Points = append(sw.Points, p)
	}
	return nil
}

// openLoop offers w at rate requests/s for d, at most sweepInFlight at once.
func openLoop(ctx context.Context, url string, w *workload, rate float64, d time.Duration) (sweepPoint, error) {
	r, err := bench.Run(ctx, bench.Config{Server: url, Function: w.Name, Input: w.Input, Rate: rate,
		Concurrency: sweepInFlight, Duration: d, Requests: int64(rate*d.Seconds()) + 10, Timeout: time.Minute})
	if err != nil {
		return sweepPoint{}, err
	}
	p := sweepPoint{Offered: rate, Achieved: r.Throughput, P50: r.Latency.P50, P90: r.Latency.P90, P99: r.Latency.P99,
		Max: r.Latency.Max, Sent: r.Open.Sent, Late: r.Open.Late, Unsent: r.Open.Unsent, WakeLag: r.Open.WakeLagMeanMs}
	for _, e := range r.Errors {
		p.Errors += e.Count
	}
	return p, nil
}

// roundRate keeps two significant digits: rates in the table read as
// 1200/s, not 1187.3/s.
func roundRate(r float64) float64 {
	if r <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(r))-1)
	return math.Max(1, math.Round(r/p)*p)
}
