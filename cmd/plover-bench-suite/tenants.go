package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/bundle"
)

// The tenants benchmark (--tenants), issue 46's targets: the same functions
// served with --worker-scope function and tenant, the two modes in turn in
// every round, each a fresh server over one data directory whose bundles
// are cached and not loaded:
//
//  1. --tenant-functions functions of tenantPair tenants (function i is tenant
//     i mod tenantPair's, deployed with its token), each invoked once, in
//     turn, from one client: the first requests;
//  2. tenantWide more at once, each from a connection of its own;
//  3. the workers serving them: their PSS summed over distinct processes
//     (read from /proc, the server running as root), processes per tenant,
//     and any process serving two tenants (must be none);
//  4. one function hot, tenantHot requests in turn;
//  5. on a fresh server of the same scope, the CPU split between tenants:
//     the first tenant's function and the second's flooded together from
//     splitClients clients each, equal shares, while the first tenant also
//     holds up to tenantIdle functions loaded, idle for splitSettle
//     (tenantSplit).
//
// Then --tenant-many functions of tenantTen tenants under tenant scope
// alone: all invoked once in turn (cold), then all warm: memory per
// function, processes, and the listing's time.
const (
	tenantPair = 2
	tenantWide = 16
	tenantHot  = 6000
	tenantTen  = 10

	tenantIdle   = 20
	splitClients = 2
	splitTime    = 4 * time.Second
	splitSettle  = 2500 * time.Millisecond
)

// tenantSizes are the benchmark's sizes (--tenant-functions,
// --tenant-rounds, --tenant-many): smaller on a GPU, where every worker of
// function scope creates a CUDA context.
type tenantSizes struct{ fns, rounds, many int }

var tenantScopes = []string{"function", "tenant"}

// tenantRun is one server's figures.
type tenantRun struct {
	Scope     string         `json:"scope"`
	Round     int            `json:"round"`
	Sequence  []float64      `json:"sequence_ms"`
	SeqLoad   []float64      `json:"sequence_load_ms"`
	Wide      []float64      `json:"wide_ms"`
	PSSMiB    float64        `json:"workers_pss_mib"`
	Procs     map[string]int `json:"processes_per_tenant"`
	Mixed     int            `json:"processes_serving_two_tenants"`
	Hot       []float64      `json:"hot_ms,omitempty"`
	Errors    int            `json:"errors"`
	NotCold   int            `json:"not_cold"`
	ListMs    []float64      `json:"list_ms,omitempty"`
	Functions int            `json:"functions"`
	// DeviceMiB is the GPU memory the workers hold, by nvidia-smi (the
	// contexts, modules and allocations): set on a CUDA device only.
	DeviceMiB float64 `json:"device_mib,omitempty"`
	DeviceMem string  `json:"device_memory_source,omitempty"`
	// PSSMissing counts workers whose PSS could not be read (not root).
	PSSMissing int `json:"pss_missing,omitempty"`
	// Split is the first tenant's part of the requests served in step 5
	// (equal shares: 0.5), Served each tenant's rate, Idle the functions
	// the first held loaded beside its flooded one.
	Split  float64    `json:"split_first_tenant,omitempty"`
	Served [2]float64 `json:"split_served_per_s,omitzero"`
	Idle   int        `json:"split_idle_functions,omitempty"`
	pids   []int
}

// tenancy is the auth file of a benchmark's tenants and a client per
// tenant sending its token, and an admin's for the listing.
type tenancy struct {
	file    string
	clients []*http.Client
	tokens  []string
	admin   *http.Client
}

func newTenancy(dir string, n int) (*tenancy, error) {
	t := &tenancy{file: filepath.Join(dir, "auth")}
	var lines strings.Builder
	token := func(name, scopes string) (*http.Client, string, error) {
		tok, err := auth.NewToken()
		if err != nil {
			return nil, "", err
		}
		fmt.Fprintf(&lines, "%s %s %s\n", name, scopes, auth.Hash(tok))
		return &http.Client{Timeout: time.Minute, Transport: bearer{tok, http.DefaultTransport}}, tok, nil
	}
	for i := range n {
		c, tok, err := token("tenant-"+strconv.Itoa(i), "deploy,invoke,read")
		if err != nil {
			return nil, err
		}
		t.clients, t.tokens = append(t.clients, c), append(t.tokens, tok)
	}
	var err error
	if t.admin, _, err = token("bench", "admin,read"); err != nil {
		return nil, err
	}
	return t, os.WriteFile(t.file, []byte(lines.String()), 0o600)
}

