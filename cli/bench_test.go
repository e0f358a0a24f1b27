package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/bench"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// runCommand parses args for c as Main does and runs it.
func runCommand(c *command, args ...string) (stdout, stderr string, err error) {
	var out, errb bytes.Buffer
	env := &Env{Stdout: &out, Stderr: &errb}
	cc := c.cobra(env)
	cc.SetArgs(args)
	cc.SilenceErrors, cc.SilenceUsage = true, true
	err = cc.Execute()
	return out.String(), errb.String(), err
}

// benchServer is an in-process server with the test kernels' echo
// function deployed as "echo".
func benchServer(t *testing.T) string {
	t.Helper()
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	return testkit.Serve(t, e, httpapi.Options{})
}

func TestBenchClosedLoopJSON(t *testing.T) {
	url := benchServer(t)
	t0 := time.Now()
	out, stderr, err := runCommand(benchCmd(), "echo", "--server", url, "--size", "64", "--concurrency", "2", "--duration", "1s", "--json")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if el := time.Since(t0); el > 5*time.Second {
		t.Fatalf("a 1s run took %v", el)
	}
	var res bench.Result
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if res.OK < 10 || res.Requests != res.OK || len(res.Errors) != 0 || res.Stopped != "duration" || res.Concurrency != 2 {
		t.Fatalf("%+v", res)
	}
	// The first request loads the version; with two connections a few more
	// may wait for that load (cold too) or create instances (warm); the
	// rest are hot. Every 2xx response carries its start kind.
	if res.Starts.Cold < 1 || res.Starts.Cold+res.Starts.Warm > 8 || res.Starts.Hot < res.OK/2 ||
		res.Starts.Cold+res.Starts.Warm+res.Starts.Hot != res.OK {
		t.Fatalf("starts %+v of %d", res.Starts, res.OK)
	}
	if res.Timing.Responses != res.OK || res.Timing.Total.P50 <= 0 || res.Timing.Load.Max <= 0 {
		t.Fatalf("server timing %+v", res.Timing)
	}
	if res.Latency.P50 <= 0 || res.Latency.P99 < res.Latency.P50 || res.Latency.Max < res.Latency.P99 {
		t.Fatalf("latency %+v", res.Latency)
	}
	// Client latency includes the server's total.
	if res.Latency.Mean < res.Timing.Total.Mean {
		t.Fatalf("client mean %v < server mean %v", res.Latency.Mean, res.Timing.Total.Mean)
	}
}

func TestBenchOpenLoopTable(t *testing.T) {
	url := benchServer(t)
	in := filepath.Join(t.TempDir(), "in.bin")
	os.WriteFile(in, []byte("0123456789abcdef"), 0o644)
	out, stderr, err := runCommand(benchCmd(), "echo", "--server", url, "--in", in, "--rate", "100/s", "--duration", "1s", "--requests", "1000")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	for _, want := range []string{"open loop at 100 req/s", "16-byte input", "stopped by --duration 1s", "schedule    100 due",
		"p50", "p99", "server (Server-Timing", "queue", "copyin", "kernels", "copyout", "total"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// The first request loads the version; requests sent while it loads
	// wait for that load and count as cold too (3 on a loaded machine).
	if !regexp.MustCompile(`starts\s+cold [1-8], warm \d+, hot \d+`).MatchString(out) {
		t.Errorf("output lacks the starts (cold 1 to 8, warm, hot):\n%s", out)
	}
}

func TestBenchRequestLimitAndErrors(t *testing.T) {
	url := benchServer(t)
	out, _, err := runCommand(benchCmd(), "nosuch", "--server", url, "--size", "8", "--requests", "5", "--json")
	if err == nil || !strings.Contains(err.Error(), "no request succeeded") {
		t.Fatalf("err %v", err)
	}
	var res bench.Result
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if res.Requests != 5 || res.Stopped != "requests" || len(res.Errors) != 1 || res.Errors[0].Status != 404 {
		t.Fatalf("%+v", res)
	}
}

func TestBenchFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"echo"},                                   // no input
		{"echo", "--size", "8", "--in", "x"},       // both inputs
		{"echo", "--size", "8", "--duration", "0"}, // unbounded
		{"echo", "--size", "8", "--requests", "-1"},
		{"--size", "8"}, // no name
	} {
		if _, _, err := runCommand(benchCmd(), args...); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
	if _, _, err := runCommand(benchCmd(), "echo", "--size", "8", "--rate", "fast"); err == nil {
		t.Error("--rate fast accepted")
	}
}

func TestBenchNoServer(t *testing.T) {
	_, _, err := runCommand(benchCmd(), "echo", "--server", "http://127.0.0.1:1", "--size", "8", "--duration", "5s")
	if err == nil || !strings.Contains(err.Error(), "plover serve") {
		t.Fatalf("err %v", err)
	}
}

// --warmup's requests go before the timed run: the version's load (the
// cold start) is in none of its figures.
func TestBenchWarmup(t *testing.T) {
	for _, tt := range []struct {
		warmup string
		cold   int64
	}{{"0", 1}, {"2", 0}} {
		url := benchServer(t) // not loaded yet
		out, stderr, err := runCommand(benchCmd(), "echo", "--server", url, "--size", "64", "--requests", "20", "--warmup", tt.warmup, "--json")
		if err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		var res bench.Result
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if res.Requests != 20 || res.OK != 20 || res.Starts.Cold != tt.cold || fmt.Sprint(res.Warmup) != tt.warmup || res.WarmupFailed != 0 {
			t.Fatalf("--warmup %s: %d requests, %d ok, %d cold, warmup %d (%d failed); want 20, 20, %d cold", tt.warmup, res.Requests, res.OK, res.Starts.Cold, res.Warmup, res.WarmupFailed, tt.cold)
		}
	}
}
