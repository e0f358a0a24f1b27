package main

import (
	"context"
	"fmt"
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
	srv.mu.Lock()
	gaddr := srv.grpc
	srv.mu.Unlock()
	if gaddr == "" {
		return fmt.Errorf("the server logged no gRPC address:\n%s", srv.logTail())
	}
	dir := filepath.Join(o.samples, "cnn-"+o.suffix)
	if err := deployDir(ctx, o.plover, dir, srv.url); err != nil {
		return err
	}
	in := make([]byte, 3136)
	runs := []*transRun{{Name: "HTTP /v1 invoke (octet-stream)"}, {Name: "gRPC ModelInfer (raw contents)"}}
	cfgs := []bench.Config{{Server: srv.url}, {Server: srv.url, GRPC: gaddr}}
	logf("transports: the CNN hot over HTTP and gRPC, %d blocks of %d each", transRounds, transBlock)
	for round := 0; round <= transRounds && ctx.Err() == nil; round++ {
		for i, c := range cfgs {
			var mu sync.Mutex
			r := runs[i]
			c.Function, c.Input, c.Concurrency, c.Requests, c.Duration, c.Timeout = "cnn", in, 1, transBlock, time.Minute, time.Minute
			if round > 0 { // round 0 warms both paths up
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
	res.LoadAfterRuns = loadAvg()
	return writeTransports(o, res, runs)
}

func writeTransports(o *options, res *results, runs []*transRun) error {
	var b strings.Builder
	fmt.Fprintf(&b, "## Transports: the CNN over HTTP and gRPC (%s device)\n\n", o.device)
	fmt.Fprintf(&b, "Command: `%s`. The CNN (`samples/cnn`), hot, one client with one connection, %d requests each way in alternating blocks of %d after a warm-up block, on one server (--isolation %s).\n\n",
		res.Command, transBlock*transRounds, transBlock, o.isolation)
	fmt.Fprintf(&b, "Machine: %s; %s; started %s; load %s → %s.\n\n", res.Machine.CPU, res.Machine.Plover, res.Started.Format("2006-01-02 15:04 UTC"), res.LoadBefore, res.LoadAfterRuns)
	b.WriteString("| route | client p50 ms | client p99 ms | server total p50 ms | client − server p50 ms |\n|---|---|---|---|---|\n")
	for _, r := range runs {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", r.Name, fmtMs(median(r.Client)), fmtMs(quantile(r.Client, 0.99)), fmtMs(median(r.Server)),
			fmtMs(median(diffs(r.Client, r.Server))))
	}
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
