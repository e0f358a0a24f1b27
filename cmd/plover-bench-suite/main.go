// Command plover-bench-suite is `make bench`: in one run on one machine it
// measures the sample functions the way PyPlover's tables do (load kernel,
// load constants, run, platform overhead, total; cold, warm and hot) against
// real `plover serve` processes on loopback, the same chains called in
// process through the device.Device interface, latency against offered load,
// and the hot-path Go benchmarks; then it rewrites its own marked section
// of BENCHMARKS.md and draws the latency chart.
//
// It needs no Go toolchain to run (only to run the Go benchmarks, which it
// skips without one), so a GPU machine can run binaries built elsewhere:
//
//	bin/plover-bench-suite --device cuda
//
// reads build/samples/*-cuda bundles and writes a separate "cuda" section.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/plover-run/plover/device"
)

type options struct {
	// pod is where the fair-nice modes' servers run (pod.go), made by
	// --fair's run.
	pod                                   pod
	repo, plover, device, suffix, samples string
	functions                             string
	trials                                int
	hot                                   time.Duration
	hotRequests                           int64
	probe, sweepTime                      time.Duration
	fractions                             string
	out, chart, jsonOut                   string
	goBench                               string
	isolation                             string
	dryRun                                bool
	batch                                 bool
	fair                                  bool
	burst, tenants                        bool
	tenantSizes                           tenantSizes
	tenantSplit                           bool
	burstBefore                           string
	pipeline                              bool
	pipelineBefore                        string
	transports, datapath                  bool
	datapathBefore                        string
	tracing                               bool
	tracingBefore                         string
	fairClients, fairRounds               int
	fairSparseRounds                      int
	fairGRPC                              string
	fairTime                              time.Duration
	fairModes                             []string
	batchClients                          int
	batchTime                             time.Duration
	batchFractions, batchChart            string
}

