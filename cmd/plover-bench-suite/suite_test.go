package main

import (
	"encoding/xml"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
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

// Each fair mode names the serve flags it differs by; --fair-modes keeps
// only the modes it lists, in the suite's order.
func TestFairModes(t *testing.T) {
	for _, tt := range []struct{ mode, want string }{
		{"fair", "--sched fair"},
		{"fair-noio", "--sched fair --io-shares off"},
		{"fair-flood1", "--sched fair --flood-runs 1"},
		{"fair-piece", "--sched fair --copy-piece 256"},
		{"fair-flood1-piece", "--sched fair --flood-runs 1 --copy-piece 256"},
		{"fair-nice-noboost", "--sched fair --cgroup-root /d/no-cgroups --light-boost 1"},
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
	if got := chosenModes(&options{}, fairModes); len(got) != len(fairModes) {
		t.Errorf("no --fair-modes kept %d of %d modes", len(got), len(fairModes))
	}
}

// The sparse rounds' table: a column per target, the medians over the
// rounds with their ratios to alone, and each target beside the flood
// against the floor of a process each (always the last column).
func TestWriteFairSparse(t *testing.T) {
	v := func(mode string, a50, a99, b50, b99, flood float64) fairVictim {
		return fairVictim{Mode: mode, Alone: fairLoad{P50: a50, P99: a99}, Beside: fairLoad{P50: b50, P99: b99}, Flood: flood}
	}
	fr := &fairRun{Clients: 8, Time: 5, SparseTargets: []string{"fair", floorOne, floorTwo}, SparseBurns: [2]float64{0.58, 0.05},
		Sparse: [][]fairVictim{
			{v("fair", 0.6, 1.0, 0.6, 4.0, 250), v(floorOne, 0.3, 0.6, 5.0, 20, 600), v(floorTwo, 0.3, 0.5, 0.4, 6.0, 620)},
			{v("fair", 0.7, 1.2, 0.8, 6.0, 230), v(floorOne, 0.3, 0.6, 6.0, 24, 580), v(floorTwo, 0.3, 0.5, 0.4, 8.0, 600)},
			{v("fair", 0.6, 1.1, 0.7, 5.0, 240), v(floorOne, 0.3, 0.6, 7.0, 22, 590), v(floorTwo, 0.3, 0.5, 0.4, 10, 610)},
		}}
	var b strings.Builder
	writeFairSparse(func(f string, a ...any) { fmt.Fprintf(&b, f, a...) }, fr)
	out := b.String()
	for _, want := range []string{
		"| round | fair | echo, one process | echo, a process each |",
		"| 2 | 0.700 / 1.20 → 0.800 / 6.00 |",
		"| median | 0.600 / 1.10 → 0.700 / 5.00 (1.17× / 4.55× of alone; flood 240/s) |",
		"vecadd 0.580 ms, the CNN 0.050 ms",
		"`fair` 1.75× / 0.62×; `echo, one process` 15× / 2.75×.",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
}
