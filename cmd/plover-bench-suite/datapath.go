package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/plover-run/plover/bench"
)

// The data-path benchmark (--datapath): vecadd with 4,000,000 bytes in and
// out, against an echo floor: a server in its own process that reads the
// same body, spins its thread's CPU for vecadd's kernel time (spinCPU) and
// answers the same bytes, so
// that the ratio is what Plover costs beyond receiving, computing and
// sending. One client (p50, p99) and four (throughput), in alternating
// rounds; with --datapath-before, an earlier build measured the same way in
// the same run.
const (
	dpRounds  = 4
	dpClients = 4
)

// Variables for the tests' sake.
var (
	dpRequests  int64 = 150             // per one-client block
	dpBlockTime       = 3 * time.Second // per four-client block
)

// echoFloorEnv starts this binary as the echo floor: ADDR,BURN[,SMALL] (a
// listen address and the CPU time to spin per request; with SMALL, a
// request whose body is under smallBody spins SMALL instead: one floor
// standing for two functions, --fair's sparse victim and its flood).
const echoFloorEnv = "PLOVER_BENCH_ECHO_FLOOR"

// runEchoFloorIfAsked serves the echo floor when this process was started
// as one, and never returns then.
func runEchoFloorIfAsked() {
	v := os.Getenv(echoFloorEnv)
	if v == "" {
		return
	}
	addr, burnS, _ := strings.Cut(v, ",")
	burnS, smallS, twoBurns := strings.Cut(burnS, ",")
	burn, err := time.ParseDuration(burnS)
	small := burn
	if err == nil && twoBurns {
		small, err = time.ParseDuration(smallS)
	}
	if _, ok := threadCPUTime(); err == nil && !ok {
		err = errors.New("no CLOCK_THREAD_CPUTIME_ID to spin a kernel's CPU time by")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "echo floor:", err)
		os.Exit(2)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "echo floor:", err)
		os.Exit(2)
	}
	fmt.Printf("listening %s\n", ln.Addr())
	srv := &fasthttp.Server{MaxRequestBodySize: 64 << 20, Handler: func(ctx *fasthttp.RequestCtx) {
		spin := burn
		if len(ctx.Request.Body()) < smallBody {
			spin = small
		}
		spinCPU(spin) // the kernel's time, of this thread's CPU
		ctx.SetContentType("application/octet-stream")
		ctx.Response.SetBodyRaw(ctx.Request.Body()) // the bytes it read, sent as they are
	}}
	srv.Serve(ln)
	os.Exit(0)
}

type dpTarget struct {
	Name   string    `json:"name"`
	url    string    // plover: a server; the floor: its base URL
	Client []float64 `json:"client_ms"`    // one client
	Thru   []float64 `json:"throughput_s"` // four clients, per block
	// Copied is plover_payload_copied_bytes_total per request over the
	// run (plover only; -1 when the build does not count it).
	Copied float64 `json:"copied_bytes_per_request"`
	served int64
	before float64 // the counter before the rounds
	counts bool    // the build counts copies
}

