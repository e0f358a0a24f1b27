package cli

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/internal/testkit"
)

// What others wrote reaches a terminal with the characters it would obey
// or hide escaped: controls, bidi and other format characters, line
// separators and bytes that are not UTF-8; text and tabs pass, and
// newlines where the text has lines.
func TestVisible(t *testing.T) {
	for _, tc := range []struct{ in, line, lines string }{
		{"plain\ttabbed é 日本 😀 \ufffd", "", ""}, // unchanged
		{"\x1b[2Jwiped\rover", `\x1b[2Jwiped\x0dover`, ""},
		{"bell\x07 and \u0085", `bell\x07 and \x85`, ""},
		{"two\nlines", `two\x0alines`, "two\nlines"},
		{"rate: 10\u202e%09 cost", `rate: 10\u202e%09 cost`, ""},
		{"\u2066isolated\u2069 \u2067\u2068", `\u2066isolated\u2069 \u2067\u2068`, ""},
		{"\u200eleft\u200fright", `\u200eleft\u200fright`, ""},
		{"zero\u200bwidth\ufeff\u202a\u202b\u202c\u202d", `zero\u200bwidth\ufeff\u202a\u202b\u202c\u202d`, ""},
		{"para\u2028graph\u2029", `para\u2028graph\u2029`, ""},
		{"tag\U000e0041", `tag\U000e0041`, ""},
		{"bad \xff\x9b utf-8 \xe2\x80", `bad \xff\x9b utf-8 \xe2\x80`, ""},
	} {
		if tc.line == "" {
			tc.line = tc.in
		}
		if tc.lines == "" {
			tc.lines = tc.line
		}
		if got := visible(tc.in); got != tc.line {
			t.Errorf("visible(%q) = %q, want %q", tc.in, got, tc.line)
		}
		if got := visibleLines(tc.in); got != tc.lines {
			t.Errorf("visibleLines(%q) = %q, want %q", tc.in, got, tc.lines)
		}
		// As JSON, the same value, and nothing a terminal would obey.
		enc, _ := json.Marshal(map[string]string{"line": tc.in})
		got := visibleJSON(enc)
		var back, want map[string]string
		json.Unmarshal(enc, &want)
		if err := json.Unmarshal(got, &back); err != nil || back["line"] != want["line"] {
			t.Errorf("visibleJSON(%s) = %s: decodes to %q (%v)", enc, got, back["line"], err)
		}
		if !utf8.Valid(got) || strings.ContainsFunc(string(got), hidden) {
			t.Errorf("visibleJSON(%s) = %q: still has what a terminal obeys", enc, got)
		}
	}
	// A byte that is not UTF-8 in a JSON line, as a server should not send.
	if got := visibleJSON([]byte(`{"line":"a` + "\xff\u202e" + `"}`)); string(got) != `{"line":"a\ufffd\u202e"}` {
		t.Errorf("visibleJSON of a line with a bad byte: %s", got)
	}
}

// plover logs prints a line's controls and bidi characters escaped, in
// both forms: a line for a person, and --json.
func TestPrintLogsEscapes(t *testing.T) {
	// As the server encodes it (encoding/json): the bidi characters raw.
	ndjson, _ := json.Marshal(api.LogLine{Stream: "stdout", PID: 7, Line: "total: 10\u202e%09 \x1b[2J\u2066x\u2069\u200f"})
	if !bytes.Contains(ndjson, []byte("\u202e")) {
		t.Fatalf("the test's line is not as a server sends it: %s", ndjson)
	}
	for _, tc := range []struct {
		asJSON bool
		want   string
	}{
		{false, ` | total: 10\u202e%09 \x1b[2J\u2066x\u2069\u200f` + "\n"},
		{true, `"line":"total: 10\u202e%09 \u001b[2J\u2066x\u2069\u200f"}` + "\n"},
	} {
		var out bytes.Buffer
		if err := printLogs(bytes.NewReader(append(ndjson, "\n\n"...)), &out, tc.asJSON); err != nil {
			t.Fatal(err)
		}
		if !strings.HasSuffix(out.String(), tc.want) || strings.ContainsFunc(out.String(), func(r rune) bool { return r != '\n' && hidden(r) }) {
			t.Errorf("json %v: %q, want it to end %q", tc.asJSON, out.String(), tc.want)
		}
	}
}

// An error plover prints may quote a server's message, which may quote a
// bundle: escaped as a function's output is, its lines kept.
func TestErrorEscaped(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadGateway)
		w.Write([]byte(`{"error":{"code":"function_error","message":"the chain failed: \u001b]0;owned\u0007 10\u202e%09\nsecond line"}}`))
	}))
	defer srv.Close()
	_, errs, code := runMain(t, nil, "logs", "f", "--server", srv.URL)
	want := `plover logs: server said 502 function_error: the chain failed: \x1b]0;owned\x07 10\u202e%09` + "\nsecond line\n"
	if code != 1 || errs != want {
		t.Errorf("exit %d, stderr %q; want %q", code, errs, want)
	}
}

// plover run's writer for a worker's lines escapes each, its newline kept.
func TestEscapingWriter(t *testing.T) {
	var b bytes.Buffer
	w := escapingWriter{&b}
	line := "stdout | say: \u202eevil\x1b[2J\n"
	if n, err := w.Write([]byte(line)); n != len(line) || err != nil {
		t.Fatalf("Write: %d, %v", n, err)
	}
	if want := `stdout | say: \u202eevil\x1b[2J` + "\n"; b.String() != want {
		t.Errorf("%q, want %q", b.String(), want)
	}
}

// plover run's warning quotes the bundle (its manifest's path, its chain's
// entries): escaped, in both forms. A directory named with an escape
// sequence cleared the terminal that ran it.
func TestRunWarningEscaped(t *testing.T) {
	m := testkit.Manifest("fn")
	m.Chain = []abi.Launch{{Kernel: "count", Grid: 1, Block: 1}} // a counter kept in tmp: the warning
	built := testkit.BundleDir(t, m, nil)
	dir := filepath.Join(t.TempDir(), "fn\x1b[2J\u202e")
	if err := os.Rename(built, dir); err != nil {
		t.Fatal(err)
	}
	in := filepath.Join(t.TempDir(), "in.bin")
	os.WriteFile(in, []byte("input"), 0o644)
	for _, args := range [][]string{{"--out", filepath.Join(t.TempDir(), "out.bin")}, {"--json"}} {
		_, errs, err := runCommand(runCmd(), append([]string{dir, "--in", in}, args...)...)
		want := `warning: the same input, run again on the same instance, gave another output: the chain [count] reads what an earlier run left in tmp, and ` +
			filepath.Join(filepath.Dir(dir), `fn\x1b[2J\u202e`, "plover.json")
		if err != nil || !strings.Contains(errs, want) || strings.ContainsFunc(errs, func(r rune) bool { return r != '\n' && hidden(r) }) {
			t.Errorf("run %v: %v, stderr %q; want %q in it, escaped", args, err, errs, want)
		}
	}
}
