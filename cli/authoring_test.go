package cli

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/plover-run/plover/api"
)

// A mistyped command or flag gets the one meant, when one is within a
// typo of it, and nothing made up when none is (issue 37, item 12).
func TestDidYouMeanCommandsAndFlags(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string // in stderr
		not  string // not in stderr
	}{
		{[]string{"lss"}, `plover: unknown command "lss" (did you mean "ls"?)`, ""},
		{[]string{"sevre"}, `plover: unknown command "sevre" (did you mean "serve"?)`, ""},
		{[]string{"biuld", "."}, `plover: unknown command "biuld" (did you mean "build"?)`, ""},
		{[]string{"dep"}, `plover: unknown command "dep" (did you mean "deploy"?)`, ""},
		{[]string{"frobnicate"}, `plover: unknown command "frobnicate"` + "\n", "did you mean"},
		{[]string{"invoke", "f", "--tming"}, "plover invoke: unknown flag: --tming (did you mean --timing?)", ""},
		{[]string{"ls", "--jsn"}, "plover ls: unknown flag: --jsn (did you mean --json?)", ""},
		{[]string{"bench", "f", "--chrat", "x.svg"}, "plover bench: unknown flag: --chrat (did you mean --chart?)", ""},
		{[]string{"run", ".", "--in", "x", "--repaet", "3"}, "plover run: unknown flag: --repaet (did you mean --repeat?)", ""},
		{[]string{"ls", "--zzzz"}, "plover ls: unknown flag: --zzzz\n", "did you mean"},
		{[]string{"invoke", "f", "--timeout", "2"}, `plover invoke: invalid argument "2" for "--timeout" flag: parse error (a duration takes a unit: 500ms, 2s, 1m)`, ""},
		{[]string{"bench", "f", "--concurrency", "x"}, `for "--concurrency" flag: parse error` + "\n", "a duration"},
	} {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			_, errs, code := runMain(t, nil, tt.args...)
			if code != 2 || !strings.Contains(errs, tt.want) || tt.not != "" && strings.Contains(errs, tt.not) {
				t.Fatalf("exit %d, stderr %q; want exit 2 with %q", code, errs, tt.want)
			}
		})
	}
}

// A function the server does not have: the CLI prints the server's 404 as
// it is, its did-you-mean included once, and adds none of its own (the
// server suggests only what the caller's token may see; the CLI's listing
// would not know).
func TestDidYouMeanFunction(t *testing.T) {
	var listed atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/functions" {
			listed.Store(true)
			w.Write([]byte(`{"functions":[{"name":"saxpy"},{"name":"cnn"}]}`))
			return
		}
		name := strings.Split(r.URL.Path, "/")[3]
		msg := fmt.Sprintf(`function \"%s\" not found`, name)
		if name == "saxpi" {
			msg += ` (did you mean \"saxpy\"?)`
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(404)
		fmt.Fprintf(w, `{"error":{"code":"not_found","message":"%s"}}`, msg)
	}))
	defer srv.Close()
	in := filepath.Join(t.TempDir(), "in")
	os.WriteFile(in, []byte("x"), 0o644)
	for _, tt := range []struct{ name, want string }{
		{"saxpi", `function "saxpi" not found (did you mean "saxpy"?)` + "\n"},
		{"saxpu", `function "saxpu" not found` + "\n"}, // the server saw none to offer
	} {
		_, errs, code := runMain(t, nil, "invoke", tt.name, "--server", srv.URL, "--in", in, "--out", filepath.Join(t.TempDir(), "out"))
		if code == 0 || !strings.HasSuffix(errs, tt.want) || strings.Count(errs, "did you mean") > 1 {
			t.Fatalf("invoke %s: exit %d, stderr %q; want it to end %q", tt.name, code, errs, tt.want)
		}
	}
	if listed.Load() {
		t.Error("the CLI listed the server's functions to suggest one itself")
	}
}

