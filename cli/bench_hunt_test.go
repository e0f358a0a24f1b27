package cli

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

// A bench command line that cannot run is a usage error (exit 2, as the
// README says of every command), naming the flag and why; nothing is sent.
func TestBenchCommandLineMistakesExit2(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	defer srv.Close()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"echo"}, "--in FILE or --size BYTES"},
		{[]string{"echo", "--size", "-5"}, "--size -5"},
		{[]string{"echo", "--size", "8", "--in", "x"}, "one of them"},
		{[]string{"echo", "--size", "8", "--duration", "0"}, "--duration"},
		{[]string{"echo", "--size", "8", "--requests", "0"}, "--requests"},
		{[]string{"echo", "--size", "8", "--requests", "-1"}, "--requests"},
		{[]string{"echo", "--size", "8", "--concurrency", "-1"}, "--concurrency -1"},
		{[]string{"echo", "--size", "8", "--concurrency", "20000"}, "--concurrency 20000"},
	} {
		_, stderr, code := runMain(t, nil, append([]string{"bench", "--server", srv.URL}, tt.args...)...)
		if code != 2 || !strings.Contains(stderr, tt.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 and %q", tt.args, code, stderr, tt.want)
		}
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("%d requests sent for command lines that cannot run", n)
	}
}

// --chart to a path that cannot be written fails before the load runs, not
// after a whole run whose result it then does not draw.
func TestBenchChartUnwritableFailsFirst(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1); w.Write([]byte("ok")) }))
	defer srv.Close()
	dir := t.TempDir()
	for _, chart := range []string{filepath.Join(dir, "no", "such", "dir", "c.svg"), dir} {
		_, stderr, code := runMain(t, nil, "bench", "echo", "--server", srv.URL, "--size", "8", "--requests", "20", "--chart", chart)
		if code == 0 || !strings.Contains(stderr, "--chart") {
			t.Errorf("--chart %s: exit %d, stderr %q", chart, code, stderr)
		}
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("%d requests sent before --chart was found unwritable", n)
	}
	// A writable one is written; no chart when nothing succeeded leaves
	// no file behind.
	ok := filepath.Join(dir, "ok.svg")
	if _, stderr, code := runMain(t, nil, "bench", "echo", "--server", srv.URL, "--size", "8", "--requests", "20", "--chart", ok); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if b, err := os.ReadFile(ok); err != nil || !strings.Contains(string(b), "<svg") {
		t.Fatalf("chart: %v %.100q", err, b)
	}
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(500) }))
	defer bad.Close()
	none := filepath.Join(dir, "none.svg")
	if _, _, code := runMain(t, nil, "bench", "echo", "--server", bad.URL, "--size", "8", "--requests", "5", "--chart", none); code != 1 {
		t.Fatalf("exit %d", code)
	}
	if _, err := os.Stat(none); !os.IsNotExist(err) {
		t.Fatalf("a chart file left behind with nothing to draw: %v", err)
	}
}