// of is function i's tenant's client.
func (t *tenancy) of(i int) *http.Client { return t.clients[i%len(t.clients)] }

type bearer struct {
	token string
	rt    http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.rt.RoundTrip(r)
}

func runTenants(_ context.Context, o *options, res *results) error {
	src := filepath.Join(o.samples, "cnn-"+o.suffix)
	d, _, err := firstDigit(o.repo)
	if err != nil {
		return err
	}
	in := d.Input()
	data, err := os.MkdirTemp("", "plover-tenants-bench-")
	if err != nil {
		return err
	}
	defer removeAll(data)
	pair, err := newTenancy(data, tenantPair)
	if err != nil {
		return err
	}
	z := o.tenantSizes
	used := z.fns + tenantWide
	if err := tenantFill(o, data, src, pair, used, in); err != nil {
		return err
	}
	var runs []*tenantRun
	for r := range z.rounds {
		for _, scope := range tenantScopes {
			logf("round %d, --worker-scope %s", r+1, scope)
			tr, err := tenantServe(o, data, pair, scope, in, func(tr *tenantRun, url string) error {
				tr.coldInTurn(pair, url, 0, z.fns, in)
				tr.wideAt(pair, url, z.fns, in)
				if err := tr.workers(pair, url, used); err != nil {
					return err
				}
				tr.hot(pair, url, in)
				return nil
			})
			if err != nil {
				return err
			}
			if o.tenantSplit {
				if err := tr.tenantSplit(o, data, pair, used, in); err != nil {
					return err
				}
			}
			tr.Round = r + 1
			runs = append(runs, tr)
		}
	}
	var many *tenantRun
	if z.many > 0 {
		if many, err = tenantsMany(o, src, z.many, in); err != nil {
			return err
		}
	}
	res.LoadAfterRuns = loadAvg()
	return writeTenants(o, res, runs, many)
}

// tenantFill deploys n functions over the tenancy and invokes each once on
// a server of its own, so that a measuring server finds every bundle in
// the node cache and none loaded.
func tenantFill(o *options, data, src string, t *tenancy, n int, in []byte) error {
	logf("deploying %d functions of %d tenants and loading each once (to fill the node cache)", n, len(t.clients))
	srv, err := startServer(o.plover, data, o.device, o.isolation, "--auth-file", t.file, "--worker-scope", "tenant")
	if err != nil {
		return err
	}
	defer srv.stop()
	for i := range n {
		dir, err := renamedBundle(data, fairBundle{burstName(i), src, map[string]any{}})
		if err != nil {
			return err
		}
		pack, _, _, err := bundle.PackBytes(dir)
		os.RemoveAll(dir)
		if err != nil {
			return err
		}
		if _, err := deploy(t.of(i), srv.url, burstName(i), pack); err != nil {
			return err
		}
		if _, _, err := invoke(t.of(i), srv.url, burstName(i), in); err != nil {
			return err
		}
	}
	return nil
}

// tenantServe starts a server with scope, lets its standby pool come to
// rest, and measures on it.
func tenantServe(o *options, data string, t *tenancy, scope string, in []byte, measure func(*tenantRun, string) error) (*tenantRun, error) {
	srv, err := startServer(o.plover, data, o.device, o.isolation, "--auth-file", t.file, "--worker-scope", scope)
	if err != nil {
		return nil, err
	}
	defer srv.stop()
	time.Sleep(time.Second) // the standby pool at rest, as on a node between bursts
	tr := &tenantRun{Scope: scope, Procs: map[string]int{}}
	return tr, measure(tr, srv.url)
}