func main() {
	runEchoFloorIfAsked()
	var o options
	flag.StringVar(&o.repo, "repo", ".", "repository root: BENCHMARKS.md, docs/, samples/cnn/testdata, go.mod")
	flag.StringVar(&o.plover, "plover", "bin/plover", "the plover binary to serve and deploy with")
	flag.StringVar(&serverLogs, "server-logs", "", "also write each plover serve's log to a file of its own in this directory (server-NNN.log, its command first, at most 4 MiB each)")
	flag.StringVar(&o.device, "device", "host", "device for plover serve and the direct calls: host | cuda")
	flag.StringVar(&o.isolation, "isolation", "process", "plover serve --isolation for the served figures: process | none (scripts/isolation-bench.sh compares the two)")
	flag.StringVar(&o.suffix, "bundle-suffix", "", "bundle directories are SAMPLES/<function>-<suffix> (default: the device)")
	flag.StringVar(&o.samples, "samples", "build/samples", "directory holding the built bundles and vecadd's input")
	flag.StringVar(&o.functions, "functions", "vecadd,cnn", "functions to measure")
	flag.IntVar(&o.trials, "trials", 11, "cold and warm starts per function (each a fresh server process)")
	flag.DurationVar(&o.hot, "hot", 5*time.Second, "time limit of each function's sequential hot requests")
	flag.Int64Var(&o.hotRequests, "hot-requests", 20000, "request limit of each function's sequential hot requests")
	flag.DurationVar(&o.probe, "probe", 3*time.Second, "closed-loop run that finds the throughput the sweep's rates are fractions of")
	flag.DurationVar(&o.sweepTime, "sweep-time", 4*time.Second, "duration of each open-loop rate in the latency sweep")
	flag.StringVar(&o.fractions, "sweep", "0.05,0.1,0.25,0.4,0.55,0.7,0.8,0.9,1,1.2", "offered loads, as fractions of the probed throughput")
	flag.StringVar(&o.out, "out", "BENCHMARKS.md", "markdown file whose bench:<device> section is replaced (relative to --repo)")
	flag.StringVar(&o.chart, "chart", "", "latency chart SVG (relative to --repo; default docs/cnn-latency.svg, docs/cnn-latency-<device>.svg off the host)")
	flag.StringVar(&o.jsonOut, "json", "", "also write every measurement as JSON here (default build/bench/results-<device>.json)")
	flag.StringVar(&o.goBench, "go-bench", "auto", "run the hot-path Go benchmarks: auto (when go is installed and the device is host) | on | off")
	flag.BoolVar(&o.dryRun, "dry-run", false, "print the markdown instead of writing files")
	flag.BoolVar(&o.batch, "batch", false, "only compare the CNN with and without batching (samples/cnn-batch-<suffix>); writes the bench:batch-<device> section and --batch-chart")
	flag.BoolVar(&o.fair, "fair", false, "only measure device sharing: the CNN at one client alone and beside floods, shares 3:1, priorities, with --sched fair and off; writes the bench:fair-<device> section")
	flag.BoolVar(&o.burst, "burst", false, "only measure many functions: cold starts of distinct functions in turn and at once, deploys, the listing and /metrics with 1,000 deployed, idle workers' memory; writes the bench:burst-<device> section")
	flag.BoolVar(&o.tenants, "tenants", false, "only measure tenant workers (issue 46): 120 functions of 2 tenants with --worker-scope function and tenant in turn (first requests in turn and 16 at once, the workers' PSS and processes, one function hot), then 1,000 functions of 10 tenants; writes the bench:tenants-<device> section")
	flag.IntVar(&o.tenantSizes.fns, "tenant-functions", 120, "--tenants: functions of the two tenants whose first requests are measured in turn")
	flag.IntVar(&o.tenantSizes.rounds, "tenant-rounds", 3, "--tenants: rounds of the two scopes in turn")
	flag.IntVar(&o.tenantSizes.many, "tenant-many", 1000, "--tenants: functions of ten tenants under tenant scope (0: none)")
	flag.BoolVar(&o.tenantSplit, "tenant-split", true, "--tenants: also the two tenants' split of the CPU beside idle functions, a fresh server per scope and round (what it tests needs the CPU contended: a host device)")
	flag.BoolVar(&o.pipeline, "pipeline", false, "only measure pipelines: the digits sample as one pipeline request against its three functions invoked in turn; writes the bench:pipeline-<device> section")
	flag.BoolVar(&o.tracing, "tracing", false, "only measure tracing's cost: the CNN hot on servers with tracing off, on unsampled and on sampled, side by side; writes the bench:tracing-<device> section")
	flag.StringVar(&o.tracingBefore, "tracing-before", "", "with --tracing: an earlier plover binary (without tracing); the CNN alone is measured on it and on --plover (tracing off) side by side")
	flag.BoolVar(&o.datapath, "datapath", false, "only measure the data path: vecadd 4 MB in and out against an echo floor (a server that reads, spins for the kernel's time and answers the same bytes), one and four clients; writes the bench:datapath-<device> section")
	flag.StringVar(&o.datapathBefore, "datapath-before", "", "with --datapath: earlier plover binaries (space-separated) measured the same way in the same run")
	flag.BoolVar(&o.transports, "transports", false, "only measure the transports: the CNN hot over HTTP and over gRPC on one server, alternating blocks; writes the bench:transports-<device> section")
	flag.StringVar(&o.pipelineBefore, "pipeline-before", "", "with --pipeline: an earlier plover binary; the CNN alone is measured on it and on --plover side by side (what pipelines cost plain functions)")
	flag.StringVar(&o.burstBefore, "burst-before", "", "with --burst: other plover binaries (space-separated; an earlier build) measured the same way in the same run, for ratios")
	flag.IntVar(&o.fairClients, "fair-clients", 8, "closed-loop clients of each flood for --fair")
	flag.DurationVar(&o.fairTime, "fair-time", 5*time.Second, "duration of each --fair measurement")
	flag.Func("fair-modes", "--fair: the modes to run, comma-separated, of fair, fair-noio, fair-noboost, fair-flood1, fair-piece, fair-flood1-piece, fair-tenant, fair-tenant-piece, fair-nice, fair-nice-noio, fair-nice-noboost, fair-nice-noslice, fair-nice-root, off, none (default all)", func(s string) error {
		for _, m := range strings.Split(s, ",") {
			if !slices.Contains(fairModes, m) {
				return fmt.Errorf("%q is not a mode: want some of %s", m, strings.Join(fairModes, ", "))
			}
			o.fairModes = append(o.fairModes, m)
		}
		return nil
	})
	flag.IntVar(&o.fairSparseRounds, "fair-sparse-rounds", 2, "--fair: rounds of a sparse victim (the CNN at 4/s, open loop, 4 times --fair-time) alone and beside the 4 MB flood, on fair, fair-nice and two echo floors (0: none)")
	o.fairGRPC = "auto"
	flag.Func("fair-grpc", "--fair: also the victim beside the 4 MB flood sent through gRPC: auto (on the host device; the GPU check's window has no room for it) | on | off (default auto)", func(s string) error {
		if s != "auto" && s != "on" && s != "off" {
			return fmt.Errorf("%q: want auto, on or off", s)
		}
		o.fairGRPC = s
		return nil
	})
	flag.IntVar(&o.fairRounds, "fair-rounds", 4, "--fair: rounds of the victim alone and beside the 4 MB flood, the server's I/O scheduled and not, the modes interleaved (0: none)")
	flag.IntVar(&o.batchClients, "batch-clients", 32, "closed-loop clients for --batch")
	flag.DurationVar(&o.batchTime, "batch-time", 6*time.Second, "duration of each --batch closed-loop run")
	flag.StringVar(&o.batchFractions, "batch-sweep", "0.25,0.5,0.75,1,1.25,1.5,2", "--batch offered loads, as fractions of the unbatched closed-loop throughput")
	flag.StringVar(&o.batchChart, "batch-chart", "", "--batch chart SVG (relative to --repo; default docs/cnn-batch-<device>.svg)")
	flag.Parse()
	if err := run(&o); err != nil {
		fmt.Fprintln(os.Stderr, "plover-bench-suite:", err)
		os.Exit(1)
	}
}