// plover invoke --timeout: the deadline goes to the server as
// X-Plover-Timeout-Ms, a 504 is said in plain words, and a server that
// never answers is given up on shortly after the timeout (issue 37, item 8).
func TestInvokeTimeout(t *testing.T) {
	defer func(g time.Duration) { invokeGrace = g }(invokeGrace)
	invokeGrace = 200 * time.Millisecond
	for _, tt := range []struct {
		name       string
		args       []string
		reply      func(w http.ResponseWriter, r *http.Request) // nil: never answers
		code       int
		wantHeader string // X-Plover-Timeout-Ms the server saw
		want       string // in stderr
		within     time.Duration
	}{
		{"answered", []string{"--timeout", "250ms"}, func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) },
			0, "250", "", 5 * time.Second},
		{"rounded up to whole milliseconds", []string{"--timeout", "1500us"}, func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) },
			0, "2", "", 5 * time.Second},
		{"no flag: the server's deadline", nil, func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) },
			0, "", "", 5 * time.Second},
		{"the server stops it", []string{"--timeout", "300ms"}, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusGatewayTimeout)
			w.Write([]byte(`{"error":{"code":"timeout","message":"the request's deadline passed while its chain was running"}}`))
		}, 1, "300", "plover invoke: f did not finish within --timeout 300ms (or the server's --max-timeout, if shorter): the server stopped waiting (504 timeout: the request's deadline passed while its chain was running); raise --timeout", 5 * time.Second},
		{"the server never answers", []string{"--timeout", "300ms"}, nil,
			1, "300", "plover invoke: f: no answer within --timeout 300ms (and 200ms more for the server's own answer): gave up waiting", 3 * time.Second},
		{"negative", []string{"--timeout", "-1s"}, nil, 2, "", "plover invoke: --timeout -1s: want a duration of 1ms or more", time.Second},
		// It said "no answer within --timeout" of an answer cut midway.
		{"the answer is cut", []string{"--timeout", "300ms"}, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "100")
			w.Write([]byte("SECRET-PART"))
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}, 1, "300", "plover invoke: f: the answer was cut at --timeout 300ms (and 200ms more for the server's own answer): 11 bytes of it had come (--out ", 3 * time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			seen := make(chan string, 1)
			release := make(chan struct{})
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				seen <- r.Header.Get("X-Plover-Timeout-Ms")
				if tt.reply == nil {
					<-release
					return
				}
				tt.reply(w, r)
			}))
			defer srv.Close()
			defer close(release)
			in := filepath.Join(t.TempDir(), "in")
			os.WriteFile(in, []byte("x"), 0o644)
			args := append([]string{"invoke", "f", "--server", srv.URL, "--in", in, "--out", filepath.Join(t.TempDir(), "out")}, tt.args...)
			start := time.Now()
			_, errs, code := runMain(t, nil, args...)
			if el := time.Since(start); el > tt.within {
				t.Errorf("took %v, want under %v", el, tt.within)
			}
			if code != tt.code || !strings.Contains(errs, tt.want) {
				t.Fatalf("exit %d, stderr %q; want exit %d with %q", code, errs, tt.code, tt.want)
			}
			if tt.code == 2 {
				return
			}
			if h := <-seen; h != tt.wantHeader {
				t.Errorf("X-Plover-Timeout-Ms %q, want %q", h, tt.wantHeader)
			}
		})
	}
}

// plover ls fits 100 columns by default and rounds its durations; -o wide
// has every column, -o json the server's JSON (issue 37, item 12). Client
// errors (4xx) show apart from the others (5xx), and a function none of
// whose requests succeeded has no mean ("-", not 0: issue 42, item 6).
func TestLsViews(t *testing.T) {
	created := time.Now().Add(-3 * time.Hour)
	fns := []api.FunctionInfo{
		{Name: "a-function-of-24-chars-x", Version: "3f1c9a2e-0000-4000-8000-000000000000", Kind: "function", Target: "host", Loaded: true,
			Busy: 12, Idle: 100, Queue: 1024, Requests: 123456789, ClientErrors: 67890, Errors: 12345, MeanUs: 69435812, Share: 2.5, Priority: "latency",
			DeviceSeconds: 69.4358, DeviceFraction: 0.5, Memory: 3 << 30, Cold: 1, Warm: 2, Hot: 3, Created: created,
			Workers: []api.WorkerInfo{{PID: 4242, RSSBytes: 40 << 20, PSSBytes: 20 << 20, Threads: 9}}},
		{Name: "pipe", Version: "9a9a9a9a-1", Kind: "pipeline", Steps: nil, Created: created, Requests: 1, MeanUs: 1234},
		{Name: "all-failed", Version: "7b7b7b7b-1", Kind: "function", Target: "host", Created: created, Requests: 5, ClientErrors: 3, Errors: 2},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(map[string]any{"functions": fns})
	}))
	defer srv.Close()
	long := regexp.MustCompile(`\d\.\d{4,}|\d+\.\d+m?s\b.*\d\.\d{4}`) // 1m9.4358s, 69.435812s
	for _, tt := range []struct {
		name     string
		args     []string
		code     int
		want     []string
		not      []string
		maxWidth int // 0: no bound
	}{
		{"default", nil, 0, []string{"NAME", "BUSY/IDLE", "a-function-of-24-chars-x", "3f1c9a2e", "12/100", "1m9s", "pipeline", "1.23ms",
			"REQUESTS   4XX/5XX      MEAN    AGE", "123456789  67890/12345  1m9s    3h\n", "5          3/2          -       3h\n"},
			[]string{"WORKER", "4242", "SHARE", "0s"}, 100},
		{"wide", []string{"-o", "wide"}, 0, []string{"WORKER (PID PSS/RSS THREADS)", "4242 20.0 MiB/40.0 MiB 9", "2.5 latency", "1m9s 50%", "1/2/3",
			"123456789  67890/12345  1m9s", "5          3/2          -"}, []string{" 0s "}, 0},
		{"json", []string{"-o", "json"}, 0, []string{`"device_seconds": 69.4358`}, nil, 0},
		{"bad view", []string{"-o", "tall"}, 2, []string{`-o "tall": want wide or json`}, nil, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out, errs, code := runMain(t, nil, append([]string{"ls", "--server", srv.URL}, tt.args...)...)
			if code != tt.code {
				t.Fatalf("exit %d, want %d: %s%s", code, tt.code, out, errs)
			}
			for _, w := range tt.want {
				if !strings.Contains(out+errs, w) {
					t.Errorf("lacks %q:\n%s%s", w, out, errs)
				}
			}
			for _, n := range tt.not {
				if strings.Contains(out, n) {
					t.Errorf("has %q:\n%s", n, out)
				}
			}
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				if tt.maxWidth > 0 && utf8.RuneCountInString(line) > tt.maxWidth {
					t.Errorf("%d columns, want at most %d: %q", utf8.RuneCountInString(line), tt.maxWidth, line)
				}
				if tt.name != "json" && long.MatchString(line) {
					t.Errorf("an unrounded duration: %q", line)
				}
			}
		})
	}
}