func runDatapath(ctx context.Context, o *options, res *results) error {
	w, err := vecaddWorkload(o.samples, o.suffix)
	if err != nil {
		return err
	}
	bins := []string{o.plover}
	names := []string{"plover (this build)"}
	for _, b := range strings.Fields(o.datapathBefore) {
		abs, err := filepath.Abs(b)
		if err != nil {
			return err
		}
		bins = append(bins, abs)
		names = append(names, "before: "+b)
	}
	var targets []*dpTarget
	var kernels float64
	for i, bin := range bins {
		data, err := os.MkdirTemp("", "plover-bench-datapath-")
		if err != nil {
			return err
		}
		defer removeAll(data)
		srv, err := startServer(bin, data, o.device, o.isolation)
		if err != nil {
			return err
		}
		defer srv.stop()
		if err := deployDir(ctx, bin, w.Dir, srv.url); err != nil {
			return err
		}
		t := &dpTarget{Name: names[i], url: srv.url}
		targets = append(targets, t)
		// Warm, and the kernel's time for the floor to spin.
		r, err := bench.Run(ctx, bench.Config{Server: srv.url, Function: "vecadd", Input: w.Input, Requests: 30, Duration: time.Minute, Timeout: time.Minute})
		if err != nil {
			return err
		}
		if i == 0 {
			kernels = r.Timing.Kernels.P50
		}
	}
	burn := time.Duration(kernels * float64(time.Millisecond))
	floor, stopFloor, err := startEchoFloor(burn, -1)
	if err != nil {
		return err
	}
	defer stopFloor()
	targets = append(targets, &dpTarget{Name: fmt.Sprintf("echo floor (reads, spins %s of CPU, answers the same bytes)", burn.Round(time.Microsecond)), url: floor, Copied: -1})
	for _, t := range targets[:len(bins)] {
		t.before, t.counts = copiedTotal(t.url)
	}
	logf("datapath: vecadd 4 MB in and out against an echo floor spinning %s, %d rounds", burn, dpRounds)
	if err := dpMeasure(ctx, targets, w); err != nil {
		return err
	}
	for _, t := range targets[:len(bins)] {
		t.Copied = -1
		if c, ok := copiedTotal(t.url); ok && t.counts && t.served > 0 {
			t.Copied = (c - t.before) / float64(t.served)
		}
	}
	res.LoadAfterRuns = loadAvg()
	return writeSection(o, "datapath-"+o.device, renderDatapath(o, res, targets, kernels), targets)
}

// dpMeasure runs dpRounds rounds, each target in turn, the order reversed
// in every other round so that whatever going first or last does to a
// target falls on each (the floor went last in every round until
// 2026-12-01): dpRequests requests from one client, then dpBlockTime of
// dpClients clients. A request that fails in either fails the run: its
// latency would be in no figure, and its block's throughput would count
// only the rest.
func dpMeasure(ctx context.Context, targets []*dpTarget, w *workload) error {
	for round := 0; round < dpRounds && ctx.Err() == nil; round++ {
		order := slices.Clone(targets)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, t := range order {
			var lat []float64
			r, err := bench.Run(ctx, bench.Config{Server: t.url, Function: "vecadd", Input: w.Input, Concurrency: 1, Requests: dpRequests, Duration: time.Minute, Timeout: time.Minute,
				Observe: func(s *bench.Sample) { lat = append(lat, ms(s.Latency)) }})
			if err != nil {
				return err
			}
			if r.OK != dpRequests {
				return fmt.Errorf("%s: %d of %d requests succeeded: %+v", t.Name, r.OK, dpRequests, r.Errors)
			}
			t.Client = append(t.Client, lat...)
			t.served += r.OK
			r, err = bench.Run(ctx, bench.Config{Server: t.url, Function: "vecadd", Input: w.Input, Concurrency: dpClients, Requests: 1 << 30, Duration: dpBlockTime, Timeout: time.Minute})
			if err != nil {
				return err
			}
			if r.OK != r.Requests {
				return fmt.Errorf("%s, %d clients: %d of %d requests succeeded: %+v", t.Name, dpClients, r.OK, r.Requests, r.Errors)
			}
			t.Thru = append(t.Thru, r.Throughput)
			t.served += r.OK
		}
	}
	return nil
}