// results is everything one suite run measured.
type results struct {
	Machine   machine           `json:"machine"`
	Device    string            `json:"device"`
	Isolation string            `json:"isolation"`
	DevName   string            `json:"device_name"`
	Started   time.Time         `json:"started"`
	WallS     float64           `json:"wall_s"`
	Command   string            `json:"command"`
	Functions []*functionResult `json:"functions"`
	Sweep     *sweepResult      `json:"sweep,omitempty"`
	GoBench   []goBenchResult   `json:"go_bench,omitempty"`
	GoBenchNo string            `json:"go_bench_skipped,omitempty"`
	// Load averages (1, 5, 15 min) before the suite and after its
	// measurements: other work on the machine shows here.
	LoadBefore    string `json:"loadavg_before"`
	LoadAfterRuns string `json:"loadavg_after"`
}

func run(o *options) error {
	t0 := time.Now()
	fractions, err := prepare(o)
	if err != nil {
		return err
	}

	// A ^C must still stop the servers this process started.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	res := &results{Machine: readMachine(), Device: o.device, Isolation: o.isolation, Started: t0.UTC(), Command: strings.Join(os.Args, " "), LoadBefore: loadAvg()}
	res.Machine.Plover = ploverVersion(o.plover)
	if mode := otherMode(o); mode != nil {
		return mode(ctx, o, res)
	}
	logf("plover-bench-suite: %s, device %s, %s", res.Machine.CPU, o.device, res.Machine.Plover)

	loads, err := workloads(o, res)
	if err != nil {
		return err
	}
	if err := measureAllServed(ctx, o, res, loads, fractions); err != nil {
		return err
	}
	if err := measureAllDirect(ctx, o, res); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}

	res.LoadAfterRuns = loadAvg()
	res.GoBench, res.GoBenchNo = runGoBench(ctx, o)
	res.WallS = time.Since(t0).Seconds()
	return writeResults(o, res)
}