func TestRoundDuration(t *testing.T) {
	for _, tt := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0"},
		{850 * time.Nanosecond, "850ns"},
		{1234567 * time.Nanosecond, "1.23ms"},
		{69435812 * time.Microsecond, "1m9s"},
		{4358 * time.Millisecond, "4.36s"},
		{45678 * time.Millisecond, "45.7s"},
		{2*time.Hour + 5*time.Minute + 31*time.Second, "2h6m"},
		{3 * time.Hour, "3h0m"},
	} {
		if got := roundDuration(tt.d); got != tt.want {
			t.Errorf("roundDuration(%v) = %q, want %q", tt.d, got, tt.want)
		}
	}
}

// plover build compiles with -Wall -Wextra and shows the warnings, counted,
// on a build that succeeds: an unsigned counter tested >= 0 is one
// (issue 37, item 7).
func TestBuildShowsWarnings(t *testing.T) {
	if _, err := exec.LookPath("g++"); err != nil {
		t.Skip("g++ not found")
	}
	const body = "  if (i < n) y[i] = ab[0] * x[i] + ab[1];\n"
	const loop = `
  for (unsigned s = blockDim.x / 2; s >= 0; s >>= 1) {
    if (threadIdx.x < s && i < n) y[i] += 1;
  }
`
	// A warning in a macro is the same line at each expansion: g++ says
	// it once for each, and each counts.
	const macro = `
#define HELPER(n) int helper_##n(int x) { int unused; return x; }
HELPER(a)
HELPER(b)
`
	// Entries that ignore grid and block (PLOVER_ENTRY marks them unused).
	const entries = `
PLOVER_ENTRY(ignores_both) { s->out.len = 0; }
PLOVER_ENTRY(ignores_block) { s->out.len = (size_t)grid; }
`
	for _, tt := range []struct {
		name, target string
		add          string // added to the kernel's body
		file         string // added at the source's end
		want, not    []string
	}{
		{"clean", "host", "", "", []string{"-Wall -Wextra"}, []string{"warning"}},
		{"unsigned loop never ends", "host", loop, "", []string{"-Wtype-limits", "s >= 0", "host build of", "1 compiler warning above; read it"}, nil},
		{"two warnings", "host", `
  int unused;
  if (n >= 0) y[0] = 0;
`, "", []string{"-Wunused-variable", "-Wtype-limits", "2 compiler warnings above; read them"}, nil},
		{"a macro's warning at two expansions", "host", "", macro, []string{"-Wunused-variable", "2 compiler warnings above; read them"}, nil},
		{"entries ignoring grid and block", "host", "", entries, []string{"-Wall -Wextra"}, []string{"warning"}},
		// nvcc's front end says it once per compilation pass: one warning.
		{"unsigned loop never ends, cuda", "cuda", loop, "", []string{"-Xcompiler -Wall,-Wextra", "pointless comparison of unsigned integer with zero", "cuda build of", "1 compiler warning above; read it"}, nil},
		{"clean, cuda", "cuda", "", "", []string{"-Xcompiler -Wall,-Wextra"}, []string{"warning"}},
		{"a macro's warning at two expansions, cuda", "cuda", "", macro, []string{"never referenced", "2 compiler warnings above; read them"}, nil},
		{"entries ignoring grid and block, cuda", "cuda", "", entries, []string{"-Xcompiler -Wall,-Wextra"}, []string{"warning"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := exec.LookPath("nvcc"); err != nil && tt.target == "cuda" {
				t.Skip("nvcc not found: the CUDA build's warnings are not checked (make install-nvcc)")
			}
			if testing.Short() && tt.target == "cuda" {
				t.Skip("-short: nvcc is slow")
			}
			dir := initDir(t, "warn")
			src := filepath.Join(dir, "warn.cu")
			b, _ := os.ReadFile(src)
			if !strings.Contains(string(b), body) {
				t.Fatalf("test bug: the kernel has no %q", body)
			}
			os.WriteFile(src, []byte(strings.Replace(string(b), body, body+tt.add, 1)+tt.file), 0o644)
			out, errs, code := runMain(t, nil, "build", dir, "--target", tt.target)
			if code != 0 {
				t.Fatalf("exit %d:\n%s%s", code, out, errs)
			}
			for _, w := range tt.want {
				if !strings.Contains(errs, w) {
					t.Errorf("stderr lacks %q:\n%s", w, errs)
				}
			}
			for _, n := range tt.not {
				if strings.Contains(errs, n) {
					t.Errorf("stderr has %q:\n%s", n, errs)
				}
			}
		})
	}
}

