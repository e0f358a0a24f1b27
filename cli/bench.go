package cli

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/plover-run/plover/bench"
	"github.com/plover-run/plover/fileutil"
)

// maxGeneratedInput bounds --size: the input is held in memory once and
// shared by every connection.
const maxGeneratedInput = 1 << 30

// rateFlag accepts "500" or "500/s".
type rateFlag float64

func (r *rateFlag) String() string { return strconv.FormatFloat(float64(*r), 'g', -1, 64) }

func (r *rateFlag) Set(s string) error {
	v, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(s), "/s"), 64)
	if err != nil || v <= 0 || v > 1e7 {
		return errors.New("want requests per second, e.g. 500 or 500/s")
	}
	*r = rateFlag(v)
	return nil
}

type benchFlags struct {
	ep                endpoint
	in                string
	size              int64
	concurrency       int
	rate              rateFlag
	duration, timeout time.Duration
	requests          int64
	warmup            int64
	maxErrors         int64
	asJSON            bool
	grpc              string
	chart             string
}

func benchCmd() *command {
	var f benchFlags
	return &command{
		nargs: 1,
		named: true,
		name:  "bench", summary: "load-test a function: latency percentiles, errors, the server's timing breakdown",
		complete: f.ep.completeFunctions,
		usage:    "NAME [--concurrency N | --rate R/s] [--duration 10s] [--requests N] [--in FILE | --size BYTES] [--warmup N] [--max-errors N] [--chart FILE.svg] [--json]",
		example: "  plover bench vecadd --in build/samples/vecadd-input.bin --concurrency 4 --duration 10s\n" +
			"  plover bench cnn --size 3136 --rate 500/s --duration 5s          # open loop at 500 requests/s\n" +
			"  plover bench cnn --size 3136 --requests 1000 --json | jq .latency_ms\n" +
			"  plover bench cnn --size 3136 --grpc grpc://127.0.0.1:8001           # through gRPC ModelInfer\n" +
			"  plover bench cnn --size 3136 --duration 5s --chart cnn-latency.svg   # and the latency histogram as an SVG chart\n" +
			"  plover bench cnn --size 3136 --requests 1000 --max-errors 0          # in CI: exit 1 if any request failed\n" +
			"  plover bench cnn --size 3136 --requests 50 --warmup 5                # the cold start left out of the figures",
		flags: func(fs *flag.FlagSet) {
			f.ep.serverFlag(fs)
			fs.StringVar(&f.in, "in", "", "input file sent as every request's body, - for stdin")
			fs.Int64Var(&f.size, "size", 0, "send this many random bytes instead of --in")
			fs.IntVar(&f.concurrency, "concurrency", 0, "connections: the closed loop's requests in flight, or the open loop's limit on them (default 1, or 64 with --rate); in the closed loop a connection answered 429 or 503 with Retry-After waits that long (to --duration's end at most) before its next request, and the report counts such answers as shed")
			fs.Var(&f.rate, "rate", "open loop: send this many requests per second (e.g. 500/s) whatever the latency or the answers, measuring each from its scheduled time; a Retry-After is not waited for (the offered load is the rate), its answers are counted as shed")
			fs.DurationVar(&f.duration, "duration", bench.DefaultDuration, "stop after this long (or at --requests, whichever comes first)")
			fs.Int64Var(&f.requests, "requests", bench.DefaultRequests, "stop after this many requests (or at --duration, whichever comes first)")
			fs.Int64Var(&f.warmup, "warmup", 0, "send this many requests, one after another, before the timed run: in no figure but their own count, so that the first request's cold start (the function's load, the connection's setup) is not in the latency (0: none, the cold start counted as before)")
			fs.DurationVar(&f.timeout, "timeout", bench.DefaultTimeout, "per-request timeout (requests in flight at --duration may finish up to this much later)")
			fs.Int64Var(&f.maxErrors, "max-errors", -1, "exit 1 (after the report) when more than this many requests end without a 2xx answer: 429s (busy, rate_limited), 5xx, no answer, the shed ones (429/503 with Retry-After) included, for a request shed is one not served; 0 fails on any (-1: no bound, the run fails only when no request succeeded)")
			fs.BoolVar(&f.asJSON, "json", false, "print the result as JSON on stdout")
			fs.StringVar(&f.chart, "chart", "", "also write the client latency histogram as an SVG chart to this file (bars over a log latency axis, p50/p90/p99 marked)")
			fs.StringVar(&f.grpc, "grpc", "", "send the requests over gRPC (the Open Inference Protocol's ModelInfer, the input split raw into the model's inputs) to this address of plover serve --grpc-listen: grpc://HOST:PORT, or grpcs://HOST:PORT for TLS (--cacert)")
		},
		run: func(fs *flag.FlagSet, args []string, env *Env) error {
			return runBench(args[0], &f, env)
		},
	}
}