// tenantSplit measures step 5 on a fresh server of tr's scope: the first
// tenant's functions are the even ones of the used, the second's the odd.
// In function scope every function has a worker of its own, so the idle
// ones weigh nothing there; in tenant scope they share the first tenant's
// worker with its flooded function, and must not add to its CPU weight.
func (tr *tenantRun) tenantSplit(o *options, data string, t *tenancy, used int, in []byte) error {
	_, err := tenantServe(o, data, t, tr.Scope, in, func(_ *tenantRun, url string) error {
		// The two flooded loaded first (each tenant's worker taken alike),
		// then the first tenant's others.
		tr.Idle = min(tenantIdle, (used-2)/2)
		order := []int{0, 1}
		for k := 1; k <= tr.Idle; k++ {
			order = append(order, 2*k)
		}
		for _, i := range order {
			if _, _, err := invoke(t.of(i), url, burstName(i), in); err != nil {
				return fmt.Errorf("loading %s for the tenants' split: %w", burstName(i), err)
			}
		}
		// Idle from here: a function loaded or run within the last 1-2 s
		// counts as busy in its tenant's worker's CPU weight (README).
		time.Sleep(splitSettle)
		var loads [2]fairLoad
		var errs [2]error
		var wg sync.WaitGroup
		for k := range 2 {
			wg.Go(func() {
				loads[k], errs[k] = closedAs(context.Background(), url, t.tokens[k], burstName(k), in, splitClients, splitTime)
			})
		}
		wg.Wait()
		if err := errors.Join(errs[:]...); err != nil {
			return fmt.Errorf("the tenants' split: %w", err)
		}
		tr.Served = [2]float64{loads[0].Throughput, loads[1].Throughput}
		if tr.Served[0] == 0 || tr.Served[1] == 0 {
			return fmt.Errorf("the tenants' split: served %.0f/s and %.0f/s", tr.Served[0], tr.Served[1])
		}
		tr.Split = tr.Served[0] / (tr.Served[0] + tr.Served[1])
		tr.Errors += int(loads[0].Errors + loads[1].Errors)
		logf("  the tenants' split, %d idle beside the first's: %.0f/s and %.0f/s (%.3f)", tr.Idle, tr.Served[0], tr.Served[1], tr.Split)
		return nil
	})
	return err
}

// coldInTurn invokes functions [from, to) once each, in turn.
func (tr *tenantRun) coldInTurn(t *tenancy, url string, from, to int, in []byte) {
	for i := from; i < to; i++ {
		d, load, cold, err := coldInvoke(t.of(i), url, burstName(i), in)
		if err != nil {
			logf("  %v", err)
			tr.Errors++
			continue
		}
		tr.Sequence, tr.SeqLoad = append(tr.Sequence, d), append(tr.SeqLoad, load)
		if !cold {
			tr.NotCold++
		}
	}
	tr.Functions += to - from
}

// wideAt invokes the tenantWide functions after the first from at once.
func (tr *tenantRun) wideAt(t *tenancy, url string, from int, in []byte) {
	lat, errs := wide(url, in, func(k int) string { return burstName(from + k) }, func(k int) string { return t.tokens[(from+k)%len(t.tokens)] })
	logf("  %d at once, latencies ms, sorted: %s", tenantWide, sortedMs(lat))
	tr.Wide, tr.Errors = lat, tr.Errors+errs
	tr.Functions += tenantWide
}

// workers reads the listing: the distinct worker processes of functions
// [0, n), whose tenants they serve, and their PSS from /proc.
func (tr *tenantRun) workers(t *tenancy, url string, n int) error {
	var list struct{ Functions []api.FunctionInfo }
	if err := getJSON(t.admin, url+"/v1/functions", &list); err != nil {
		return err
	}
	tenantOf := map[string]string{}
	for i := range n {
		tenantOf[burstName(i)] = "tenant-" + strconv.Itoa(i%len(t.clients))
	}
	serves := map[int]map[string]bool{}
	for _, fi := range list.Functions {
		ten, ok := tenantOf[fi.Name]
		if !ok {
			continue
		}
		for _, w := range fi.Workers {
			if serves[w.PID] == nil {
				serves[w.PID] = map[string]bool{}
			}
			serves[w.PID][ten] = true
		}
	}
	for pid, tens := range serves {
		tr.pids = append(tr.pids, pid)
		if len(tens) > 1 {
			tr.Mixed++
		}
		for ten := range tens {
			tr.Procs[ten]++
		}
		kb, err := pssKiB(pid)
		if err != nil { // not root, or the worker ended meanwhile
			logf("  worker %d: PSS: %v", pid, err)
			tr.PSSMissing++
			continue
		}
		tr.PSSMiB += float64(kb) / 1024
	}
	return nil
}

