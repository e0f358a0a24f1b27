// Command testreport reads `go test -json` on stdin and prints what a person
// running `make test` wants to see as it happens: each package's result
// when it ends, a line for every test still running after a while (so
// minutes of a slow package are not minutes of silence), and at the end
// every test that was skipped, with its reason, since `ok` alone hides
// them. It exits 1 when anything failed or the stream ended early.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

// slowAfter is how long a test runs before it is announced, and again
// every slowAfter after.
const slowAfter = 20 * time.Second

// skip is one skipped test and why.
type skip struct{ pkg, test, why string }

type report struct {
	mu      sync.Mutex
	out     io.Writer
	running map[string]time.Time // "pkg Test" -> started
	said    map[string]time.Time // last announced
	output  map[string]*kept     // a test's output, for its failure or skip reason
	skips   []skip
	failed  []string
	pkgs    int
}

func newReport(out io.Writer) *report {
	return &report{out: out, running: map[string]time.Time{}, said: map[string]time.Time{}, output: map[string]*kept{}}
}

// A test's output is kept whole up to headLines+tailLines lines. Past that
// the first headLines and the last tailLines stay, and between them only
// the lines that begin one of the test's messages (t.Error, t.Fatal, t.Log:
// "    file_test.go:12: "), up to midMessages of them: a test that prints a
// long log (a server's, on failure) must not push the assertion that
// failed it out of sight. What is left out is said where it was.
const (
	headLines   = 50
	tailLines   = 150
	midMessages = 200
)

var messageRE = regexp.MustCompile(`^ +[\w./-]+\.go:\d+: `)

type kept struct {
	lines []string // the head, then what was kept of the middle
	tail  []string // the last tailLines lines
	msgs  int      // message lines kept in the middle
	gap   int      // lines left out since the last line kept in the middle
}

func (k *kept) add(line string) {
	if len(k.lines) < headLines && len(k.tail) == 0 {
		k.lines = append(k.lines, line)
		return
	}
	k.tail = append(k.tail, line)
	if len(k.tail) <= tailLines {
		return
	}
	out := k.tail[0]
	k.tail = k.tail[1:]
	if k.msgs < midMessages && messageRE.MatchString(out) {
		k.flush()
		k.lines = append(k.lines, out)
		k.msgs++
		return
	}
	k.gap++
}

// flush notes the lines left out since the last one kept.
func (k *kept) flush() {
	if k.gap > 0 {
		k.lines = append(k.lines, fmt.Sprintf("        ... (testreport: %d lines left out here)\n", k.gap))
		k.gap = 0
	}
}

// all is what was kept, in order, with the gaps said.
func (k *kept) all() []string {
	if k == nil {
		return nil
	}
	k.flush()
	return append(k.lines[:len(k.lines):len(k.lines)], k.tail...)
}

func main() {
	r := newReport(os.Stdout)
	done := make(chan struct{})
	go r.announce(done)
	ok := r.read(os.Stdin)
	close(done)
	r.summary(ok)
	if !ok || len(r.failed) > 0 {
		os.Exit(1)
	}
}

// read handles the stream; false if a line was not an event (the go
// command's own errors, a build failure) or nothing was read at all.
func (r *report) read(in io.Reader) bool {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	ok, any := true, false
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if json.Unmarshal(line, &e) != nil || e.Action == "" {
			fmt.Fprintf(r.out, "%s\n", line) // not an event: show it as it is
			if len(line) > 0 {
				ok = false
			}
			continue
		}
		any = true
		r.handle(e)
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintf(r.out, "testreport: reading go test's output: %v\n", err)
		return false
	}
	return ok && any
}

func (r *report) handle(e event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	key := e.Package + " " + e.Test
	switch {
	case e.Action == "build-output":
		fmt.Fprint(r.out, e.Output)
	case e.Test == "" && e.Action == "output":
		// A package's own lines: its ok/FAIL line is printed below; others
		// (a panic, a TestMain's notice) are shown as they come.
		if !strings.HasPrefix(e.Output, "ok ") && !strings.HasPrefix(e.Output, "FAIL") && !strings.HasPrefix(e.Output, "PASS") &&
			!strings.HasPrefix(e.Output, "?") && !strings.HasPrefix(e.Output, "coverage:") {
			fmt.Fprint(r.out, e.Output)
		}
	case e.Test == "" && (e.Action == "pass" || e.Action == "fail" || e.Action == "skip"):
		r.pkgs++
		if e.Action == "fail" {
			// Tests that never ended (a timeout's panic, a crash) hold the
			// lines saying why; show them before the package's failure.
			var open []string
			for k := range r.output {
				if strings.HasPrefix(k, e.Package+" ") {
					open = append(open, k)
				}
			}
			sort.Strings(open)
			for _, k := range open {
				fmt.Fprintf(r.out, "--- did not end: %s\n%s", k, strings.Join(r.output[k].all(), ""))
				delete(r.output, k)
				delete(r.running, k)
				delete(r.said, k)
			}
			r.failed = append(r.failed, e.Package)
		}
		switch e.Action {
		case "skip":
			fmt.Fprintf(r.out, "?    %s\t[no test files]\n", e.Package)
		case "pass":
			fmt.Fprintf(r.out, "ok   %s\t%.1fs\n", e.Package, e.Elapsed)
		default:
			fmt.Fprintf(r.out, "FAIL %s\t%.1fs\n", e.Package, e.Elapsed)
		}
	case e.Action == "run":
		r.running[key] = time.Now()
	case e.Action == "output":
		k := r.output[key]
		if k == nil {
			k = &kept{}
			r.output[key] = k
		}
		k.add(e.Output)
	case e.Action == "pass" || e.Action == "fail" || e.Action == "skip":
		if e.Action == "fail" {
			// A failing test's output is what its reader needs.
			fmt.Fprintf(r.out, "--- FAIL: %s (%s)\n%s", e.Test, e.Package, strings.Join(r.output[key].all(), ""))
			r.failed = append(r.failed, e.Package+" "+e.Test)
		}
		if e.Action == "skip" {
			r.skips = append(r.skips, skip{e.Package, e.Test, skipReason(r.output[key].all())})
		}
		delete(r.running, key)
		delete(r.said, key)
		delete(r.output, key)
	}
}