func runBench(name string, f *benchFlags, env *Env) error {
	// Command-line mistakes are usage errors (exit 2), found before any
	// input is read or request sent.
	switch {
	case f.size < 0 || f.size > maxGeneratedInput:
		return usagef(env, "bench", "--size %d: want 1..%d bytes", f.size, maxGeneratedInput)
	case (f.in != "") == (f.size > 0):
		return usagef(env, "bench", "give the input with --in FILE or --size BYTES (one of them)")
	case f.duration <= 0:
		return usagef(env, "bench", "--duration %v: want a positive duration: a run is always bounded", f.duration)
	case f.requests <= 0:
		return usagef(env, "bench", "--requests %d: want 1 or more: a run is always bounded", f.requests)
	case f.concurrency < 0 || f.concurrency > 10000:
		return usagef(env, "bench", "--concurrency %d: want 1..10000 (or 0: 1, or 64 with --rate)", f.concurrency)
	case f.timeout <= 0:
		return usagef(env, "bench", "--timeout %v: want a positive duration", f.timeout)
	case f.warmup < 0:
		return usagef(env, "bench", "--warmup %d: want 0 or more requests", f.warmup)
	case f.maxErrors < -1:
		return usagef(env, "bench", "--max-errors %d: want 0 or more (or -1: no bound)", f.maxErrors)
	case f.grpc != "" && !grpcAddress(f.grpc):
		return usagef(env, "bench", "--grpc %q: want grpc://HOST:PORT, or grpcs://HOST:PORT for TLS", f.grpc)
	}
	// An unwritable --chart fails now, not after the whole run.
	chart, err := openChart(f.chart)
	if err != nil {
		return err
	}
	defer chart.discard()
	var input []byte
	if f.in != "" {
		if input, err = readInput(f.in, env); err != nil {
			return err
		}
	} else {
		input = make([]byte, f.size)
		rand.Read(input)
	}
	ctx, stop := interruptible(env)
	defer stop()
	tc, err := tlsConfig(f.ep.cacert)
	if err != nil {
		return err
	}
	cfg := bench.Config{
		Server: serverURL(f.ep.server), Function: name, Input: input, Concurrency: f.concurrency,
		Rate: float64(f.rate), Duration: f.duration, Requests: f.requests, Timeout: f.timeout,
		Token: f.ep.token, TLS: tc, GRPC: f.grpc, Warmup: f.warmup,
	}
	finish := benchProgress(&cfg, env)
	res, err := bench.Run(ctx, cfg)
	finish()
	if res == nil {
		return err
	}
	if f.asJSON {
		if err := printJSON(env.Stdout, res); err != nil {
			return err
		}
	} else if err := res.WriteText(env.Stdout); err != nil {
		return err
	}
	if err != nil {
		return fmt.Errorf("%w (start one with 'plover serve', or set --server / PLOVER_SERVER)", err)
	}
	if chart != nil {
		svg := bench.HistogramSVG(res)
		if svg == "" {
			fmt.Fprintf(env.Stderr, "--chart: not written: no request succeeded, so there is no latency to draw\n")
		} else if err := chart.write(svg); err != nil {
			return fmt.Errorf("--chart: %w", err)
		} else {
			fmt.Fprintf(env.Stderr, "latency chart: %s\n", f.chart)
		}
	}
	if res.OK == 0 {
		return errors.New("no request succeeded")
	}
	var failed int64
	for _, e := range res.Errors {
		failed += e.Count
	}
	if f.maxErrors >= 0 && failed > f.maxErrors {
		shed := ""
		if res.Shed > 0 {
			shed = fmt.Sprintf("%d of them shed with Retry-After; ", res.Shed)
		}
		return fmt.Errorf("%d of %d requests failed (%sthe report lists their errors), more than --max-errors %d", failed, res.Requests, shed, f.maxErrors)
	}
	return nil
}

