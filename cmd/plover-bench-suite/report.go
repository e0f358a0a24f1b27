package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/plover-run/plover/bench"
)

// Markers delimit the suite's own section of BENCHMARKS.md, one per device;
// everything outside them is left as it is.
func markers(key string) (begin, end string) {
	return "<!-- bench:" + key + ":begin -->", "<!-- bench:" + key + ":end -->"
}

// replaceSection puts body between key's markers in doc. Without markers,
// the host section goes before the "## GPU" heading (so the hand-written
// GPU rows stay last) and other sections at the end. A begin marker whose
// end marker is gone becomes the section, and what followed it stays (the
// old section's text too: where it ended is not known); the block must not
// go elsewhere, or the next run cuts from the orphan to the new end.
func replaceSection(doc, key, body string) string {
	begin, end := markers(key)
	block := begin + "\n" + strings.TrimSpace(body) + "\n" + end
	if i := strings.Index(doc, begin); i >= 0 {
		if j := strings.Index(doc[i:], end); j >= 0 {
			kept := foreignSections(doc[i+len(begin):i+j], body)
			if kept != "" {
				logf("warning: %s held sections the suite did not write (headings not in its own): kept, moved above the marker", begin)
				kept += "\n\n"
			}
			return doc[:i] + kept + block + doc[i+j+len(end):]
		}
		logf("warning: %s has no %s after it: the new section replaces the begin marker, and the old section's text after it is left for you to remove", begin, end)
		return doc[:i] + block + doc[i+len(begin):]
	}
	if key == "host" {
		if i := strings.Index(doc, "\n## GPU"); i >= 0 {
			return doc[:i+1] + block + "\n\n" + doc[i+1:]
		}
	}
	if doc != "" && !strings.HasSuffix(doc, "\n\n") {
		doc = strings.TrimRight(doc, "\n") + "\n\n"
	}
	return doc + block + "\n"
}

// foreignSections is what of old, the text between a section's markers,
// the suite did not write: each part from a "## " heading that body, the
// new section, does not have, to the next heading it has. A hand-written
// section put inside the markers (the GPU's fifth run, above the batch
// section's heading, 2026-12-04) was deleted by the next run. A heading
// the suite renamed reads as another's: kept, and the warning says so.
func foreignSections(old, body string) string {
	own := map[string]bool{}
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, "## ") {
			own[strings.TrimSpace(l)] = true
		}
	}
	if len(own) == 0 { // a body of no heading: nothing to tell parts by
		return ""
	}
	var kept []string
	keep := false
	for _, l := range strings.Split(old, "\n") {
		if strings.HasPrefix(l, "## ") {
			keep = !own[strings.TrimSpace(l)]
		}
		if keep {
			kept = append(kept, l)
		}
	}
	return strings.TrimSpace(strings.Join(kept, "\n"))
}

