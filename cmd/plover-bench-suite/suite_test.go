package main

import (
	"context"
	"encoding/xml"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/bench"
)

func TestReplaceSection(t *testing.T) {
	doc := "# Benchmarks\n\nhand-written notes\n\n## GPU\n\n| a | b |\n|---|---|\n| x | not yet measured |\n"
	// First run: the host section goes before the GPU heading.
	d1 := replaceSection(doc, "host", "## Suite\n\nrun 1\n")
	if !strings.Contains(d1, "hand-written notes\n\n<!-- bench:host:begin -->\n## Suite\n\nrun 1\n<!-- bench:host:end -->\n\n## GPU\n") {
		t.Fatalf("first insert:\n%s", d1)
	}
	// Second run replaces only its own section.
	d2 := replaceSection(d1+"\nnotes after\n", "host", "## Suite\n\nrun 2\n")
	if strings.Contains(d2, "run 1") || !strings.Contains(d2, "run 2") || strings.Count(d2, "bench:host:begin") != 1 {
		t.Fatalf("second run:\n%s", d2)
	}
	for _, keep := range []string{"hand-written notes", "not yet measured", "notes after", "## GPU"} {
		if !strings.Contains(d2, keep) {
			t.Fatalf("lost %q:\n%s", keep, d2)
		}
	}
	// A GPU section is separate and goes at the end; the host one stays.
	d3 := replaceSection(d2, "cuda", "gpu numbers")
	if !strings.HasSuffix(d3, "<!-- bench:cuda:begin -->\ngpu numbers\n<!-- bench:cuda:end -->\n") || !strings.Contains(d3, "run 2") {
		t.Fatalf("cuda section:\n%s", d3)
	}
	if d4 := replaceSection(d3, "host", "run 3"); !strings.Contains(d4, "gpu numbers") || strings.Contains(d4, "run 2") {
		t.Fatalf("host rerun lost the cuda section:\n%s", d4)
	}
	if got := replaceSection("", "host", "x"); got != "<!-- bench:host:begin -->\nx\n<!-- bench:host:end -->\n" {
		t.Fatalf("empty doc: %q", got)
	}
	// A hand-written section put inside the markers is kept, above them:
	// the batch run deleted the GPU's fifth run so.
	in := "# B\n\n<!-- bench:batch-host:begin -->\n## GPU, fifth run\n\nhand\n\n## Batching (host)\n\nold figures\n<!-- bench:batch-host:end -->\n\nafter\n"
	got := replaceSection(in, "batch-host", "## Batching (host)\n\nnew figures\n")
	if want := "# B\n\n## GPU, fifth run\n\nhand\n\n<!-- bench:batch-host:begin -->\n## Batching (host)\n\nnew figures\n<!-- bench:batch-host:end -->\n\nafter\n"; got != want {
		t.Fatalf("a hand-written section inside the markers:\n%s\nwant\n%s", got, want)
	}
}

// A section whose end marker was lost (an edit outside the markers that
// took it along) must not cost the text after it: the suite's next runs
// replace their own section and nothing else, where the old code, on its
// second run, cut everything from the orphaned begin marker to the new
// section's end.
func TestReplaceSectionWithoutEndMarkerKeepsText(t *testing.T) {
	doc := "# Benchmarks\n\n<!-- bench:host:begin -->\nold figures\n\n## Notes\n\nkeep me\n\n## GPU\n\ngpu rows\n"
	d := doc
	for run := 1; run <= 3; run++ {
		d = replaceSection(d, "host", fmt.Sprintf("run %d", run))
		for _, keep := range []string{"keep me", "gpu rows", "## Notes", "old figures", fmt.Sprintf("run %d", run)} {
			if !strings.Contains(d, keep) {
				t.Fatalf("run %d lost %q:\n%s", run, keep, d)
			}
		}
		if n, m := strings.Count(d, "<!-- bench:host:begin -->"), strings.Count(d, "<!-- bench:host:end -->"); n != 1 || m != 1 {
			t.Fatalf("run %d: %d begin and %d end markers, want one each:\n%s", run, n, m, d)
		}
		if run > 1 && strings.Contains(d, fmt.Sprintf("run %d", run-1)) {
			t.Fatalf("run %d kept run %d's section:\n%s", run, run-1, d)
		}
	}
}

