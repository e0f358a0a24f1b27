package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/bench"
	"github.com/plover-run/plover/bundle"
)

// The many-functions benchmark (--burst): a node's normal day is many
// functions waking up, not one. Every function is the CNN sample under a
// name of its own.
//
//  1. A first server deploys the functions the bursts use and invokes each
//     once, so that their bundles are in the node cache; it stops.
//  2. A second server over the same data finds them deployed and cached
//     but not loaded: each of burstSeq functions is invoked once, in turn,
//     from one keep-alive client (cold starts in sequence); then rounds of
//     burstWide functions invoked at once (cold starts together).
//  3. More functions are deployed through it, to burstMany in all, and the
//     listing and /metrics are timed with them; the workers the bursts
//     started, idle now, report their memory (PSS).
const (
	burstSeq    = 200
	burstWide   = 16
	burstRounds = 3
	burstMany   = 1000
)

type burstRun struct {
	Plover       string      `json:"plover"`           // the binary measured
	Sequence     []float64   `json:"sequence_ms"`      // client latency of each cold start in turn
	SeqLoad      []float64   `json:"sequence_load_ms"` // the server's load span of each
	SeqNotCold   int         `json:"sequence_not_cold"`
	Wide         [][]float64 `json:"wide_ms"` // per round, each function's latency
	WideErrors   int         `json:"wide_errors"`
	Deploys      []float64   `json:"deploy_ms"` // each deploy through the server, client latency
	List         []float64   `json:"list_ms"`   // GET /v1/functions with burstMany deployed
	ListBytes    int         `json:"list_bytes"`
	Metrics      []float64   `json:"metrics_ms"`
	MetricsBytes int         `json:"metrics_bytes"`
	PSS          []float64   `json:"idle_worker_pss_mib"`
	Workers      int         `json:"idle_workers"`
}

func runBurst(ctx context.Context, o *options, res *results) error {
	src := filepath.Join(o.samples, "cnn-"+o.suffix)
	d, _, err := firstDigit(o.repo)
	if err != nil {
		return err
	}
	in := d.Input()
	var runs []*burstRun
	for _, bin := range append([]string{o.plover}, strings.Fields(o.burstBefore)...) {
		logf("%s", bin)
		br, err := burstOne(ctx, o, bin, src, in)
		if err != nil {
			return fmt.Errorf("%s: %w", bin, err)
		}
		runs = append(runs, br)
	}
	res.LoadAfterRuns = loadAvg()
	return writeBurst(o, res, runs)
}

// burstOne measures one plover binary over a data directory of its own.
func burstOne(ctx context.Context, o *options, plover, src string, in []byte) (*burstRun, error) {
	data, err := os.MkdirTemp("", "plover-burst-bench-")
	if err != nil {
		return nil, err
	}
	defer removeAll(data)
	packs, err := burstPacks(data, src)
	if err != nil {
		return nil, err
	}
	br := &burstRun{Plover: plover}
	c := &http.Client{Timeout: time.Minute}
	if err := br.fillCache(o, c, data, packs, in); err != nil {
		return nil, err
	}

	srv, err := startServer(plover, data, o.device, o.isolation)
	if err != nil {
		return nil, err
	}
	defer srv.stop()
	time.Sleep(time.Second) // the standby pool at rest, as on a node between bursts
	if err := br.coldStarts(c, srv.url, in); err != nil {
		return nil, err
	}
	if err := br.many(c, srv.url, packs); err != nil {
		return nil, err
	}
	return br, nil
}

// burstName is the burst's function i.
func burstName(i int) string { return fmt.Sprintf("cnn-%04d", i) }

// burstUsed is how many of the functions the cold starts run.
const burstUsed = burstSeq + burstWide*burstRounds

// burstPacks are the burst's burstMany bundles: src renamed, packed.
func burstPacks(data, src string) ([][]byte, error) {
	packs := make([][]byte, burstMany)
	for i := range packs {
		dir, err := renamedBundle(data, fairBundle{burstName(i), src, map[string]any{}})
		if err != nil {
			return nil, err
		}
		if packs[i], _, _, err = bundle.PackBytes(dir); err != nil {
			return nil, err
		}
		os.RemoveAll(dir)
	}
	return packs, nil
}

// fillCache deploys the functions the cold starts run and loads each once,
// on a server of its own, to fill the node cache.
func (br *burstRun) fillCache(o *options, c *http.Client, data string, packs [][]byte, in []byte) error {
	logf("deploying %d functions and loading each once (to fill the node cache)", burstUsed)
	srv, err := startServer(br.Plover, data, o.device, o.isolation)
	if err != nil {
		return err
	}
	defer srv.stop()
	for i := 0; i < burstUsed; i++ {
		d, err := deploy(c, srv.url, burstName(i), packs[i])
		if err != nil {
			return err
		}
		br.Deploys = append(br.Deploys, d)
		if _, _, err := invoke(c, srv.url, burstName(i), in); err != nil {
			return err
		}
	}
	return nil
}

