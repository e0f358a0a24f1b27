package main_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/plover-run/plover/internal/testkit"
)

// plover runs its command line and returns its combined output and exit
// status, bounded by 60 s.
func ploverExit(t *testing.T, bin, dir string, env []string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("plover %s did not end within 60 s:\n%s", strings.Join(args, " "), out)
	}
	if ee, ok := err.(*exec.ExitError); ok {
		return string(out), ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), 0
}

// The author's second hour through the real binary (issue 37): warnings
// from plover build, did-you-mean for a manifest field, a command and a
// flag, JSON syntax errors by line and column, plover invoke --timeout on a
// kernel that never returns, plover ls within 100 columns, and plover
// bench's histogram and chart.
func TestAuthoringServed(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts a server")
	}
	if _, err := exec.LookPath("g++"); err != nil {
		t.Skip("g++ not found")
	}
	bin := buildPlover(t)
	work := t.TempDir()

	t.Run("messages", func(t *testing.T) {
		echo := testkit.BundleDir(t, testkit.Manifest("echo"), nil)
		good, err := os.ReadFile(filepath.Join(echo, "plover.json"))
		if err != nil {
			t.Fatal(err)
		}
		store := "file://" + t.TempDir()
		for _, tt := range []struct {
			name     string
			from, to string // an edit of the echo bundle's plover.json; "" runs args as they are
			args     []string
			code     int
			want     string
		}{
			{"manifest field typo", `"zero_tmp": false`, `"zero_temp": false`, nil, 1, `zero_temp: no such field (did you mean "zero_tmp"?)`},
			{"chain field typo", `"block": 64`, `"blok": 64`, nil, 1, `chain[0].blok: no such field in chain[0] (did you mean "block"?)`},
			{"chain value of the wrong type", `"grid": 1`, `"grid": "1"`, nil, 1, `chain[0].grid: "1" is a string, want a whole number`},
			{"JSON syntax error", `"zero_tmp": false,`, `"zero_tmp": false,,`, nil, 1, "plover.json: invalid JSON at line "},
			{"command typo", "", "", []string{"lss"}, 2, `plover: unknown command "lss" (did you mean "ls"?)`},
			{"command transposed", "", "", []string{"sevre"}, 2, `plover: unknown command "sevre" (did you mean "serve"?)`},
			{"flag typo", "", "", []string{"invoke", "echo", "--tming"}, 2, "plover invoke: unknown flag: --tming (did you mean --timing?)"},
		} {
			t.Run(tt.name, func(t *testing.T) {
				args := tt.args
				if tt.from != "" {
					if !strings.Contains(string(good), tt.from) {
						t.Fatalf("test bug: %q not in\n%s", tt.from, good)
					}
					os.WriteFile(filepath.Join(echo, "plover.json"), []byte(strings.Replace(string(good), tt.from, tt.to, 1)), 0o644)
					defer os.WriteFile(filepath.Join(echo, "plover.json"), good, 0o644)
					args = []string{"deploy", echo, "--store", store}
				}
				out, code := ploverExit(t, bin, work, nil, args...)
				if code != tt.code || !strings.Contains(out, tt.want) || strings.Count(out, "plover.json") > 1 {
					t.Fatalf("exit %d:\n%s\nwant exit %d with %q (plover.json named at most once)", code, out, tt.code, tt.want)
				}
				if tt.name == "JSON syntax error" && !regexp.MustCompile(`line \d+, column \d+: invalid character ','`).MatchString(out) {
					t.Fatalf("no line and column:\n%s", out)
				}
			})
		}
	})

	t.Run("build warnings", func(t *testing.T) {
		ploverExit(t, bin, work, nil, "init", "warned")
		dir := filepath.Join(work, "warned")
		src := filepath.Join(dir, "warned.cu")
		b, _ := os.ReadFile(src)
		const body = "  if (i < n) y[i] = ab[0] * x[i] + ab[1];\n"
		if !strings.Contains(string(b), body) {
			t.Fatalf("the scaffold's kernel changed: no %q", body)
		}
		os.WriteFile(src, []byte(strings.Replace(string(b), body, body+"  for (unsigned k = 4; k >= 0; k--) if (i == k) break;\n", 1)), 0o644)
		out, code := ploverExit(t, bin, dir, nil, "build", ".")
		if code != 0 || !strings.Contains(out, "-Wall -Wextra") || !strings.Contains(out, "warning: comparison of unsigned expression") ||
			!strings.Contains(out, "1 compiler warning above; read it") {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		// The scaffold itself builds without one.
		os.WriteFile(src, b, 0o644)
		if out, code := ploverExit(t, bin, dir, nil, "build", "."); code != 0 || strings.Contains(out, "warning") {
			t.Fatalf("exit %d:\n%s", code, out)
		}
	})

	srv := startServer(t, bin)
	env := []string{"PLOVER_SERVER=" + srv.url}
	spin := testkit.Manifest("spin")
	spin.Library = "hostile.so"
	spin.Chain[0].Kernel = "spin"
	spinDir := t.TempDir()
	testkit.BuildLib(t, testkit.HostileSource(), spinDir, spin.Library)
	testkit.WriteManifest(t, spinDir, spin)
	run(t, bin, env, "deploy", spinDir)
	run(t, bin, env, "deploy", testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	in := filepath.Join(work, "in.bin")
	os.WriteFile(in, []byte("0123456789abcdef"), 0o644)

	t.Run("invoke --timeout", func(t *testing.T) {
		start := time.Now()
		out, code := ploverExit(t, bin, work, env, "invoke", "spin", "--in", in, "--out", filepath.Join(work, "o"), "--timeout", "700ms")
		if el := time.Since(start); el > 15*time.Second {
			t.Errorf("took %v for a --timeout of 700ms", el)
		}
		if code != 1 || !strings.Contains(out, "spin did not finish within --timeout 700ms") || !strings.Contains(out, "504 timeout") {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		// A function that answers in time is not disturbed by the flag.
		if out, code := ploverExit(t, bin, work, env, "invoke", "echo", "--in", in, "--out", filepath.Join(work, "o"), "--timeout", "5s"); code != 0 {
			t.Fatalf("echo with --timeout 5s: exit %d:\n%s", code, out)
		}
		if b, _ := os.ReadFile(filepath.Join(work, "o")); !strings.HasPrefix(string(b), "0123456789abcdef") {
			t.Fatalf("echo answered %q", b)
		}
	})

	t.Run("bench histogram and chart", func(t *testing.T) {
		chart := filepath.Join(work, "echo.svg")
		out, code := ploverExit(t, bin, work, env, "bench", "echo", "--in", in, "--requests", "200", "--chart", chart)
		if code != 0 || !strings.Contains(out, "latency distribution (client, 2xx") || !strings.Contains(out, "latency chart: "+chart) {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		if b, err := os.ReadFile(chart); err != nil || !strings.HasPrefix(string(b), "<svg ") || !strings.Contains(string(b), "client latency of 200 successful requests") {
			t.Fatalf("chart: %v\n%.300s", err, b)
		}
	})

	t.Run("ls", func(t *testing.T) {
		out := run(t, bin, env, "ls")
		unrounded := regexp.MustCompile(`\d\.\d{4,}`)
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if n := utf8.RuneCountInString(line); n > 100 || unrounded.MatchString(line) {
				t.Errorf("%d columns (at most 100), durations rounded: %q", n, line)
			}
		}
		if !strings.Contains(out, "echo") || !strings.Contains(out, "spin") || strings.Contains(out, "WORKER") {
			t.Fatalf("plover ls:\n%s", out)
		}
		if wide := run(t, bin, env, "ls", "-o", "wide"); !strings.Contains(wide, "WORKER (PID PSS/RSS THREADS)") || !strings.Contains(wide, "COLD/WARM/HOT") {
			t.Fatalf("plover ls -o wide:\n%s", wide)
		}
	})
}