func TestQuantileAndFormat(t *testing.T) {
	if m := median([]float64{3, 1, 2}); m != 2 {
		t.Fatal(m)
	}
	if m := median([]float64{4, 1, 3, 2}); m != 2.5 {
		t.Fatal(m)
	}
	if m := median([]float64{math.NaN(), 5}); m != 5 {
		t.Fatal(m)
	}
	if m := median(nil); !math.IsNaN(m) {
		t.Fatal(m)
	}
	v := make([]float64, 100)
	for i := range v {
		v[i] = float64(100 - i)
	}
	if q := quantile(v, 0.99); q != 99 {
		t.Fatal(q)
	}
	if q := quantile(v, 0.9); q != 90 {
		t.Fatal(q)
	}
	for in, want := range map[float64]string{0: "0", 0.0004: "<0.001", 0.0421: "0.042", 1.234: "1.23", 12.34: "12.3", 2155.74: "2156", math.NaN(): "n/a"} {
		if got := fmtMs(in); got != want {
			t.Errorf("fmtMs(%v) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[float64]float64{7158: 7200, 715.8: 720, 3579: 3600, 0.4: 1, 12: 12} {
		if got := roundRate(in); got != want {
			t.Errorf("roundRate(%v) = %v, want %v", in, got, want)
		}
	}
	if _, err := parseFractions("0.5,x"); err == nil {
		t.Error("bad fraction accepted")
	}
	if f, err := parseFractions("1,0.5"); err != nil || f[0] != 0.5 {
		t.Errorf("%v %v", f, err)
	}
}

func TestChartIsWellFormedSVG(t *testing.T) {
	sw := &sweepResult{Function: "cnn", Capacity: 7158, Points: []sweepPoint{
		{Offered: 720, P50: 0.3, P90: 0.4, P99: 0.9, Sent: 100},
		{Offered: 3600, P50: 0.46, P90: 1.5, P99: 2.0, Sent: 100},
		{Offered: 8600, P50: 40, P90: 90, P99: 120, Sent: 100, Unsent: 30},
	}, Note: "a <note> & more"}
	r := &results{Device: "host", Machine: machine{CPU: "Intel(R) Xeon(R) <x>", Cores: 2}, Started: time.Now()}
	svg := renderChart(sw, r)
	d := xml.NewDecoder(strings.NewReader(svg))
	n := 0
	for {
		tok, err := d.Token()
		if err != nil {
			if err.Error() == "EOF" {
				break
			}
			t.Fatalf("not well-formed XML: %v\n%s", err, svg)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "polyline" {
			n++
		}
	}
	if n != 3 {
		t.Fatalf("%d lines, want p50, p90, p99", n)
	}
	if !strings.Contains(svg, `fill="white" stroke="#d62728"`) {
		t.Fatal("the saturated point is not drawn hollow")
	}
}

// TestSuiteEndToEnd runs the whole suite briefly against real plover serve
// processes, with a throwaway markdown file. It needs the vecadd sample
// (make samples) and builds bin/plover into a temp dir.
func TestSuiteEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds plover and starts servers")
	}
	repo, _ := filepath.Abs("../..")
	samples := filepath.Join(repo, "build", "samples")
	if _, err := os.Stat(filepath.Join(samples, "vecadd-host", "plover.json")); err != nil {
		t.Skip("no build/samples/vecadd-host: run make samples")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go to build plover with")
	}
	tmp := t.TempDir()
	plover := filepath.Join(tmp, "plover")
	if out, err := exec.Command("go", "build", "-o", plover, "../../cli/plover").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	md := filepath.Join(tmp, "B.md")
	os.WriteFile(md, []byte("# B\n\nkeep me\n\n## GPU\n\nnot yet measured\n"), 0o644)
	o := &options{repo: repo, plover: plover, device: "host", isolation: "process", samples: samples, functions: "vecadd,cnn",
		trials: 2, hot: 300 * time.Millisecond, hotRequests: 50, probe: 300 * time.Millisecond, sweepTime: 300 * time.Millisecond,
		fractions: "0.5,1", out: md, chart: filepath.Join(tmp, "chart.svg"), jsonOut: filepath.Join(tmp, "r.json"), goBench: "off"}
	if err := run(o); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(md)
	doc := string(b)
	for _, want := range []string{"keep me", "not yet measured", "<!-- bench:host:begin -->", "### vecadd, n = 1,000,000 float32",
		"| **total** |", "served ÷ direct", "all 1000000 sums equal vecadd-expected.bin", "cold ×2"} {
		if !strings.Contains(doc, want) {
			t.Errorf("BENCHMARKS lacks %q", want)
		}
	}
	if strings.Index(doc, "bench:host:end") > strings.Index(doc, "## GPU") {
		t.Error("host section not before the GPU section")
	}
	if _, err := os.Stat(filepath.Join(tmp, "chart.svg")); err != nil {
		t.Error(err)
	}
	if _, err := os.Stat(filepath.Join(tmp, "r.json")); err != nil {
		t.Error(err)
	}
}

// A fair server's queue holds every client of the bench's largest load:
// vecadd-b's in the I/O split (4 times a's, a's twice the CPUs at least).
func TestFairQueue(t *testing.T) {
	for _, tt := range []struct{ clients, cpus, want int }{
		{8, 2, 32},
		{8, 16, 128},
		{40, 2, 160},
	} {
		if got := fairQueue(tt.clients, tt.cpus); got != tt.want {
			t.Errorf("fairQueue(%d clients, %d CPUs) = %d, want %d", tt.clients, tt.cpus, got, tt.want)
		}
	}
}

// Each fair mode names the serve flags it differs by; --fair-modes keeps
// only the modes it lists, in the suite's order.
func TestFairModes(t *testing.T) {
	for _, tt := range []struct{ mode, want string }{
		{"fair", "--sched fair"},
		{"fair-noio", "--sched fair --io-shares off"},
		{"fair-flood1", "--sched fair --flood-runs 1"},
		{"fair-piece", "--sched fair --copy-piece 256"},
		{"fair-flood1-piece", "--sched fair --flood-runs 1 --copy-piece 256"},
		{"fair-tenant", "--sched fair --worker-scope tenant"},
		{"fair-tenant-piece", "--sched fair --worker-scope tenant --copy-piece 256"},
		{"fair-nice-noboost", "--sched fair --cgroup-root /d/no-cgroups --light-boost 1"},
		{"fair-nice-noslice", "--sched fair --cgroup-root /d/no-cgroups --light-slice 0"},
		{"fair-nice-root", "--sched fair --cgroup-root /d/no-cgroups"},
		{"off", "--sched off"},
		{"none", "--sched off --cpu-weights=false"},
	} {
		if got := strings.Join(fairFlags("/d", tt.mode), " "); got != tt.want {
			t.Errorf("%s: %q, want %q", tt.mode, got, tt.want)
		}
	}
	o := &options{fairModes: []string{"off", "fair-flood1-piece", "fair-flood1", "fair"}}
	if got := strings.Join(chosenModes(o, fairRoundModes), ","); got != "fair,fair-flood1,fair-flood1-piece" {
		t.Errorf("round modes %q", got)
	}
	if got := chosenModes(&options{}, fairModes); len(got) != len(fairModes)-len(fairOptIn) || slices.Contains(got, "fair-tenant") {
		t.Errorf("no --fair-modes kept %v of %d modes; want all but %v", got, len(fairModes), fairOptIn)
	}
}

// The sparse rounds' table: a column per target, each round's p50 / max
// (80 requests: a nearest-rank p99 would be the maximum, and the cells
// said p99 of what was the maximum), then p50 / p99 of the rounds'
// requests pooled, with their ratios to alone, and each target beside
// the flood against the floor of a process each (always the last column).
// Fair's rounds beside the flood each have one hiccup, 50 ms and 6 ms:
// the pooled p99 of 160 is the second slowest, 6 ms, where the median of
// the rounds' maxima read 28 ms.
func TestWriteFairSparse(t *testing.T) {
	lat := func(base, top float64) []float64 {
		v := make([]float64, 80)
		for i := range v {
			v[i] = base
		}
		v[79] = top
		return v
	}
	load := func(p50, top float64) fairLoad {
		return fairLoad{P50: p50, P99: top, Max: top, Lat: lat(p50, top)}
	}
	v := func(mode string, alone, beside fairLoad, flood float64) fairVictim {
		return fairVictim{Mode: mode, Alone: alone, Beside: beside, Flood: flood}
	}
	fr := &fairRun{Clients: 8, Time: 5, SparseTargets: []string{"fair", floorOne, floorTwo}, SparseBurns: [2]float64{0.58, 0.05},
		Sparse: [][]fairVictim{
			{v("fair", load(0.6, 1.0), load(0.8, 50), 250), v(floorOne, load(0.3, 0.6), load(5.0, 20), 600), v(floorTwo, load(0.3, 0.5), load(0.4, 6.0), 620)},
			{v("fair", load(0.6, 1.2), load(0.8, 6.0), 230), v(floorOne, load(0.3, 0.6), load(6.0, 24), 580), v(floorTwo, load(0.3, 0.5), load(0.4, 8.0), 600)},
		}}
	fr.Sparse[1][0].Beside.WakeLagMax = 1.5
	var b strings.Builder
	writeFairSparse(func(f string, a ...any) { fmt.Fprintf(&b, f, a...) }, fr)
	out := b.String()
	wantAll(t, out,
		"| round | fair | echo, one process | echo, a process each |",
		"alone p50 / max → beside p50 / max ms of the round's 80 requests",
		"| 1 | 0.600 / 1.00 → 0.800 / 50.0 |",
		"| pooled p50 / p99 (160 requests a cell: p99 their 2nd slowest) | 0.600 / 1.00 → 0.800 / 6.00 (1.33× / 6.00× of alone; flood 240/s) |",
		"vecadd 0.580 ms, the CNN 0.050 ms",
		"`fair` 2.00× / 1.00×; `echo, one process` 15× / 3.33×.",
		"woke up to 1.50 ms late",
	)
	if strings.Contains(out, "28.0") {
		t.Errorf("a median of maxima in:\n%s", out)
	}
}

// A fairness report counts failed requests where they happened: the
// victim's latency covers its 2xx answers only, so one whose slow requests
// failed read better, and nothing said so. Each cell with failures says
// how many and a line under its table names them; the one-reading ratios
// (fair ÷ off, the flood alone ÷ off, beside the compute flood) say they
// are one reading.
func TestWriteFairSaysWhatFailed(t *testing.T) {
	tmp := t.TempDir()
	o := &options{repo: tmp, out: "B.md", isolation: "process"}
	res := &results{Device: "host", Started: time.Now()}
	ok := fairLoad{P50: 1, P99: 2, Throughput: 100}
	bad := fairLoad{P50: 1, P99: 2, Throughput: 100, Errors: 7}
	mode := func(name string) *fairMode {
		return &fairMode{Mode: name, Alone: ok, Alone4: ok, LatAlone: ok, LatBeside: ok, BatchBeside: ok, FloodAlone: ok,
			Beside:     map[string]fairLoad{"spin": ok, "vecadd": ok},
			Neighbours: map[string]fairLoad{"spin": ok, "vecadd": ok}}
	}
	fair, off := mode("fair"), mode("off")
	fair.Beside["vecadd"] = bad
	fair.IO.Clients = [2]int{32, 128} // the caption says what the first mode ran
	fair.IO.Errors, fair.IO.Why = [2]int64{0, 113}, [2]string{"", "status 429: busy: function vecadd-b is busy"}
	// off has no gRPC flood (a server without --grpc-listen); fair's has
	// figures of its own, so that a cell read from another load shows.
	grpcVictim := fairLoad{P50: 3, P99: 10, Throughput: 100, Errors: 2, CommonError: "status 503: no worker"}
	grpcVictim.Server.Dispatch = bench.Summary{N: 5, P50: 0.5, P99: 7}
	grpcVictim.Server.Total = bench.Summary{N: 5, P50: 1, P99: 9}
	fair.Beside[viaGRPC], fair.Neighbours[viaGRPC] = grpcVictim, fairLoad{Throughput: 77}
	off.Neighbours["spin"] = fairLoad{Throughput: 50, Errors: 3}
	off.Shares = []fairShares{{Clients: 4, Throughput: [2]int64{10, 5}, Errors: [2]int64{0, 2}}}
	fr := &fairRun{Clients: 8, Time: 5, Modes: []*fairMode{fair, off}, RoundModes: []string{"fair"},
		Rounds: [][]fairVictim{{{Mode: "fair", Alone: ok, Beside: ok, Flood: 90}}, {{Mode: "fair", Alone: ok, Beside: bad, Flood: 80, FloodErrors: 4}}}}
	if err := writeFair(o, res, fr); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(tmp, "B.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := string(b)
	wantAll(t, out,
		"| mode | victim alone p50 / p99 ms | beside spin: p50 / p99 (one reading) | beside vecadd: p50 / p99 (one reading) | beside vecadd over gRPC: p50 / p99 (one reading) | spin, vecadd, vecadd over gRPC served/s,",
		"| fair | 1.00 / 2.00 | 1.00× / 1.00× | 1.00× / 1.00× (**7 failed**) | 3.00× / 5.00× (**2 failed**) | 100, 100, 77 |",
		"| off | 1.00 / 2.00 | 1.00× / 1.00× | 1.00× / 1.00× | - | 50 (**3 failed**), 100, - |",
		"| fair | beside vecadd over gRPC | n/a | n/a | n/a | n/a | n/a | n/a | 0.500 / 7.00 | n/a | n/a | 1.00 / 9.00 |",
		"**Requests lost to the figures above**",
		"fair, the victim beside vecadd: 7 failed; fair, the victim beside vecadd over gRPC: 2 failed (the most common: status 503: no worker); off, the spin flood: 3 failed.",
		"10, 5 (**2 failed**)",
		"off, 4 clients, spin-b: 2 failed",
		"| 2 | 2.00 → 1.00 / 2.00 (**7 failed**) (flood: **4 failed**) |",
		"round 2, fair, the victim beside the flood: 7 failed; round 2, fair, the flood: 4 failed.",
		"beside spin: p50 / p99 (one reading)",
		"fair over off (work conservation: the scheduler costs nothing uncontended), one reading each",
		"vecadd alone: served/s (÷ off: one reading each)",
		"vecadd-a (share 3, 4 MB bodies and answers, 32 clients: ",
		"vecadd-b (share 1, 1 MB, 128 clients: ",
		"fair, vecadd-b: 113 failed (the most common: status 429: busy: function vecadd-b is busy)",
	)
	if strings.Contains(out, "| off | beside vecadd over gRPC |") {
		t.Error("a mode without a gRPC flood has a row for it in where the victim's time went")
	}
}

// The sparse loop keeps each answered request's latency, for the rounds
// to pool (a round's 80 have no p99 but their slowest), and counts the
// failed ones apart: every request due is in one or the other.
func TestSparseLoopKeepsLatenciesAndFailures(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1)%5 == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok"))
	}))
	defer srv.Close()
	l, err := sparseLoop(context.Background(), srv.URL, "cnn", []byte("x"), 20, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if l.Errors != 4 || len(l.Lat) != 16 || l.Unsent != 0 || l.Max != slices.Max(l.Lat) {
		t.Fatalf("errors %d, %d latencies (max %v of %v), unsent %d: want 4 failed and 16 kept of 20 due", l.Errors, len(l.Lat), l.Max, l.Lat, l.Unsent)
	}
}