func renderSection(o *options, r *results) string {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	dev := r.Device
	p("## Benchmark suite: %s device\n\n", dev)
	p("Written by `make bench` (`cmd/plover-bench-suite`), which replaces everything between the\n")
	p("`bench:%s` markers on every run; edit outside them. Numbers below are from its last run.\n\n", dev)
	p("- Machine: %s.\n", r.Machine)
	p("- Device: %s. Date: %s. Suite wall time: %.0f s. Served with `--isolation %s`.\n", r.DevName, r.Started.Format("2006-01-02 15:04 UTC"), r.WallS, r.Isolation)
	p("- Command: `%s`.\n", r.Command)
	p("- Load average (1 / 5 / 15 min) before the suite %s, after its measurements %s: work other than the\n", r.LoadBefore, r.LoadAfterRuns)
	p("  suite's own on this machine shows here and in the numbers.\n")
	p("- Client and server share the machine: on a %d-core machine the client's CPU time is taken from the server.\n\n", r.Machine.Cores)
	p("Reproduce:\n\n```sh\n")
	if dev == "host" {
		p("make bench   # builds bin/plover, the samples and bin/plover-bench-suite, then runs it (%s)\n", "a few minutes")
	} else {
		p("# where Go and nvcc are: make build samples cuda && go build -o bin/plover-bench-suite ./cmd/plover-bench-suite\n")
		p("bin/plover-bench-suite --device %s   # on the GPU machine; needs no Go toolchain\n", dev)
	}
	p("```\n\n")
	p("How each column is measured (times in ms; medians unless a column says otherwise):\n\n")
	p("- **cold**: the bundle only in the object store (a local file:// store): a fresh `plover serve` over an empty\n")
	p("  data directory, then `plover deploy --store` straight into its store (no server involved; a starting\n")
	p("  server fetches only bundles of functions with min_instances), then one request. %d trials; the server's\n", o.trials)
	p("  log confirms each request fetched the bundle.\n")
	p("- **warm** (PyPlover's sense): the bundle already in the node cache, no instance: a fresh `plover serve`\n")
	p("  process over the cache the cold trials filled, one request. %d trials. (The server labels this request\n", o.trials)
	p("  `X-Plover-Start: cold` too: its version was not loaded in that process.)\n")
	p("- **hot**: sequential requests (one connection) to the idle instance of one process, up to %d requests or %v.\n", o.hotRequests, o.hot)
	p("- **direct**: the same bundle and input in this process through `loader.Open` + `device.Device.LoadConstants` +\n")
	p("  `NewInstance` + `Instance.Run`, no HTTP and no runtime; *first call* from a fresh copy of the bundle\n")
	p("  (%d trials), *repeat* = `Run` again on that instance.\n", o.trials)
	p("- The server times `load` as one span; the suite splits it with the server's own `cold start` log line\n")
	p("  (`fetch_ms`: cache or store to an unpacked directory; `program_ms`: dlopen and symbol resolution).\n")
	p("  What remains of `load` is constants onto the device plus the first instance's buffers; the direct column\n")
	p("  shows those two separately.\n")
	p("- Starting the server process is not part of any request (Plover keeps a server running; PyPlover's cold\n")
	p("  figures include starting a container per request); it is its own row.\n\n")

	for _, f := range r.Functions {
		renderFunction(&b, f)
	}
	if r.Sweep != nil {
		renderSweep(&b, o, r.Sweep)
	}
	p("### Hot-path Go benchmarks\n\n")
	if r.GoBenchNo != "" {
		p("Not run: %s.\n\n", r.GoBenchNo)
	} else {
		p("`direct`/`engine`/`handler`/`loopback` are `BenchmarkHotInvoke` (a 64-byte echo through each layer);\n")
		p("`BenchmarkClientRequest` is the `plover bench` client's own request path against an in-process\n")
		p("server (0 allocs: it reuses one request and response per connection; the 4 MiB case's B/op is the\n")
		p("odd re-allocation of the response buffer after a GC empties fasthttp's buffer pool).\n\n")
		for _, g := range r.GoBench {
			p("```\n$ %s\n%s\n", g.Command, g.Output)
			if g.Failed != "" {
				p("FAILED: %s\n", g.Failed)
			}
			p("```\n\n")
		}
	}
	return b.String()
}

func renderFunction(b *strings.Builder, f *functionResult) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	p("### %s\n\n", f.Title)
	if f.Skipped != "" {
		p("Not measured in this run: %s.\n\n", f.Skipped)
		return
	}
	p("Bundle `%s`; input %s. Output check: served %s; direct %s.\n\n", f.Bundle, f.InputNote, f.Check, f.DirectCheck)
	if n := notFetched(f.Cold); n > 0 || f.ColdRetries > 0 {
		p("**Note:** %d cold trials were repeated and %d still found the bundle in the node cache (the server's\n", f.ColdRetries, n)
		p("bundle was already there): their fetch row is a cache hit.\n\n")
	}
	m := medians{f}
	renderCompared(b, f, m)
	renderWhere(b, f, m)
}

// medians are a function's results, each part's median (or a quantile of
// its hot requests).
type medians struct{ f *functionResult }

// first is the direct calls' first-call median of get.
func (m medians) first(get func(*directTrial) float64) float64 {
	return median(mapSlice(m.f.Direct.Trials, func(t directTrial) float64 { return get(&t) }))
}