// coldStarts are burstSeq cold starts in turn from one client, then
// burstRounds rounds of burstWide at once.
func (br *burstRun) coldStarts(c *http.Client, url string, in []byte) error {
	logf("cold starts of %d functions in turn, one client", burstSeq)
	for i := 0; i < burstSeq; i++ {
		d, load, cold, err := coldInvoke(c, url, burstName(i), in)
		if err != nil {
			return err
		}
		br.Sequence, br.SeqLoad = append(br.Sequence, d), append(br.SeqLoad, load)
		if !cold {
			br.SeqNotCold++
		}
	}
	for r := 0; r < burstRounds; r++ {
		time.Sleep(time.Second) // between bursts
		logf("%d cold starts at once, round %d", burstWide, r+1)
		lat, errs := wide(url, in, func(k int) string { return burstName(burstSeq + r*burstWide + k) }, nil)
		br.Wide = append(br.Wide, lat)
		logf("  latencies ms, sorted: %s", sortedMs(lat))
		br.WideErrors += errs
	}
	return nil
}

// many deploys the rest of the burstMany functions and times the listing
// and the metrics with them all, and counts the workers and their memory.
func (br *burstRun) many(c *http.Client, url string, packs [][]byte) error {
	logf("deploying up to %d functions", burstMany)
	for i := burstUsed; i < burstMany; i++ {
		d, err := deploy(c, url, burstName(i), packs[i])
		if err != nil {
			return err
		}
		br.Deploys = append(br.Deploys, d)
	}
	for range 20 {
		d, n, err := get(c, url+"/v1/functions")
		if err != nil {
			return err
		}
		br.List, br.ListBytes = append(br.List, d), n
		if d, n, err = get(c, url+"/metrics"); err != nil {
			return err
		}
		br.Metrics, br.MetricsBytes = append(br.Metrics, d), n
	}
	var list struct{ Functions []api.FunctionInfo }
	if err := getJSON(c, url+"/v1/functions", &list); err != nil {
		return err
	}
	for _, fi := range list.Functions {
		for _, w := range fi.Workers {
			br.Workers++
			if w.PSSBytes > 0 {
				br.PSS = append(br.PSS, float64(w.PSSBytes)/(1<<20))
			}
		}
	}
	return nil
}

// coldInvoke is invoke of a request meant to be a cold start: its latency
// (ms), the server's load span (ms, NaN when it names none) and whether
// the server says it was cold.
func coldInvoke(c *http.Client, url, fn string, in []byte) (lat, load float64, cold bool, err error) {
	lat, h, err := invoke(c, url, fn, in)
	if err != nil {
		return 0, 0, false, err
	}
	var st bench.ServerTiming
	bench.ParseServerTiming([]byte(h.Get("Server-Timing")), &st)
	load = math.NaN()
	if st.Has&(1<<bench.Load) != 0 {
		load = ms(st.Dur[bench.Load])
	}
	return lat, load, h.Get("X-Plover-Start") == "cold", nil
}

// invoke sends one request and returns its latency (ms) and headers.
func invoke(c *http.Client, url, fn string, in []byte) (float64, http.Header, error) {
	t0 := time.Now()
	resp, err := c.Post(url+"/v1/functions/"+fn+"/invoke", "application/octet-stream", bytes.NewReader(in))
	if err != nil {
		return 0, nil, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	d := msSince(t0)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("invoke %s: %s: %s", fn, resp.Status, body)
	}
	return d, resp.Header, err
}

// wide invokes n distinct functions at once, each from a connection made
// beforehand (sending token(k) when token is not nil: a tenant's), and
// returns each one's latency (ms) and the failures.
func wide(url string, in []byte, name func(int) string, token func(int) string) ([]float64, int) {
	clients := make([]*http.Client, burstWide)
	for k := range clients {
		// A transport each, its connection opened by the health check and
		// kept: the burst is of first requests to functions from clients
		// already connected. (Until 2026-11-29 the clients shared one
		// transport, which keeps two connections idle: the burst dialled
		// about 14 new ones.)
		tr := http.DefaultTransport.(*http.Transport).Clone()
		defer tr.CloseIdleConnections()
		var rt http.RoundTripper = tr
		if token != nil {
			rt = bearer{token(k), tr}
		}
		clients[k] = &http.Client{Timeout: time.Minute, Transport: rt}
		get(clients[k], url+"/healthz")
	}
	lat := make([]float64, burstWide)
	errs := make([]error, burstWide)
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for k := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			lat[k], _, errs[k] = invoke(clients[k], url, name(k), in)
		}()
	}
	close(gate)
	wg.Wait()
	n := 0
	for k, err := range errs {
		if err != nil {
			logf("  %s: %v", name(k), err)
			lat[k], n = math.NaN(), n+1
		}
	}
	return lat, n
}

func deploy(c *http.Client, url, fn string, pack []byte) (float64, error) {
	req, err := http.NewRequest(http.MethodPut, url+"/v1/functions/"+fn, bytes.NewReader(pack))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", bundle.MediaType)
	t0 := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated {
		return 0, fmt.Errorf("deploy %s: %s: %s", fn, resp.Status, body)
	}
	return msSince(t0), nil
}

