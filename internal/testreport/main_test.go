package main

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// A go test -json stream: each package's line as it ends, a failing test's
// output, and the skips with their reasons at the end.
func TestReport(t *testing.T) {
	stream := strings.Join([]string{
		`{"Action":"run","Package":"p/a","Test":"TestSkip"}`,
		`{"Action":"output","Package":"p/a","Test":"TestSkip","Output":"=== RUN   TestSkip\n"}`,
		`{"Action":"output","Package":"p/a","Test":"TestSkip","Output":"    x_test.go:9: \n"}`,
		`{"Action":"output","Package":"p/a","Test":"TestSkip","Output":"    \n"}`,
		`{"Action":"output","Package":"p/a","Test":"TestSkip","Output":"    *** SKIPPING: helm not found ***\n"}`,
		`{"Action":"output","Package":"p/a","Test":"TestSkip","Output":"--- SKIP: TestSkip (0.00s)\n"}`,
		`{"Action":"skip","Package":"p/a","Test":"TestSkip"}`,
		`{"Action":"skip","Package":"p/a","Test":"TestMode/x"}`,
		`{"Action":"skip","Package":"p/a","Test":"TestMode/y"}`,
		`{"Action":"skip","Package":"p/a","Test":"TestMode/z"}`,
		`{"Action":"pass","Package":"p/a","Elapsed":1.5}`,
		`{"Action":"run","Package":"p/b","Test":"TestBad"}`,
		`{"Action":"output","Package":"p/b","Test":"TestBad","Output":"    b_test.go:3: boom\n"}`,
		`{"Action":"fail","Package":"p/b","Test":"TestBad"}`,
		`{"Action":"run","Package":"p/b","Test":"TestHung"}`,
		`{"Action":"output","Package":"p/b","Test":"TestHung","Output":"panic: test timed out after 30m0s\n"}`,
		`{"Action":"fail","Package":"p/b","Elapsed":0.2}`,
	}, "\n") + "\n"
	var out bytes.Buffer
	r := newReport(&out)
	if !r.read(strings.NewReader(stream)) {
		t.Fatal("a well-formed stream read as broken")
	}
	r.summary(true)
	got := out.String()
	for _, want := range []string{
		"ok   p/a\t1.5s\n",
		"--- FAIL: TestBad (p/b)\n    b_test.go:3: boom\n",
		"--- did not end: p/b TestHung\npanic: test timed out after 30m0s\nFAIL p/b\t0.2s\n",
		"4 tests skipped:\n  for a missing tool (install it and rerun: make install-helm install-nginx install-chromium, bash scripts/install-grpcurl.sh, make install-nvcc):\n" +
			"    p/a TestSkip: x_test.go:9: SKIPPING: helm not found\n" +
			"  by design (-short, -race, or a mode the test does not apply to):\n    p/a TestMode: 3 subtests, the first: (no reason given)\n",
		"FAILED: p/b TestBad, p/b\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
	if len(r.failed) != 2 {
		t.Errorf("failed %v, want the test and its package", r.failed)
	}
	// A line that is no event (the go command's own error) is shown and
	// makes the run a failure; so does an empty stream.
	out.Reset()
	if newReport(&out).read(strings.NewReader("go: cannot find main module\n")) || !strings.Contains(out.String(), "cannot find main module") {
		t.Errorf("a non-event line: read as fine, or not shown: %q", out.String())
	}
	if newReport(&out).read(strings.NewReader("")) {
		t.Error("an empty stream read as fine")
	}
}

// Skips are told apart by cause, as their reasons read: the reasons are
// those of this repository's tests.
func TestClassify(t *testing.T) {
	for _, tt := range []struct {
		why  string
		want skipClass
	}{
		{"*** SKIPPING TestFunctionAffinity: nginx not found (bash scripts/install-nginx.sh installs Debian's; PLOVER_REQUIRE_NGINX=1 makes this a failure) ***", missingTool},
		{"grpcurl not found ($GRPCURL, the cache of scripts/install-grpcurl.sh, PATH): run `bash scripts/install-grpcurl.sh` (minutes, once)", missingTool},
		{"*** SKIPPING TestConsole: chromium not found (bash scripts/install-chromium.sh installs Debian's; PLOVER_REQUIRE_CHROMIUM=1 makes this a failure) ***", missingTool},
		{"chart_test.go:70: helm not found: make install-helm", missingTool},
		{"*** SKIPPING S3 TESTS: cannot install MinIO RELEASE.2024: exit status 1 ***", missingTool},
		{"nvcc not on PATH: the CUDA build is not checked (make install-nvcc installs Debian's CUDA 11.8)", missingTool},
		{"python3 -m venv is not available here (Debian: python3-venv): exit status 1", missingTool},
		{"no g++ for the host build", missingTool},
		{"no build/samples/vecadd-host: run make samples", missingTool},
		{"kernel has no Landlock (or it is disabled at boot)", thisMachine},
		{"needs root: switching to another uid is only possible as root", thisMachine},
		{"a CUDA driver and GPU are present", thisMachine},
		{"open /proc/sys/kernel/pid_max: permission denied", thisMachine},
		{"builds binaries and starts a server", byDesign},
		{"under -race sync.Pool drops items on purpose: allocation counts do not hold", byDesign},
		{"--isolation none cannot contain this: a wild write lands in the server", byDesign},
		{"file store only", byDesign},
		{"(no reason given)", byDesign},
	} {
		if got := classify(tt.why); got != tt.want {
			t.Errorf("classify(%q) = %q, want %q", tt.why, classTitles[got], classTitles[tt.want])
		}
	}
}

// A failing test that prints a long log after its assertion (a server's
// log, dumped on failure) is shown with the assertion, the log's start and
// end, and how many lines were left out between: issue 42, item 4, where
// the last 200 lines alone were ~190 of a server's 504s and no assertion.
func TestLongOutputKeepsTheAssertion(t *testing.T) {
	const logLines = 1000
	ev := func(out string) string {
		return `{"Action":"output","Package":"p/c","Test":"TestLoad","Output":` + strconv.Quote(out) + `}`
	}
	lines := []string{`{"Action":"run","Package":"p/c","Test":"TestLoad"}`, ev("=== RUN   TestLoad\n"),
		ev("    serving_test.go:160: after the load: want a 200, got 504 504 504\n"), ev("    e2e_test.go:89: server log:\n")}
	for i := range logLines {
		lines = append(lines, ev(fmt.Sprintf("        time=t level=WARN msg=\"request failed\" status=504 n=%d\n", i)))
	}
	lines = append(lines, ev("--- FAIL: TestLoad (9.00s)\n"), `{"Action":"fail","Package":"p/c","Test":"TestLoad"}`,
		`{"Action":"fail","Package":"p/c","Elapsed":9}`)
	var out bytes.Buffer
	r := newReport(&out)
	if !r.read(strings.NewReader(strings.Join(lines, "\n") + "\n")) {
		t.Fatal("a well-formed stream read as broken")
	}
	got := out.String()
	// The head keeps the run line, both messages and the log's first 47
	// lines; the tail its last 149 and the FAIL line; the rest is counted.
	left := logLines - (headLines - 3) - (tailLines - 1)
	for _, want := range []string{
		"--- FAIL: TestLoad (p/c)\n=== RUN   TestLoad\n    serving_test.go:160: after the load: want a 200, got 504 504 504\n    e2e_test.go:89: server log:\n",
		"status=504 n=0\n", fmt.Sprintf("status=504 n=%d\n        ... (testreport: %d lines left out here)\n        time=t", headLines-4, left),
		fmt.Sprintf("status=504 n=%d\n--- FAIL: TestLoad (9.00s)\n", logLines-1),
	} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
	if n := strings.Count(got, "status=504"); n != logLines-left {
		t.Errorf("%d log lines shown, want %d (%d left out)", n, logLines-left, left)
	}
}

// Between a long output's head and tail, the lines that begin a message
// of the test are kept (up to midMessages) and the rest counted.
func TestKeptMessagesBetweenHeadAndTail(t *testing.T) {
	k := &kept{}
	for i := range headLines + 10 + tailLines {
		if i == headLines+4 {
			k.add("    x_test.go:7: a message in the middle\n")
			continue
		}
		k.add(fmt.Sprintf("        log %d\n", i))
	}
	got := strings.Join(k.all(), "")
	want := fmt.Sprintf("        log %d\n        ... (testreport: 4 lines left out here)\n    x_test.go:7: a message in the middle\n        ... (testreport: 5 lines left out here)\n        log %d\n",
		headLines-1, headLines+10)
	if !strings.Contains(got, want) {
		t.Errorf("kept output lacks %q:\n%s", want, got)
	}
}