// plover bench draws the latency distribution under its percentiles and,
// with --chart, writes it as an SVG (issue 37, item 6).
func TestBenchHistogramAndChart(t *testing.T) {
	url := benchServer(t)
	chart := filepath.Join(t.TempDir(), "lat.svg")
	out, errs, code := runMain(t, nil, "bench", "echo", "--server", url, "--size", "64", "--requests", "300", "--chart", chart)
	if code != 0 {
		t.Fatalf("exit %d:\n%s%s", code, out, errs)
	}
	i := strings.Index(out, "latency distribution (client, 2xx; bins even on a log scale")
	if i < 0 || i < strings.Index(out, "p99.9") {
		t.Fatalf("no histogram under the percentiles:\n%s", out)
	}
	rows := regexp.MustCompile(`(?m)^ +\S+ - \S+ +\|[#.]* +(\d+) +[\d.]+%`).FindAllStringSubmatch(out[i:], -1)
	total := 0
	for _, r := range rows {
		var n int
		for _, c := range r[1] {
			n = 10*n + int(c-'0')
		}
		total += n
	}
	if len(rows) == 0 || len(rows) > 16 || total != 300 || !strings.Contains(out[i:], "p50") {
		t.Fatalf("%d rows holding %d requests, want 1..16 rows holding 300, p50 marked:\n%s", len(rows), total, out[i:])
	}
	if !strings.Contains(errs, "latency chart: "+chart) {
		t.Errorf("stderr does not name the chart: %q", errs)
	}
	svg, err := os.ReadFile(chart)
	if err != nil {
		t.Fatal(err)
	}
	d := xml.NewDecoder(strings.NewReader(string(svg)))
	bars := 0
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed SVG: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "rect" {
			for _, a := range se.Attr {
				if a.Name.Local == "fill" && a.Value == "#1f77b4" {
					bars++
				}
			}
		}
	}
	if bars == 0 || !strings.Contains(string(svg), "echo: client latency of 300 successful requests") || !strings.Contains(string(svg), ">p50 ") {
		t.Errorf("%d bars; the chart:\n%.600s", bars, svg)
	}
	// A chart that cannot be written is an error naming the flag.
	_, errs, code = runMain(t, nil, "bench", "echo", "--server", url, "--size", "64", "--requests", "5", "--chart", filepath.Join(t.TempDir(), "no", "such", "dir.svg"))
	if code != 1 || !strings.Contains(errs, "--chart: open") {
		t.Errorf("exit %d: %s", code, errs)
	}
}

// plover logs shows a function's control characters escaped, not obeyed:
// the lines are a tenant's output on an operator's terminal.
func TestLogLineControlCharacters(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"plain\ttabbed é", "| plain\ttabbed é\n"},
		{"\x1b[2Jwiped\rover", `| \x1b[2Jwiped\x0dover` + "\n"},
		{"bell\x07 and \u0085", `| bell\x07 and \x85` + "\n"},
	} {
		got := logLine(api.LogLine{Stream: "stdout", PID: 1, Line: tc.in})
		if !strings.HasSuffix(got, tc.want) {
			t.Errorf("%q: %q, want it to end %q", tc.in, got, tc.want)
		}
	}
}