// get fetches url and returns the latency (ms) and the body's length.
func get(c *http.Client, url string) (float64, int, error) {
	t0 := time.Now()
	resp, err := c.Get(url)
	if err != nil {
		return 0, 0, err
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return msSince(t0), int(n), err
}

// getJSON decodes url's 200 answer into v; another status is an error
// (an error's JSON body decoded into v left it zero, and said nothing).
func getJSON(c *http.Client, url string, v any) error {
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, bytes.TrimSpace(b))
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	return nil
}

func writeBurst(o *options, res *results, runs []*burstRun) error {
	return writeSection(o, "burst-"+o.device, renderBurst(o, res, runs), runs)
}

// renderBurst is the many-functions section: its table, this build's
// figures first, and the idle workers' memory.
func renderBurst(o *options, res *results, runs []*burstRun) string {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p("## Many functions: cold starts in bursts (%s device)\n\n", res.Device)
	p("Written by `%s` on %s: %s, %d cores, %s; `plover serve --isolation %s` with its defaults, client and server on this machine; load average before %s, after %s.\n\n",
		res.Command, res.Started.Format("2006-01-02"), res.Machine.CPU, res.Machine.Cores, res.Machine.OS, o.isolation, res.LoadBefore, res.LoadAfterRuns)
	p("Every function is the CNN (`samples/cnn`) under a name of its own, with its bundle in the node cache and not loaded (a first server loaded each once and stopped; a second measures); every request sends the first held-out digit (784 float32; until 2026-11-29 the file's raw bytes, mostly denormal floats, several times slower to run). A cold start here is the worker, the library, the constants and an instance, then the request.")
	if len(runs) > 1 {
		p(" Each row is measured with `%s`, then with the binaries of `--burst-before` (an earlier build, its workers started as `plover worker` by the same binary), one after the other in this run; ratios are this build over the first of them.", runs[0].Plover)
	}
	p("\n\n| measurement | p50 | p99 | max | target |")
	for _, r := range runs[1:] {
		p(" `%s` p50 / p99 / max | this build ÷ it, p50 |", r.Plover)
	}
	p("\n|---|---|---|---|---|%s\n", strings.Repeat("---|---|", len(runs)-1))
	row := func(what, target string, get func(*burstRun) []float64) {
		v := get(runs[0])
		p("| %s | %s | %s | %s | %s |", what, quantileMs(v, 0.5), quantileMs(v, 0.99), fmtMs(quantile(v, 1)), target)
		for _, r := range runs[1:] {
			w := get(r)
			p(" %s / %s / %s | %s |", quantileMs(w, 0.5), quantileMs(w, 0.99), fmtMs(quantile(w, 1)), ratio(quantile(v, 0.5), quantile(w, 0.5)))
		}
		p("\n")
	}
	br := runs[0]
	row(fmt.Sprintf("cold start, %d functions in turn, one client: latency ms", len(br.Sequence)), "p50 <= 6, p99 <= 15", func(r *burstRun) []float64 { return r.Sequence })
	row("the same: the server's `load` span, ms", "", func(r *burstRun) []float64 { return r.SeqLoad })
	row(fmt.Sprintf("%d cold starts at once (%d rounds, 1 s apart): the slowest of each round, ms", burstWide, len(br.Wide)), "max <= 30", func(r *burstRun) []float64 {
		var slowest []float64
		for _, w := range r.Wide {
			slowest = append(slowest, quantile(w, 1))
		}
		return slowest
	})
	row(fmt.Sprintf("deploy through the server (%d functions), ms", len(br.Deploys)), "", func(r *burstRun) []float64 { return r.Deploys })
	row(fmt.Sprintf("`GET /v1/functions` with %d deployed (%d KiB), ms", burstMany, br.ListBytes>>10), "p50 <= 50", func(r *burstRun) []float64 { return r.List })
	row(fmt.Sprintf("`GET /metrics` with %d deployed, %d of them invoked (%d KiB), ms", burstMany, burstSeq+burstWide*burstRounds, br.MetricsBytes>>10), "", func(r *burstRun) []float64 { return r.Metrics })
	mib := func(v []float64) string {
		if len(v) == 0 {
			return "n/a"
		}
		return fmt.Sprintf("%.1f", quantile(v, 0.5))
	}
	p("\nPSS of an idle worker (target <= 5 MiB), the median of the %d workers the bursts left: %s MiB", br.Workers, mib(br.PSS))
	for _, r := range runs[1:] {
		p("; `%s`: %s", r.Plover, mib(r.PSS))
	}
	p(".\n")
	for _, r := range runs {
		if r.SeqNotCold > 0 || r.WideErrors > 0 {
			p("\n`%s`: %d of the sequence's requests were not cold starts; %d of the bursts' requests failed.\n", r.Plover, r.SeqNotCold, r.WideErrors)
		}
	}
	return b.String()
}

func sortedMs(v []float64) string {
	s := slices.Clone(v)
	slices.Sort(s)
	parts := make([]string, len(s))
	for i, x := range s {
		parts[i] = fmtMs(x)
	}
	return strings.Join(parts, " ")
}