// rep is the direct calls' repeats' median of get.
func (m medians) rep(get func(*directRepeat) float64) float64 {
	return median(mapSlice(m.f.Direct.Repeats, func(t directRepeat) float64 { return get(&t) }))
}

func (m medians) cold(get func(*served) float64) float64 { return median(mapSlice(m.f.Cold, get)) }
func (m medians) warm(get func(*served) float64) float64 { return median(mapSlice(m.f.Warm, get)) }
func (m medians) hot(get func(*served) float64, q float64) float64 {
	return quantile(mapSlice(m.f.Hot, get), q)
}

// servedStep is a served request's Server-Timing part i.
func servedStep(i int) func(*served) float64 { return func(s *served) float64 { return s.st(i) } }

func clientMs(s *served) float64 { return s.ClientMs }

// A direct call's run (copy in, kernels, copy out) and total, first and
// repeated.
func dFirstRun(t *directTrial) float64   { return t.CopyInMs + t.KernelsMs + t.CopyOutMs }
func dFirstTotal(t *directTrial) float64 { return t.OpenMs + t.ConstMs + t.InstanceMs + t.RunMs }
func dRepRun(t *directRepeat) float64    { return t.CopyInMs + t.KernelsMs + t.CopyOutMs }

// renderCompared is the comparison with PyPlover, row for row.
func renderCompared(b *strings.Builder, f *functionResult, m medians) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	ref := f.w.ref
	pyCol := func(col string, row int) string {
		for i, c := range ref.Columns {
			if c == col {
				return fmtMs(ref.Values[i][row])
			}
		}
		return "—"
	}
	zero := func(*served) float64 { return 0 }
	rows := []struct {
		name            string
		cold, warm, hot func(*served) float64
		dfirst, drep    float64
	}{
		{"load kernel (dlopen + symbols)", (*served).loadKernel, (*served).loadKernel, zero,
			m.first(func(t *directTrial) float64 { return t.OpenMs }), 0},
		{"load constants ¹", (*served).constsInstance, (*served).constsInstance, zero,
			m.first(func(t *directTrial) float64 { return t.ConstMs + t.InstanceMs }), 0},
		{"run (copy in + kernels + copy out)", (*served).run, (*served).run, (*served).run,
			m.first(dFirstRun), m.rep(dRepRun)},
		{"platform overhead ²", (*served).platform, (*served).platform, (*served).platform,
			m.first(func(t *directTrial) float64 { return t.RunMs - dFirstRun(t) }),
			m.rep(func(t *directRepeat) float64 { return t.RunMs - dRepRun(t) })},
		{"**total**", func(s *served) float64 { return s.ClientMs }, func(s *served) float64 { return s.ClientMs },
			func(s *served) float64 { return s.ClientMs }, m.first(dFirstTotal), m.rep(func(t *directRepeat) float64 { return t.RunMs })},
	}
	p("Compared with PyPlover (ms):\n\n")
	p("| | Plover cold | Plover warm | Plover hot | direct, first call | direct, repeat | PyPlover cold | PyPlover warm | PyPlover hot |\n")
	p("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for i, row := range rows {
		p("| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", row.name,
			fmtMs(m.cold(row.cold)), fmtMs(m.warm(row.warm)), fmtMs(m.hot(row.hot, 0.5)), fmtMs(row.dfirst), fmtMs(row.drep),
			pyCol("cold", i), pyCol("warm", i), pyCol("hot", i))
	}
	p("| served ÷ direct (total) | %s | %s | %s | | | | | |\n\n",
		ratio(m.cold(clientMs), m.first(dFirstTotal)), ratio(m.warm(clientMs), m.first(dFirstTotal)), ratio(m.hot(clientMs, 0.5), m.rep(func(t *directRepeat) float64 { return t.RunMs })))
	p("¹ The constants onto the device *and* the first instance's buffers: the server times them as one span\n")
	p("(what Server-Timing `load` holds beyond fetch and dlopen). Direct, apart: `LoadConstants` %s,\n",
		fmtMs(m.first(func(t *directTrial) float64 { return t.ConstMs })))
	p("`NewInstance` %s. PyPlover's row is the constants alone.\n", fmtMs(m.first(func(t *directTrial) float64 { return t.InstanceMs })))
	p("² Everything else in the client's latency: store lookup, fetch + sha256 + unpack (cold), engine, HTTP,\n")
	p("loopback, client. Direct: the device call's own overhead (`Run`'s wall time less its copy and kernel\n")
	p("times). PyPlover's cold figure includes starting a container.\n")
	p("%s.\n\n", ref.Note)

}