// renderDatapath is the data path's section: each target against the
// echo floor (the last), and the targets met or missed.
func renderDatapath(o *options, res *results, targets []*dpTarget, kernels float64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "## The data path: vecadd 4 MB against an echo floor (%s device)\n\n", o.device)
	fmt.Fprintf(&b, "Command: `%s`. vecadd (`samples/vecadd`), 4,000,000 bytes in and out, --isolation %s, against an echo floor: a fasthttp server in its own process that reads the same body, spins for vecadd's kernel time (the server's own `kernels` p50, %s) and answers the bytes it read. The floor spins its thread's CPU time, so that it does a kernel's work however its thread is descheduled (from 2026-12-01; before, it spun the wall clock, and under load did less work than the kernel it stands for). %d rounds, each server in turn (the order reversed in every other round, from 2026-12-01), a failed request failing the run: %d requests from one client (p50, p99), then %s of %d clients (throughput).\n\n",
		res.Command, o.isolation, fmtMs(kernels), dpRounds, dpRequests, dpBlockTime, dpClients)
	b.WriteString(runMachine(res, res.Machine.Plover))
	fl := targets[len(targets)-1]
	b.WriteString("| server | 1 client p50 ms | p99 ms | p50 ÷ floor | 4 clients req/s | ÷ floor | payload copied per request |\n|---|---|---|---|---|---|---|\n")
	for _, t := range targets {
		copied := "-"
		if t.Copied >= 0 {
			copied = fmt.Sprintf("%.0f B", t.Copied)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %.0f | %s | %s |\n", t.Name, fmtMs(median(t.Client)), fmtMs(quantile(t.Client, 0.99)),
			ratio(median(t.Client), median(fl.Client)), median(t.Thru), ratio(median(t.Thru), median(fl.Thru)), copied)
	}
	p := targets[0]
	fmt.Fprintf(&b, "\n- Targets (issue \"The data path\"): p50 ≤ 1.3× the floor: %s (%s); 4-client throughput ≥ 0.8× the floor: %s (%s); payload copied 0 per request on the default path: %s.\n\n",
		ratio(median(p.Client), median(fl.Client)), metOrMissed(median(p.Client) <= 1.3*median(fl.Client)),
		ratio(median(p.Thru), median(fl.Thru)), metOrMissed(median(p.Thru) >= 0.8*median(fl.Thru)), copiedTarget(p.Copied))
	return b.String()
}

// copiedTarget is the payload-copy target's verdict on copied, the bytes
// copied per request (-1: a build that does not count them). Only up to
// 8 KiB is explained: that much of a body fasthttp reads with the
// headers, so a copy of it is no copy of the payload's path.
func copiedTarget(copied float64) string {
	n := strconv.FormatFloat(copied, 'f', -1, 64)
	if copied != math.Trunc(copied) {
		n = strconv.FormatFloat(copied, 'f', 1, 64) // a mean over the requests
	}
	switch {
	case copied < 0:
		return "n/a (this build does not count its copies)"
	case copied == 0:
		return "0 B per request, met"
	case copied <= 8192:
		return n + " B per request, missed: at most the first 8 KiB of each body, which fasthttp reads with the headers before any handler runs and copies once into the slot"
	}
	return n + " B per request, missed"
}

func metOrMissed(ok bool) string {
	if ok {
		return "met"
	}
	return "missed"
}

// smallBody is where an echo floor given two burns tells a small request
// (the CNN's 3,136 bytes) from a flood's (vecadd's 4 MB).
const smallBody = 1 << 20

// startEchoFloor runs this binary as the echo floor on a loopback port,
// spinning burn a request, or small for a body under smallBody (small < 0:
// burn for every request).
func startEchoFloor(burn, small time.Duration) (string, func(), error) {
	self, err := os.Executable()
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(self)
	spec := "127.0.0.1:0," + burn.String()
	if small >= 0 {
		spec += "," + small.String()
	}
	cmd.Env = append(os.Environ(), echoFloorEnv+"="+spec)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop := func() { cmd.Process.Kill(); cmd.Wait() }
	var line [128]byte
	n, err := out.Read(line[:])
	if err != nil {
		stop()
		return "", nil, fmt.Errorf("echo floor: %w", err)
	}
	addr := strings.TrimSpace(strings.TrimPrefix(string(line[:n]), "listening "))
	go io.Copy(io.Discard, out)
	return "http://" + addr, stop, nil
}

var copiedRE = regexp.MustCompile(`plover_payload_copied_bytes_total\{function="vecadd"\} (\S+)`)

// copiedTotal reads plover_payload_copied_bytes_total for vecadd (false: a
// build that does not count it).
func copiedTotal(url string) (float64, bool) {
	text, err := getText(context.Background(), url+"/metrics")
	if err != nil {
		return 0, false
	}
	b := []byte(text)
	if !strings.Contains(text, "plover_payload_copied_bytes_total") {
		return 0, false
	}
	m := copiedRE.FindSubmatch(b)
	if m == nil {
		return 0, true
	}
	f, err := strconv.ParseFloat(string(m[1]), 64)
	return f, err == nil
}