// skipClass is why a test was skipped, as its reason reads.
type skipClass int

const (
	missingTool skipClass = iota // a program or build output to install
	thisMachine                  // a kernel feature, root, a GPU
	byDesign                     // -short, -race, a mode the test does not apply to
	numClasses
)

var classTitles = [numClasses]string{
	missingTool: "for a missing tool (install it and rerun: make install-helm install-nginx install-chromium, bash scripts/install-grpcurl.sh, make install-nvcc):",
	thisMachine: "because this machine cannot run them (a kernel feature, root, a GPU):",
	byDesign:    "by design (-short, -race, or a mode the test does not apply to):",
}

// toolRE and machineRE read a skip's reason. A test that skips for a
// missing program says "X not found" (or "not on PATH"); those that need
// something of the machine name it.
var (
	toolRE    = regexp.MustCompile(`(?i)\bnot found\b|not on PATH|\bis not available\b|cannot install|\bno (g\+\+|go|nvcc|python3|make|helm|nginx|grpcurl|minio)([\s:,.]|$)|\(run make |: run make |is not built`)
	machineRE = regexp.MustCompile(`(?i)landlock|needs root|\bas root\b|GPU|CUDA driver|cannot mount|descriptor limit|cannot read a worker|cannot inspect|ld\.so\.cache|/proc/`)
)

func classify(why string) skipClass {
	switch {
	case toolRE.MatchString(why):
		return missingTool
	case machineRE.MatchString(why):
		return thisMachine
	}
	return byDesign
}

// skipReason is the message t.Skip logged: the indented lines after the
// test's "=== RUN", before its "--- SKIP".
func skipReason(lines []string) string {
	var msg []string
	for _, l := range lines {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- SKIP") || strings.HasPrefix(t, "***") && strings.HasSuffix(t, "***") && len(t) < 4 {
			continue
		}
		msg = append(msg, strings.Trim(t, "* "))
	}
	if len(msg) == 0 {
		return "(no reason given)"
	}
	return strings.Join(msg, " ")
}

// announce prints, every few seconds, the tests running longer than
// slowAfter that were not announced within slowAfter.
func (r *report) announce(done <-chan struct{}) {
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
		}
		now := time.Now()
		r.mu.Lock()
		var keys []string
		for k, t := range r.running {
			if now.Sub(t) >= slowAfter && now.Sub(r.said[k]) >= slowAfter {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			if strings.Contains(strings.SplitN(k, " ", 2)[1], "/") {
				continue // a subtest: its parent is announced
			}
			fmt.Fprintf(r.out, "      ... %s running for %s\n", k, now.Sub(r.running[k]).Round(time.Second))
			r.said[k] = now
		}
		r.mu.Unlock()
	}
}

func (r *report) summary(ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.skips) > 0 {
		// Subtests skipped together (a mode that cannot run them) make one
		// line, so that a missing tool's skip is not lost among them.
		fmt.Fprintf(r.out, "\n%d tests skipped:\n", len(r.skips))
		groups := map[string][]skip{}
		var order []string
		for _, s := range r.skips {
			k := s.pkg + " " + strings.SplitN(s.test, "/", 2)[0]
			if groups[k] == nil {
				order = append(order, k)
			}
			groups[k] = append(groups[k], s)
		}
		// Then by cause: what the reader can install comes first, apart
		// from what this machine cannot do and from skips by design.
		lines := map[skipClass][]string{}
		for _, k := range order {
			g := groups[k]
			if len(g) > 2 {
				lines[classify(g[0].why)] = append(lines[classify(g[0].why)], fmt.Sprintf("    %s: %d subtests, the first: %s\n", k, len(g), g[0].why))
				continue
			}
			for _, s := range g {
				lines[classify(s.why)] = append(lines[classify(s.why)], fmt.Sprintf("    %s %s: %s\n", s.pkg, s.test, s.why))
			}
		}
		for c := range skipClass(numClasses) {
			if len(lines[c]) > 0 {
				fmt.Fprintf(r.out, "  %s\n%s", classTitles[c], strings.Join(lines[c], ""))
			}
		}
	}
	switch {
	case len(r.failed) > 0:
		fmt.Fprintf(r.out, "\nFAILED: %s\n", strings.Join(r.failed, ", "))
	case !ok:
		fmt.Fprintf(r.out, "\nFAILED: go test's output was not all test events (see the lines above)\n")
	default:
		fmt.Fprintf(r.out, "\n%d packages, all passed\n", r.pkgs)
	}
}