// renderWhere is where the time goes: each part of the requests, served
// and direct.
func renderWhere(b *strings.Builder, f *functionResult, m medians) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	p("Where the time goes (ms; hot: %d requests, %s):\n\n", len(f.Hot), hotStarts(f))
	p("| | cold | warm | hot p50 | hot p90 | hot p99 | direct, first call | direct, repeat |\n")
	p("|---|---:|---:|---:|---:|---:|---:|---:|\n")
	type drow struct {
		name         string
		get          func(*served) float64
		hotNA        bool
		dfirst, drep string
	}
	procStart := func(s *served) float64 { return s.ProcessStartMs }
	dr := []drow{
		{name: "server process start (not in any request)", get: procStart, hotNA: true, dfirst: "—", drep: "—"},
		{name: "fetch + verify + unpack (server log)", get: (*served).fetch, hotNA: true, dfirst: "—", drep: "—"},
		{name: "load kernel: dlopen + symbols (server log)", get: (*served).loadKernel, hotNA: true,
			dfirst: fmtMs(m.first(func(t *directTrial) float64 { return t.OpenMs })), drep: "—"},
		{name: "constants + first instance", get: (*served).constsInstance, hotNA: true,
			dfirst: fmtMs(m.first(func(t *directTrial) float64 { return t.ConstMs + t.InstanceMs })) + " (" +
				fmtMs(m.first(func(t *directTrial) float64 { return t.ConstMs })) + " + " +
				fmtMs(m.first(func(t *directTrial) float64 { return t.InstanceMs })) + ")", drep: "—"},
		{name: "queue", get: servedStep(bench.Queue), dfirst: "—", drep: "—"},
		{name: "copy in", get: servedStep(bench.CopyIn), dfirst: fmtMs(m.first(func(t *directTrial) float64 { return t.CopyInMs })),
			drep: fmtMs(m.rep(func(t *directRepeat) float64 { return t.CopyInMs }))},
		{name: "kernels", get: servedStep(bench.Kernels), dfirst: fmtMs(m.first(func(t *directTrial) float64 { return t.KernelsMs })),
			drep: fmtMs(m.rep(func(t *directRepeat) float64 { return t.KernelsMs }))},
		{name: "copy out", get: servedStep(bench.CopyOut), dfirst: fmtMs(m.first(func(t *directTrial) float64 { return t.CopyOutMs })),
			drep: fmtMs(m.rep(func(t *directRepeat) float64 { return t.CopyOutMs }))},
		{name: "engine: Server-Timing total − load − queue − run ³", get: (*served).engine,
			dfirst: fmtMs(m.first(func(t *directTrial) float64 { return t.RunMs - dFirstRun(t) })),
			drep:   fmtMs(m.rep(func(t *directRepeat) float64 { return t.RunMs - dRepRun(t) }))},
		{name: "HTTP + loopback + client: client − Server-Timing total", get: (*served).http, dfirst: "—", drep: "—"},
		{name: "**total (client)**", get: clientMs, dfirst: fmtMs(m.first(dFirstTotal)), drep: fmtMs(m.rep(func(t *directRepeat) float64 { return t.RunMs }))},
	}
	for _, row := range dr {
		h50, h90, h99 := fmtMs(m.hot(row.get, 0.5)), fmtMs(m.hot(row.get, 0.9)), fmtMs(m.hot(row.get, 0.99))
		if row.hotNA {
			h50, h90, h99 = "—", "—", "—"
			if row.name == dr[0].name {
				h50 = fmtMs(f.StartupHotMs)
			}
		}
		p("| %s | %s | %s | %s | %s | %s | %s | %s |\n", row.name, fmtMs(m.cold(row.get)), fmtMs(m.warm(row.get)), h50, h90, h99, row.dfirst, row.drep)
	}
	p("| X-Plover-Start | %s | %s | | | | | |\n\n", startsOf(f.Cold), startsOf(f.Warm))
	p("³ For the direct columns: `Run`'s wall time less its copy and kernel times (the cgo call, the error check).\n")
	p("Each row is its own median or percentile, so rows need not add up to the total. Hot client latency from\n")
	p("the run's histogram: p50 %s, p99 %s, max %s over %d requests at %.0f req/s.\n\n",
		fmtMs(f.HotRun.Latency.P50), fmtMs(f.HotRun.Latency.P99), fmtMs(f.HotRun.Latency.Max), f.HotRun.OK, f.HotRun.Throughput)
}

