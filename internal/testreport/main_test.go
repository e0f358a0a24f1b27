package main

import (
	"bytes"
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
		"4 tests skipped:\n  p/a TestSkip: x_test.go:9: SKIPPING: helm not found\n  p/a TestMode: 3 subtests, the first: (no reason given)\n",
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