// pssKiB is a process's proportional share of resident memory.
func pssKiB(pid int) (int64, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Pss:"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("no Pss line in smaps_rollup")
}

// hot invokes function 0, loaded, tenantHot times in turn.
func (tr *tenantRun) hot(t *tenancy, url string, in []byte) {
	for range tenantHot {
		d, _, err := invoke(t.of(0), url, burstName(0), in)
		if err != nil {
			tr.Errors++
			continue
		}
		tr.Hot = append(tr.Hot, d)
	}
}

// tenantsMany is n functions of tenantTen tenants under tenant scope: cold
// in turn, then the warm workers' memory and the listing.
func tenantsMany(o *options, src string, n int, in []byte) (*tenantRun, error) {
	data, err := os.MkdirTemp("", "plover-tenants-many-")
	if err != nil {
		return nil, err
	}
	defer removeAll(data)
	ten, err := newTenancy(data, tenantTen)
	if err != nil {
		return nil, err
	}
	if err := tenantFill(o, data, src, ten, n, in); err != nil {
		return nil, err
	}
	logf("%d functions of %d tenants, --worker-scope tenant", n, tenantTen)
	return tenantServe(o, data, ten, "tenant", in, func(tr *tenantRun, url string) error {
		tr.coldInTurn(ten, url, 0, n, in)
		if err := tr.workers(ten, url, n); err != nil {
			return err
		}
		tr.DeviceMiB, tr.DeviceMem = gpuMemory(tr.pids)
		for range 20 {
			d, _, err := get(ten.admin, url+"/v1/functions")
			if err != nil {
				return err
			}
			tr.ListMs = append(tr.ListMs, d)
		}
		return nil
	})
}

// gpuMemory is the GPU memory pids hold by nvidia-smi (MiB), and what it
// was read with; zero and why not where there is no nvidia-smi.
func gpuMemory(pids []int) (float64, string) {
	out, err := exec.Command("nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits").Output()
	if err != nil {
		return 0, "no nvidia-smi: " + err.Error()
	}
	want := map[int]bool{}
	for _, p := range pids {
		want[p] = true
	}
	var mib float64
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Split(line, ",")
		if len(f) != 2 {
			continue
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(f[0]))
		if v, err := strconv.ParseFloat(strings.TrimSpace(f[1]), 64); err == nil && want[pid] {
			mib += v
		}
	}
	return mib, "nvidia-smi --query-compute-apps"
}