func renderSweep(b *strings.Builder, o *options, sw *sweepResult) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	p("### Latency against offered load (%s, open loop)\n\n", sw.Function)
	if sw.Note != "" {
		p("**Note:** %s.\n\n", sw.Note)
	}
	p("![p50/p90/p99 latency of %s against offered load](%s)\n\n", sw.Function, o.chart)
	p("One warm `plover serve` (default settings: 4 instances per function). A %d-connection closed loop found\n", sw.ProbeConcurrency)
	p("%.0f req/s; each rate below is a fraction of that, offered for %.0f s by an open loop (`plover bench --rate`)\n", sw.Capacity, sw.Seconds)
	p("with at most %d requests in flight. Latency counts from each request's scheduled send time, so queueing\n", sw.MaxInFlight)
	p("behind a busy server shows (no coordinated omission). One exception: when a connection was idle at the\n")
	p("scheduled time, the client's own timer wake-up delay (*wake lag*: Go timers wake up to ≈1 ms late in an\n")
	p("idle process) is not counted, up to %v. *late*: sent over %v after their time (no connection free);\n", bench.MaxWakeLag, bench.LateSlack)
	p("*unsent*: due but never sent before the end (their latency is in no percentile).\n\n")
	p("| offered req/s | achieved req/s | p50 ms | p90 ms | p99 ms | max ms | sent | late | unsent | errors | wake lag ms |\n")
	p("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, pt := range sw.Points {
		mark := ""
		if pt.saturated() {
			mark = " ⚠"
		}
		p("| %g%s | %.0f | %s | %s | %s | %s | %d | %d | %d | %d | %s |\n", pt.Offered, mark, pt.Achieved,
			fmtMs(pt.P50), fmtMs(pt.P90), fmtMs(pt.P99), fmtMs(pt.Max), pt.Sent, pt.Late, pt.Unsent, pt.Errors, fmtMs(pt.WakeLag))
	}
	p("\n⚠: the schedule was not kept (over 1%% unsent, or errors): the offered load is past what this machine\n")
	p("sustains with client and server on it together.\n\n")
}

func notFetched(ss []*served) int {
	n := 0
	for _, s := range ss {
		if s.Log != nil && !s.Log.Fetched {
			n++
		}
	}
	return n
}

func hotStarts(f *functionResult) string {
	s := f.HotRun.Starts
	return fmt.Sprintf("X-Plover-Start hot %d, warm %d, cold %d", s.Hot, s.Warm, s.Cold)
}

func startsOf(ss []*served) string {
	n := map[string]int{}
	var order []string
	for _, s := range ss {
		if n[s.Start] == 0 {
			order = append(order, s.Start)
		}
		n[s.Start]++
	}
	var parts []string
	for _, k := range order {
		parts = append(parts, fmt.Sprintf("%s ×%d", k, n[k]))
	}
	return strings.Join(parts, ", ")
}

func mapSlice[T any](in []T, f func(T) float64) []float64 {
	out := make([]float64, 0, len(in))
	for _, v := range in {
		out = append(out, f(v))
	}
	return out
}

func median(v []float64) float64 { return quantile(v, 0.5) }