// wantAll fails t for each of wants that out lacks.
func wantAll(t *testing.T, out string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
}

// --fair-grpc auto floods through gRPC on the host device only: the GPU
// check's window has no room for the extra flood.
func TestFairGRPCOn(t *testing.T) {
	for _, c := range []struct {
		flag, device string
		want         bool
	}{
		{"auto", "host", true},
		{"auto", "cuda", false},
		{"on", "cuda", true},
		{"off", "host", false},
	} {
		o := &options{fairGRPC: c.flag, device: c.device}
		if got := o.fairGRPCOn(); got != c.want {
			t.Errorf("--fair-grpc %s on %s: %v, want %v", c.flag, c.device, got, c.want)
		}
	}
}

// The flood's plover bench arguments: a gRPC address is called through
// --grpc (which bench uses as its server too), an HTTP one through
// --server.
func TestFloodArgs(t *testing.T) {
	for _, c := range []struct{ url, want string }{
		{"http://127.0.0.1:8080", "--server http://127.0.0.1:8080"},
		{"grpc://127.0.0.1:8001", "--grpc grpc://127.0.0.1:8001"},
		{"grpcs://127.0.0.1:8001", "--grpc grpcs://127.0.0.1:8001"},
	} {
		args := strings.Join(floodArgs(c.url, "vecadd", "in.bin", 8, 5*time.Second), " ")
		if want := "bench vecadd " + c.want + " --in in.bin --concurrency 8 --duration 5s"; !strings.HasPrefix(args, want) {
			t.Errorf("%s: %q, want it to start %q", c.url, args, want)
		}
	}
}

// vecadd-a's clients can ask for every I/O slot (one a CPU) of the server.
func TestIOSplitAClients(t *testing.T) {
	for _, tc := range []struct{ clients, cpus, want int }{
		{8, 2, 8},   // the dev VM: as before
		{8, 4, 8},   // twice the CPUs is the benchmark's
		{8, 16, 32}, // the H200's host: 8 could hold half the slots
		{40, 16, 40},
	} {
		if got := ioSplitAClients(tc.clients, tc.cpus); got != tc.want {
			t.Errorf("ioSplitAClients(%d, %d) = %d, want %d", tc.clients, tc.cpus, got, tc.want)
		}
	}
}
