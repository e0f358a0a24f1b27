package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/plover-run/plover/bench"
)

// The transports benchmark (--transports): the CNN, hot, one client,
// through HTTP (/v1 invoke, octet-stream) and through gRPC (ModelInfer,
// raw contents) on one server, in alternating blocks, so that both see
// the same machine. Per request: the client's latency and the server's
// own total (Server-Timing, or gRPC's server-timing metadata); their
// difference is what the transport costs.
const (
	transBlock  = 500
	transRounds = 8
)

type transRun struct {
	Name   string    `json:"name"`
	Client []float64 `json:"client_ms"`
	Server []float64 `json:"server_ms"`
}

func runTransports(ctx context.Context, o *options, res *results) error {
	data, err := os.MkdirTemp("", "plover-bench-transports-")
	if err != nil {
		return err
	}
	defer removeAll(data)
	srv, err := startServer(o.plover, data, o.device, o.isolation, "--grpc-listen", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer srv.stop()
	gaddr, err := srv.grpcAddr()
	if err != nil {
		return err
	}
	dir := filepath.Join(o.samples, "cnn-"+o.suffix)
	if err := deployDir(ctx, o.plover, dir, srv.url); err != nil {
		return err
	}
	in := make([]byte, 3136)
	runs := []*transRun{{Name: "HTTP /v1 invoke (octet-stream)"}, {Name: "gRPC ModelInfer (raw contents)"}}
	cfgs := []bench.Config{{Server: srv.url}, {Server: srv.url, GRPC: gaddr}}
	logf("transports: the CNN hot over HTTP and gRPC, %d blocks of %d each", transRounds, transBlock)
	if err := alternate(ctx, runs, cfgs, in); err != nil {
		return err
	}
	res.LoadAfterRuns = loadAvg()
	return writeTransports(o, res, runs)
}

func writeTransports(o *options, res *results, runs []*transRun) error {
	var b strings.Builder
	fmt.Fprintf(&b, "## Transports: the CNN over HTTP and gRPC (%s device)\n\n", o.device)
	fmt.Fprintf(&b, "Command: `%s`. The CNN (`samples/cnn`), hot, one client with one connection, %d requests each way in alternating blocks of %d after a warm-up block, on one server (--isolation %s).\n\n",
		res.Command, transBlock*transRounds, transBlock, o.isolation)
	b.WriteString(runMachine(res, res.Machine.Plover))
	writeHotTable(&b, "route", "client − server p50 ms", runs, func(r *transRun) string { return fmtMs(median(diffs(r.Client, r.Server))) })
	h, g := runs[0], runs[1]
	fmt.Fprintf(&b, "\n- gRPC hot p50 against HTTP: %s (target ≤ 1.3×); p99 %s; the server's own time %s.\n\n",
		ratio(median(g.Client), median(h.Client)), ratio(quantile(g.Client, 0.99), quantile(h.Client, 0.99)), ratio(median(g.Server), median(h.Server)))
	return writeSection(o, "transports-"+o.device, b.String(), runs)
}

// diffs is a[i] - b[i], per request.
func diffs(a, b []float64) []float64 {
	d := make([]float64, min(len(a), len(b)))
	for i := range d {
		d[i] = a[i] - b[i]
	}
	return d
}

// runTracing (--tracing) measures what tracing costs: the CNN hot, one
// client, on three servers running side by side in alternating blocks:
// tracing off, on with every request unsampled (OTEL_TRACES_SAMPLER
// always_off), and on with every request sampled (always_on), exporting
// over OTLP/HTTP to a sink in this process that reads and drops the spans.
func runTracing(ctx context.Context, o *options, res *results) error {
	sink := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-protobuf")
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go sink.Serve(ln)
	defer sink.Close()
	otlp := "OTEL_EXPORTER_OTLP_ENDPOINT=http://" + ln.Addr().String()
	modes := []struct {
		name string
		env  []string
	}{
		{"tracing off", []string{"OTEL_SDK_DISABLED=true"}}, // whatever this process's environment says
		{"tracing on, unsampled (always_off)", []string{otlp, "OTEL_TRACES_SAMPLER=always_off"}},
		{"tracing on, sampled (always_on)", []string{otlp, "OTEL_TRACES_SAMPLER=always_on"}},
	}
	dir := filepath.Join(o.samples, "cnn-"+o.suffix)
	var runs []*transRun
	var cfgs []bench.Config
	for _, m := range modes {
		data, err := os.MkdirTemp("", "plover-bench-tracing-")
		if err != nil {
			return err
		}
		defer removeAll(data)
		srv, err := startServerEnv(o.plover, data, o.device, o.isolation, m.env)
		if err != nil {
			return err
		}
		defer srv.stop()
		if err := deployDir(ctx, o.plover, dir, srv.url); err != nil {
			return err
		}
		runs = append(runs, &transRun{Name: m.name})
		cfgs = append(cfgs, bench.Config{Server: srv.url})
	}
	logf("tracing: the CNN hot with tracing off, on unsampled and on sampled, %d blocks of %d each", transRounds, transBlock)
	if err := alternate(ctx, runs, cfgs, make([]byte, 3136)); err != nil {
		return err
	}
	var plain []*plainRun
	if o.tracingBefore != "" {
		var err error
		if plain, err = plainCost(ctx, o, []string{o.plover, o.tracingBefore}, dir, make([]byte, 3136)); err != nil {
			return err
		}
	}
	res.LoadAfterRuns = loadAvg()
	var b strings.Builder
	fmt.Fprintf(&b, "## Tracing: what OpenTelemetry costs (%s device)\n\n", o.device)
	fmt.Fprintf(&b, "Command: `%s`. The CNN (`samples/cnn`), hot, one client, %d requests on each of three servers running side by side, in alternating blocks of %d after a warm-up block (--isolation %s); spans exported over OTLP/HTTP to a local sink that drops them.\n\n",
		res.Command, transBlock*transRounds, transBlock, o.isolation)
	b.WriteString(runMachine(res, res.Machine.Plover))
	writeHotTable(&b, "server", "client p50 against off", runs, func(r *transRun) string { return ratio(median(r.Client), median(runs[0].Client)) })
	b.WriteString("\n")
	writePlain(&b, plain, "Tracing off against a build without tracing", "Tracing off against no tracing at all")
	return writeSection(o, "tracing-"+o.device, b.String(), map[string]any{"modes": runs, "before": plain})
}

// writeHotTable writes one row per run: its name (column first), client
// p50 and p99, server p50, and the column last says.
func writeHotTable(b *strings.Builder, first, last string, runs []*transRun, lastOf func(*transRun) string) {
	fmt.Fprintf(b, "| %s | client p50 ms | client p99 ms | server total p50 ms | %s |\n|---|---|---|---|---|\n", first, last)
	for _, r := range runs {
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s |\n", r.Name, fmtMs(median(r.Client)), fmtMs(quantile(r.Client, 0.99)), fmtMs(median(r.Server)), lastOf(r))
	}
}

// alternate runs each config's CNN requests in blocks, in turn, one
// warm-up round first, recording client and server time per request.
func alternate(ctx context.Context, runs []*transRun, cfgs []bench.Config, in []byte) error {
	for round := 0; round <= transRounds && ctx.Err() == nil; round++ {
		for i, c := range cfgs {
			var mu sync.Mutex
			r := runs[i]
			c.Function, c.Input, c.Concurrency, c.Requests, c.Duration, c.Timeout = "cnn", in, 1, transBlock, time.Minute, time.Minute
			if round > 0 { // round 0 warms every path up
				c.Observe = func(s *bench.Sample) {
					mu.Lock()
					r.Client = append(r.Client, ms(s.Latency))
					r.Server = append(r.Server, ms(s.Timing.Dur[bench.Total]))
					mu.Unlock()
				}
			}
			b, err := bench.Run(ctx, c)
			if err != nil {
				return err
			}
			if b.OK != transBlock {
				return fmt.Errorf("%s: %d of %d requests succeeded: %+v", r.Name, b.OK, transBlock, b.Errors)
			}
		}
	}
	return ctx.Err()
}