// quantile is the nearest-rank quantile of the values that are not NaN;
// the median of an even count is the mean of the middle two.
func quantile(v []float64, q float64) float64 {
	s := make([]float64, 0, len(v))
	for _, x := range v {
		if !math.IsNaN(x) {
			s = append(s, x)
		}
	}
	if len(s) == 0 {
		return math.NaN()
	}
	slices.Sort(s)
	if q == 0.5 && len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	k := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(0, min(k, len(s)-1))]
}

// fmtMs prints milliseconds with about three significant digits.
// quantileMs is quantile q of v (ms) as a table's cell, or "= max (n=N)"
// where so few values (NaNs left out, as quantile does) have no q but
// their largest (bench.QuantileIsMax): p99 of 20 readings is the slowest.
func quantileMs(v []float64, q float64) string {
	n := 0
	for _, x := range v {
		if !math.IsNaN(x) {
			n++
		}
	}
	if bench.QuantileIsMax(q, int64(n)) {
		return fmt.Sprintf("= max (n=%d)", n)
	}
	return fmtMs(quantile(v, q))
}

func fmtMs(v float64) string {
	a := math.Abs(v)
	switch {
	case math.IsNaN(v):
		return "n/a"
	case v == 0:
		return "0"
	case a < 0.001: // below Server-Timing's resolution
		return "<0.001"
	case a < 1:
		return fmt.Sprintf("%.3f", v)
	case a < 10:
		return fmt.Sprintf("%.2f", v)
	case a < 100:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.0f", v)
}

func ratio(a, b float64) string {
	if math.IsNaN(a) || math.IsNaN(b) || b <= 0 {
		return "n/a"
	}
	if a/b >= 10 {
		return fmt.Sprintf("%.0f×", a/b)
	}
	return fmt.Sprintf("%.2f×", a/b)
}

// writeSection replaces the bench:key section of the output markdown with
// body (or prints it with --dry-run), and writes v beside the build as
// build/bench/key.json.
func writeSection(o *options, key, body string, v any) error {
	jsonPath := inRepo(o, filepath.Join("build", "bench", key+".json"))
	if err := os.MkdirAll(filepath.Dir(jsonPath), 0o755); err == nil {
		if raw, err := json.MarshalIndent(v, "", "  "); err == nil {
			os.WriteFile(jsonPath, raw, 0o644)
		}
	}
	if o.dryRun {
		fmt.Print(body)
		return nil
	}
	mdPath := inRepo(o, o.out)
	doc, err := os.ReadFile(mdPath)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	if err := os.WriteFile(mdPath, []byte(replaceSection(string(doc), key, body)), 0o644); err != nil {
		return err
	}
	logf("wrote the bench:%s section of %s", key, mdPath)
	fmt.Print(body)
	return nil
}

// runMachine is a section's line naming the machine, the build, the start
// and the load around the runs.
func runMachine(res *results, plover string) string {
	return fmt.Sprintf("Machine: %s; %s; started %s; load %s → %s.\n\n", res.Machine.CPU, plover, res.Started.Format("2006-01-02 15:04 UTC"), res.LoadBefore, res.LoadAfterRuns)
}

// writePlain writes plainCost's table, this build against an earlier one,
// under intro, and the ratios as what (this build's feature against none).
func writePlain(b *strings.Builder, plain []*plainRun, intro, what string) {
	if len(plain) != 2 {
		return
	}
	fmt.Fprintf(b, "%s: the CNN alone, hot, %d requests on each of two servers running side by side, in alternating blocks:\n\n", intro, len(plain[0].Client))
	b.WriteString("| binary | client p50 ms | client p99 ms | server p50 ms |\n|---|---|---|---|\n")
	for _, r := range plain {
		fmt.Fprintf(b, "| %s | %s | %s | %s |\n", r.Plover, fmtMs(median(r.Client)), fmtMs(quantile(r.Client, 0.99)), fmtMs(median(r.Server)))
	}
	fmt.Fprintf(b, "\n- %s: client p50 %s, server p50 %s.\n\n", what, ratio(median(plain[0].Client), median(plain[1].Client)), ratio(median(plain[0].Server), median(plain[1].Server)))
}