func writeTenants(o *options, res *results, runs []*tenantRun, many *tenantRun) error {
	z := o.tenantSizes
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p("## Many functions, one worker: tenant workers (%s device)\n\n", res.Device)
	p("Written by `%s` on %s: %s, %d cores, %s; `plover serve --isolation %s --auth-file` with `--worker-scope function` and `tenant`, the two in turn in each of %d rounds, each a fresh server; load average before %s, after %s.\n\n",
		res.Command, res.Started.Format("2006-01-02"), res.Machine.CPU, res.Machine.Cores, res.Machine.OS, o.isolation, z.rounds, res.LoadBefore, res.LoadAfterRuns)
	p("Every function is the CNN (`samples/cnn`) under a name of its own, deployed by one of %d tenants' tokens in turn, its bundle in the node cache and not loaded; every request sends the first held-out digit (784 float32; until 2026-11-29 this benchmark sent the file's raw bytes, mostly denormal floats, on which each run took several times longer). Per cell: the median over the rounds of each round's figure; ratios are tenant ÷ function.\n\n", tenantPair)
	by := func(scope string, fig func(*tenantRun) float64) float64 {
		var v []float64
		for _, r := range runs {
			if r.Scope == scope {
				v = append(v, fig(r))
			}
		}
		return quantile(v, 0.5)
	}
	p("| measurement | function | tenant | tenant ÷ function | target |\n|---|---|---|---|---|\n")
	row := func(what, target string, fig func(*tenantRun) float64, unit func(float64) string) {
		f, t := by("function", fig), by("tenant", fig)
		p("| %s | %s | %s | %s | %s |\n", what, unit(f), unit(t), ratio(t, f), target)
	}
	msU := fmtMs
	mib := func(v float64) string { return fmt.Sprintf("%.1f MiB", v) }
	count := func(v float64) string { return fmt.Sprintf("%.0f", v) }
	row(fmt.Sprintf("first requests of %d functions in turn, p50 ms", z.fns), "≤ 0.5×", func(r *tenantRun) float64 { return quantile(r.Sequence, 0.5) }, msU)
	row("the same, p99 ms", "tenant ≤ 6 ms", func(r *tenantRun) float64 { return quantile(r.Sequence, 0.99) }, msU)
	row("the same, the server's `load` span p50 ms", "", func(r *tenantRun) float64 { return quantile(r.SeqLoad, 0.5) }, msU)
	row(fmt.Sprintf("%d first requests at once, the slowest ms", tenantWide), "tenant ≤ 10 ms", func(r *tenantRun) float64 { return quantile(r.Wide, 1) }, msU)
	row(fmt.Sprintf("the workers' PSS for those %d functions", z.fns+tenantWide), "≤ 0.25×", func(r *tenantRun) float64 { return r.PSSMiB }, mib)
	row("worker processes per tenant, the most", "tenant ≤ 2", func(r *tenantRun) float64 { return float64(maxOf(r.Procs)) }, count)
	row("processes serving two tenants", "0", func(r *tenantRun) float64 { return float64(r.Mixed) }, count)
	row(fmt.Sprintf("one function hot, %d requests in turn, p50 ms", tenantHot), "within 5%", func(r *tenantRun) float64 { return quantile(r.Hot, 0.5) }, msU)
	row("the same, p99 ms", "", func(r *tenantRun) float64 { return quantile(r.Hot, 0.99) }, msU)
	idle := 0
	for _, r := range runs {
		idle = r.Idle
	}
	if o.tenantSplit {
		split := func(scope string) string {
			return fmt.Sprintf("%.3f", by(scope, func(r *tenantRun) float64 { return r.Split }))
		}
		p("| two tenants, equal shares, each flooding one function from %d clients for %s, the first holding %d more loaded and idle: the first's part of the requests served | %s | %s | n/a | 0.5 ± 0.05 |\n",
			splitClients, splitTime, idle, split("function"), split("tenant"))
	}
	errs, notCold := 0, 0
	for _, r := range runs {
		errs, notCold = errs+r.Errors, notCold+r.NotCold
	}
	missing := 0
	for _, r := range append(slices.Clone(runs), many) {
		if r != nil {
			missing += r.PSSMissing
		}
	}
	p("\nFailed requests over all rounds: %d; first requests that were not cold: %d; workers whose PSS could not be read (left out of the sums): %d.\n\n", errs, notCold, missing)
	if many != nil {
		p("**%d functions of %d tenants**, `--worker-scope tenant`, each invoked once in turn (cold, bundle cached): p50 %s ms, p99 %s ms; then all warm: %d worker processes (the most for one tenant %d, %d serving two tenants), PSS %.1f MiB in all, %.1f KiB per function; `GET /v1/functions` with them all p50 %s ms, p99 %s ms; %d failed requests.\n",
			z.many, tenantTen, fmtMs(quantile(many.Sequence, 0.5)), fmtMs(quantile(many.Sequence, 0.99)), sum(many.Procs), maxOf(many.Procs), many.Mixed,
			many.PSSMiB, many.PSSMiB*1024/float64(z.many), fmtMs(quantile(many.ListMs, 0.5)), fmtMs(quantile(many.ListMs, 0.99)), many.Errors)
		if many.DeviceMiB > 0 {
			p("\nGPU memory of those workers (%s): %.0f MiB, %.2f MiB per function.\n", many.DeviceMem, many.DeviceMiB, many.DeviceMiB/float64(z.many))
		}
	}
	return writeSection(o, "tenants-"+o.device, b.String(), map[string]any{"rounds": runs, "many": many})
}

func maxOf(m map[string]int) int {
	return slices.Max(append([]int{0}, slices.Collect(maps.Values(m))...))
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
