package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeServeEnv makes this test binary, run as `plover serve ...`, a
// stand-in server that logs as plover serve does, a warning first, and
// answers every request 503: what the first MPS run on a GPU met.
const fakeServeEnv = "PLOVER_BENCH_SUITE_FAKE_SERVE"

func TestMain(m *testing.M) {
	if os.Getenv(fakeServeEnv) != "" {
		fakeServe()
		return
	}
	os.Exit(m.Run())
}

func fakeServe() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	enc := json.NewEncoder(os.Stderr)
	enc.Encode(map[string]string{"level": "WARN", "msg": "worker exited", "error": "stand-in: signal: killed"})
	enc.Encode(map[string]string{"level": "INFO", "msg": "plover serving", "addr": "http://" + ln.Addr().String()})
	http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/logs") {
			// The function's output: its worker's last words.
			w.Header().Set("Content-Type", "application/x-ndjson")
			for i := range 12 {
				fmt.Fprintf(w, `{"stream":"stderr","pid":42,"line":"stand-in line %d"}`+"\n", i)
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprint(w, `{"error":{"code":"unavailable","message":"stand-in: the worker exited"}}`)
	}))
}

// A mode whose server serves nothing stops as it warms up, with the
// failure, the server's log and the function's last 10 lines of output in
// its error (it ran every measurement before, each a count of failures),
// and --server-logs keeps that log.
func TestFairStopsWhereTheServerServesNothing(t *testing.T) {
	t.Setenv(fakeServeEnv, "1")
	logs := t.TempDir()
	serverLogs = logs
	t.Cleanup(func() { serverLogs = "" })
	o := &options{plover: os.Args[0], device: "cuda", isolation: "process", fairGRPC: "off"}
	_, err := fairOneMode(context.Background(), o, t.TempDir(), "fair", []byte("c"), []byte("v"), []byte("s"))
	if err == nil {
		t.Fatal("a mode whose every request failed ran on")
	}
	for _, want := range []string{"mode fair: every request to", "failed as the server warmed up", "status 503", "stand-in: signal: killed",
		"output ends:\nstderr pid 42: stand-in line 2\n", "stderr pid 42: stand-in line 11"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error lacks %q: %v", want, err)
		}
	}
	b, err := os.ReadFile(filepath.Join(logs, "server-001.log"))
	if err != nil {
		t.Fatal(err)
	}
	if s := string(b); !strings.HasPrefix(s, "# "+os.Args[0]+" serve --listen 127.0.0.1:0") || !strings.Contains(s, `"msg":"plover serving"`) {
		t.Errorf("the kept log:\n%s\nwant the command, then the server's lines", s)
	}
}

func TestCappedFile(t *testing.T) {
	for _, tc := range []struct {
		left   int64
		writes []string
		want   string
	}{
		{10, []string{"abc", "def"}, "abcdef"},
		{6, []string{"abc", "def"}, "abcdef"},
		{5, []string{"abc", "def", "ghi"}, "abcde\n# --server-logs: the rest left out past 4194304 bytes\n"},
		// Filled exactly, then a write: the note still comes.
		{3, []string{"abc", "def", "ghi"}, "abc\n# --server-logs: the rest left out past 4194304 bytes\n"},
	} {
		p := filepath.Join(t.TempDir(), "log")
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		c := &cappedFile{f: f, left: tc.left}
		for _, w := range tc.writes {
			if n, err := c.Write([]byte(w)); n != len(w) || err != nil {
				t.Errorf("left %d: Write(%q) = %d, %v; want all of it taken, no error", tc.left, w, n, err)
			}
		}
		c.Close()
		b, _ := os.ReadFile(p)
		if string(b) != tc.want {
			t.Errorf("left %d: the file holds %q, want %q", tc.left, b, tc.want)
		}
	}
}