// prepare fills in the options' defaults and checks them, and returns the
// sweep's fractions.
func prepare(o *options) ([]float64, error) {
	if o.suffix == "" {
		o.suffix = o.device
	}
	if o.chart == "" {
		o.chart = "docs/cnn-latency.svg"
		if o.device != device.KindHost {
			o.chart = "docs/cnn-latency-" + o.device + ".svg"
		}
	}
	if o.jsonOut == "" {
		o.jsonOut = filepath.Join("build", "bench", "results-"+o.device+".json")
	}
	if o.trials < 1 || o.hot <= 0 || o.hotRequests < 1 {
		return nil, errors.New("--trials, --hot and --hot-requests must be positive")
	}
	fractions, err := parseFractions(o.fractions)
	if err != nil {
		return nil, err
	}
	plover, err := filepath.Abs(o.plover)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(plover); err != nil {
		return nil, fmt.Errorf("--plover: %w (make build)", err)
	}
	o.plover = plover
	return fractions, nil
}

// otherMode is the suite a flag asks for instead of the served and direct
// latencies (--fair, --burst, ...), or nil.
func otherMode(o *options) func(context.Context, *options, *results) error {
	switch {
	case o.fair:
		return runFair
	case o.burst:
		return runBurst
	case o.tenants:
		return runTenants
	case o.pipeline:
		return runPipeline
	case o.transports:
		return runTransports
	case o.datapath:
		return runDatapath
	case o.tracing:
		return runTracing
	case o.batch:
		if o.batchChart == "" {
			o.batchChart = "docs/cnn-batch-" + o.device + ".svg"
		}
		return runBatch
	}
	return nil
}

// workloads are the --functions to measure, each also in res (a bundle
// that is not built: skipped, and said why).
func workloads(o *options, res *results) ([]*workload, error) {
	var loads []*workload
	for _, name := range strings.Split(o.functions, ",") {
		var w *workload
		var err error
		switch strings.TrimSpace(name) {
		case "vecadd":
			w, err = vecaddWorkload(o.samples, o.suffix)
		case "cnn":
			w, err = cnnWorkload(o.repo, o.samples, o.suffix)
		default:
			return nil, fmt.Errorf("--functions: unknown function %q (vecadd, cnn)", name)
		}
		fr := &functionResult{Name: w.Name, Title: w.Title, Bundle: w.Dir, InputNote: w.InputNote, InputBytes: len(w.Input), w: w}
		res.Functions = append(res.Functions, fr)
		if err == nil {
			if _, serr := os.Stat(filepath.Join(w.Dir, "plover.json")); serr != nil {
				err = fmt.Errorf("bundle %s not built (make samples%s)", w.Dir, map[bool]string{true: " cnn-" + o.suffix}[w.Name == "cnn"])
			}
		}
		if err != nil {
			fr.Skipped = err.Error()
			logf("%s: SKIPPED: %v", w.Name, err)
			continue
		}
		loads = append(loads, w)
	}
	if len(loads) == 0 {
		return nil, errors.New("no function to measure")
	}
	return loads, nil
}

// measureAllServed measures every function through a server, and sweeps
// the offered load on one of them.
func measureAllServed(ctx context.Context, o *options, res *results, loads []*workload, fractions []float64) error {
	// The sweep runs on the CNN when there is one: small requests, so the
	// curve shows the server, not memcpy bandwidth.
	sweepOn := loads[0]
	for _, w := range loads {
		if w.Name == "cnn" {
			sweepOn = w
		}
	}
	for _, fr := range res.Functions {
		if fr.Skipped != "" {
			continue
		}
		var sw *sweepResult
		if fr.w == sweepOn {
			sw = &sweepResult{Function: fr.Name, Fractions: fractions}
			if fr.Name != "cnn" {
				sw.Note = "the CNN bundle is absent, so this sweep uses vecadd (4 MB requests)"
			}
		}
		if err := measureServed(ctx, o, fr, sw); err != nil {
			return fmt.Errorf("%s: %w", fr.Name, err)
		}
		if sw != nil {
			res.Sweep = sw
		}
	}
	return nil
}

// measureAllDirect measures every function called on the device directly,
// without a server, and checks its output.
func measureAllDirect(ctx context.Context, o *options, res *results) error {
	devs, err := device.Open(o.device, 0, nil)
	if err != nil {
		return fmt.Errorf("direct calls: %w", err)
	}
	res.DevName = devs[0].Name()
	for _, fr := range res.Functions {
		if fr.Skipped != "" || ctx.Err() != nil {
			continue
		}
		logf("%s: direct calls through device.Device (%d cold, then repeats)", fr.Name, o.trials)
		d, err := measureDirect(devs[0], fr.w.Dir, fr.w.Input, 0, o.trials, int(o.hotRequests), o.hot)
		if err != nil {
			return fmt.Errorf("%s direct: %w", fr.Name, err)
		}
		fr.Direct = d
		fr.DirectCheck, fr.DirectOK = fr.w.check(d.Output)
		if !fr.DirectOK {
			return fmt.Errorf("%s: the direct call's output is wrong: %s", fr.Name, fr.DirectCheck)
		}
	}
	for _, d := range devs {
		d.Close()
	}
	return nil
}