// grpcAddress says whether s is an address --grpc takes: grpc:// or
// grpcs:// and a host.
func grpcAddress(s string) bool {
	u, err := url.Parse(s)
	return err == nil && u.Host != "" && (u.Scheme == "grpc" || u.Scheme == "grpcs")
}

// benchProgress draws a bar on a terminal: the fraction of the run done,
// by whichever bound (time or requests) is nearer.
func benchProgress(cfg *bench.Config, env *Env) (finish func()) {
	if !env.StderrIsTerminal {
		return func() {}
	}
	const steps = 1000
	bar := progressbar.NewOptions(steps,
		progressbar.OptionSetWriter(env.Stderr),
		progressbar.OptionSetDescription("bench "+cfg.Function),
		progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionClearOnFinish(),
	)
	cfg.Progress = func(done int64, elapsed time.Duration) {
		frac := max(float64(elapsed)/float64(cfg.Duration), float64(done)/float64(cfg.Requests))
		bar.Describe(fmt.Sprintf("bench %s: %d requests, %.0f/s", cfg.Function, done, float64(done)/max(elapsed.Seconds(), 1e-9)))
		bar.Set(int(min(frac, 1) * steps))
	}
	return func() { bar.Finish() }
}

// chartFile is --chart's file, opened before the run so that a path that
// cannot be written fails at once. A file it created is removed again
// unless a chart is written into it.
type chartFile struct {
	f       *os.File
	path    string // --chart's, for messages
	target  string // the file it names, its links followed: what write replaces
	created bool
	written bool
}

func openChart(path string) (*chartFile, error) {
	if path == "" {
		return nil, nil
	}
	_, statErr := os.Stat(path)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("--chart: %w", err)
	}
	c := &chartFile{f: f, path: path, target: linkTarget(path), created: os.IsNotExist(statErr)}
	// The chart goes in through a temporary file beside it (write): a
	// directory where none can be made fails now too.
	tmp, err := os.CreateTemp(filepath.Dir(c.target), fileutil.TempPattern(c.target))
	if err != nil {
		c.discard()
		return nil, fmt.Errorf("--chart %s: no temporary file can be made beside it to write the chart through: %w", path, err)
	}
	tmp.Close()
	os.Remove(tmp.Name())
	return c, nil
}

// write replaces the file with svg whole, through a temporary file beside
// it renamed over it, at the file's mode: written in place, a disk that
// filled mid-write left part of the new chart where the old one was.
func (c *chartFile) write(svg string) error {
	perm := os.FileMode(0o644)
	if fi, err := c.f.Stat(); err == nil {
		perm = fi.Mode().Perm()
	}
	c.f.Close()
	err := fileutil.WriteAtomic(c.target, []byte(svg), perm)
	if err != nil && !errors.Is(err, fileutil.ErrNotDurable) {
		return fmt.Errorf("%w (%s left as it was)", err, c.path)
	}
	c.written = true // in place, if not durably
	return err
}

// discard closes the file, and removes it if the run created it and wrote
// no chart.
func (c *chartFile) discard() {
	if c == nil || c.written {
		return
	}
	c.f.Close()
	if c.created {
		os.Remove(c.f.Name())
	}
}

// interruptible is a context that the first Ctrl-C ends: the run stops,
// though the requests in flight have up to --timeout to finish, and the
// report follows. The command says so, and lets go of the signal: a second
// Ctrl-C ends plover at once instead of waiting on a server that hangs.
func interruptible(env *Env) (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt)
	done := make(chan struct{})
	go func() {
		select {
		case <-sig:
			signal.Stop(sig)
			fmt.Fprintln(env.Stderr, "\ninterrupted: waiting for the requests in flight (at most --timeout), then the report; ^C again to quit now")
			cancel()
		case <-done:
		}
	}()
	return ctx, func() {
		signal.Stop(sig)
		close(done)
		cancel()
	}
}
