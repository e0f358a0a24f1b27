package cli

import (
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
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
		{[]string{"echo", "--size", "8", "--warmup", "-1"}, "--warmup -1"},
		// 0 was taken, and meant 30 s, where the message says positive.
		{[]string{"echo", "--size", "8", "--timeout", "0"}, "--timeout 0s: want a positive duration"},
		{[]string{"echo", "--size", "8", "--timeout", "-1s"}, "--timeout -1s: want a positive duration"},
		{[]string{"echo", "--size", "8", "--concurrency", "20000"}, "--concurrency 20000"},
		{[]string{"echo", "--size", "8", "--grpc", "http://127.0.0.1:8001"}, `--grpc "http://127.0.0.1:8001": want grpc://HOST:PORT`},
		{[]string{"echo", "--size", "8", "--grpc", "127.0.0.1:8001"}, `--grpc "127.0.0.1:8001"`},
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

// Ctrl-C during a run whose requests hang: the first stops the run (the
// requests in flight still have up to --timeout), and says so; a second
// one ends plover at once instead of being swallowed.
func TestBenchSecondInterruptQuits(t *testing.T) {
	if url := os.Getenv("PLOVER_TEST_BENCH_CHILD"); url != "" {
		os.Exit(Main([]string{"bench", "hang", "--server", url, "--size", "8", "--duration", "30s", "--timeout", "30s"},
			&Env{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr}))
	}
	hit := make(chan struct{}, 100)
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hit <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	cmd := exec.Command(os.Args[0], "-test.run=^TestBenchSecondInterruptQuits$", "-test.count=1")
	cmd.Env = append(os.Environ(), "PLOVER_TEST_BENCH_CHILD="+srv.URL)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case <-hit:
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		t.Fatal("no request came")
	}
	cmd.Process.Signal(os.Interrupt)
	time.Sleep(500 * time.Millisecond)
	cmd.Process.Signal(os.Interrupt)
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		cmd.Process.Kill()
		<-exited
		t.Fatalf("a second ^C did not end plover bench within 5s; stderr %q", stderr.String())
	}
	if !strings.Contains(stderr.String(), "interrupted") {
		t.Errorf("stderr does not say the first ^C was taken: %q", stderr.String())
	}
}

// --max-errors lets a script fail a run with errors in it (429s here,
// without a Retry-After, which bench would wait out: see
// TestBenchShedAnswersWaitedAndCounted): without it a run exits 0 unless
// no request succeeded. Every third request is refused.
func TestBenchMaxErrors(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1)%3 == 0 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			w.Write([]byte(`{"error":{"code":"rate_limited","message":"over its rate"}}`))
			return
		}
		w.Write([]byte("ok"))
	}))
	defer srv.Close()
	for _, tt := range []struct {
		flags []string
		code  int
		want  string // in stderr
	}{
		{nil, 0, ""},
		{[]string{"--max-errors", "3"}, 0, ""},
		{[]string{"--max-errors", "2"}, 1, "plover bench: 3 of 9 requests failed (the report lists their errors), more than --max-errors 2"},
		{[]string{"--max-errors", "0"}, 1, "3 of 9 requests failed"},
		{[]string{"--max-errors", "-2"}, 2, "--max-errors -2: want 0 or more (or -1: no bound)"},
	} {
		n.Store(0)
		args := append([]string{"bench", "f", "--server", srv.URL, "--size", "8", "--requests", "9", "--concurrency", "1"}, tt.flags...)
		out, errs, code := runMain(t, nil, args...)
		if code != tt.code || !strings.Contains(errs, tt.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q\n%s", tt.flags, code, errs, tt.code, tt.want, out)
		}
		if tt.code != 2 && !strings.Contains(out, "error       429 × 3") {
			t.Errorf("%v: the report lacks the three 429s:\n%s", tt.flags, out)
		}
	}
}

// A server shedding load (503 with Retry-After: 1, to the first request
// here) is waited out before the next request, seen by when the server
// got it, and the report counts the answer as shed. Shed answers count
// towards --max-errors: a request shed is one not served, and a CI gate
// of --max-errors 0 should not pass a server that refused its load.
func TestBenchShedAnswersWaitedAndCounted(t *testing.T) {
	var mu sync.Mutex
	var at []time.Time
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		at = append(at, time.Now())
		first := len(at) == 1
		mu.Unlock()
		if first {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"error":{"code":"unavailable","message":"shedding load"}}`))
			return
		}
		w.Write([]byte("ok"))
	}))
	defer srv.Close()
	for _, tt := range []struct {
		flags []string
		code  int
		err   string   // in stderr
		out   []string // in stdout
	}{
		{nil, 0, "", []string{"3 in ", "2 ok, 1 failed (1 of them shed)", "error       503 × 1: unavailable: shedding load",
			"shed        1 answered 429/503 with Retry-After; waited "}},
		{[]string{"--max-errors", "1"}, 0, "", []string{"(1 of them shed)"}},
		{[]string{"--max-errors", "0"}, 1,
			"plover bench: 1 of 3 requests failed (1 of them shed with Retry-After; the report lists their errors), more than --max-errors 0",
			[]string{"(1 of them shed)"}},
		{[]string{"--json"}, 0, "", []string{`"shed": 1,`, `"retry_after_wait_s": `}},
	} {
		mu.Lock()
		at = nil
		mu.Unlock()
		args := append([]string{"bench", "f", "--server", srv.URL, "--size", "8", "--requests", "3", "--concurrency", "1"}, tt.flags...)
		out, errs, code := runMain(t, nil, args...)
		if code != tt.code || !strings.Contains(errs, tt.err) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q\n%s", tt.flags, code, errs, tt.code, tt.err, out)
		}
		for _, want := range tt.out {
			if !strings.Contains(out, want) {
				t.Errorf("%v: the report lacks %q:\n%s", tt.flags, want, out)
			}
		}
		mu.Lock()
		got := append([]time.Time(nil), at...)
		mu.Unlock()
		if len(got) != 3 {
			t.Fatalf("%v: the server got %d requests, want 3", tt.flags, len(got))
		}
		if gap := got[1].Sub(got[0]); gap < 900*time.Millisecond {
			t.Errorf("%v: the request after the 503 came %v after it, want the Retry-After's 1 s waited", tt.flags, gap)
		}
	}
}