func parseFractions(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		var v float64
		if _, err := fmt.Sscanf(strings.TrimSpace(f), "%g", &v); err != nil || v <= 0 || v > 10 {
			return nil, fmt.Errorf("--sweep %q: want fractions like 0.5,1,1.2", s)
		}
		out = append(out, v)
	}
	slices.Sort(out)
	return out, nil
}

func writeResults(o *options, res *results) error {
	md := renderSection(o, res)
	svg := ""
	if res.Sweep != nil && len(res.Sweep.Points) > 0 {
		svg = renderChart(res.Sweep, res)
	}
	if o.dryRun {
		fmt.Println(md)
		return nil
	}
	jsonPath := inRepo(o, o.jsonOut)
	if err := os.MkdirAll(filepath.Dir(jsonPath), 0o755); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(res, "", "  ")
	if err := os.WriteFile(jsonPath, b, 0o644); err != nil {
		return err
	}
	if svg != "" {
		p := inRepo(o, o.chart)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(svg), 0o644); err != nil {
			return err
		}
		logf("wrote %s", p)
	}
	mdPath := inRepo(o, o.out)
	doc, err := os.ReadFile(mdPath)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	doc = []byte(replaceSection(string(doc), o.device, md))
	if err := os.WriteFile(mdPath, doc, 0o644); err != nil {
		return err
	}
	logf("wrote the bench:%s section of %s and %s (%.0f s)", o.device, mdPath, jsonPath, res.WallS)
	printSummary(res)
	return nil
}

// printSummary shows the headline numbers on stdout; the tables are in
// the markdown.
func printSummary(res *results) {
	fmt.Printf("client latency, ms (medians)   %8s %8s %8s %8s %8s\n", "cold", "warm", "hot", "direct", "direct")
	fmt.Printf("%-30s %8s %8s %8s %8s %8s\n", "", "", "", "", "first", "repeat")
	for _, f := range res.Functions {
		if f.Skipped != "" {
			fmt.Printf("%-30s skipped: %s\n", f.Name, f.Skipped)
			continue
		}
		client := func(s *served) float64 { return s.ClientMs }
		first := median(mapSlice(f.Direct.Trials, func(t directTrial) float64 { return t.OpenMs + t.ConstMs + t.InstanceMs + t.RunMs }))
		rep := median(mapSlice(f.Direct.Repeats, func(t directRepeat) float64 { return t.RunMs }))
		fmt.Printf("%-30s %8s %8s %8s %8s %8s\n", f.Name, fmtMs(median(mapSlice(f.Cold, client))), fmtMs(median(mapSlice(f.Warm, client))),
			fmtMs(median(mapSlice(f.Hot, client))), fmtMs(first), fmtMs(rep))
	}
	if sw := res.Sweep; sw != nil {
		fmt.Printf("%s sweep: closed-loop throughput %.0f/s;", sw.Function, sw.Capacity)
		for _, p := range sw.Points {
			fmt.Printf(" %g/s p99 %s ms;", p.Offered, fmtMs(p.P99))
		}
		fmt.Println()
	}
}

// inRepo resolves a path given relative to the repository root.
func inRepo(o *options, p string) string {
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(o.repo, p)
}

var logMu sync.Mutex

func logf(format string, args ...any) {
	logMu.Lock()
	defer logMu.Unlock()
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

// goAvailable reports whether a Go toolchain and the module source are
// here (not so on a GPU machine given prebuilt binaries).
func goAvailable(repo string) bool {
	if _, err := exec.LookPath("go"); err != nil {
		return false
	}
	_, err := os.Stat(filepath.Join(repo, "go.mod"))
	return err == nil
}
