package main_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/internal/testkit"
)

// Sharing a device on a real server with real workers: a batch flood holds
// the one device slot (--device-runs 1) and queues behind it; a latency
// function's request is admitted next, ahead of the queued flood, and says
// how long it waited (Server-Timing sched); device time is accounted; and
// where cgroups can be written each worker's CPU weight follows its
// function's share and priority.
func TestSharingServed(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts servers")
	}
	bin := buildPlover(t)
	// --light-boost 1: the weights checked below are the functions' own, not
	// a light worker's boost (worker/boost_test.go).
	s := startIsoServer(t, bin, t.TempDir(), nil, "--device-runs", "1", "--light-boost", "1")
	slow := testkit.Slow("slow", 150)
	slow.MaxInstances, slow.Priority = 4, "batch"
	fast := testkit.Manifest("fast")
	fast.Share, fast.Priority = 2, "latency"
	run(t, bin, []string{"PLOVER_SERVER=" + s.url}, "deploy", testkit.BundleDir(t, slow, nil))
	run(t, bin, []string{"PLOVER_SERVER=" + s.url}, "deploy", testkit.BundleDir(t, fast, nil))
	post := func(fn string) (*http.Response, []byte) {
		resp, err := http.Post(s.url+"/v1/functions/"+fn+"/invoke", "application/octet-stream", bytes.NewReader([]byte{1}))
		if err != nil {
			t.Error(err)
			return nil, nil
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Errorf("%s: %d %s", fn, resp.StatusCode, b)
		}
		return resp, b
	}
	post("fast") // both loaded, workers placed
	post("slow")
	info := func(fn string) api.FunctionInfo {
		var fi api.FunctionInfo
		resp, err := http.Get(s.url + "/v1/functions/" + fn)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		json.NewDecoder(resp.Body).Decode(&fi)
		return fi
	}

	var slowDone atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			post("slow")
			slowDone.Add(1)
		}()
	}
	waitFor(t, 10*time.Second, "one slow run on the device and the rest queued for it", func() bool {
		return info("slow").Queue >= 2
	})
	resp, _ := post("fast")
	before := slowDone.Load()
	wg.Wait()
	if resp == nil {
		t.Fatal("no answer from fast")
	}
	if before > 1 {
		t.Fatalf("%d slow requests finished before the latency one: it waited behind the queued flood", before)
	}
	m := regexp.MustCompile(`sched;dur=([0-9.]+)`).FindStringSubmatch(resp.Header.Get("Server-Timing"))
	if m == nil {
		t.Fatalf("no sched in Server-Timing %q", resp.Header.Get("Server-Timing"))
	}
	if ms, _ := strconv.ParseFloat(m[1], 64); ms <= 0 || ms > 1000 {
		t.Fatalf("sched %s ms: want the rest of one slow run", m[1])
	}
	fs, ff := info("slow"), info("fast")
	if fs.DeviceSeconds < 0.7 || fs.Priority != "batch" || ff.Share != 2 || ff.Priority != "latency" {
		t.Fatalf("slow: %.3f device s, priority %q; fast: share %v priority %q", fs.DeviceSeconds, fs.Priority, ff.Share, ff.Priority)
	}
	mresp, err := http.Get(s.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	if !strings.Contains(string(mb), `plover_device_seconds_total{function="slow"}`) || !strings.Contains(string(mb), `phase="sched"`) {
		t.Fatal("/metrics lacks plover_device_seconds_total or the sched phase")
	}

	// CPU weights, where this machine lets the server write cgroups.
	if strings.Contains(s.log.String(), "worker CPU weights off") {
		t.Logf("cgroups not writable here; weights not checked: %s", grepLine(s.log.String(), "worker CPU weights off"))
		return
	}
	group := serverGroup(t, s)
	want := map[string][2]string{"fast": {"16384", "1600"}, "slow": {"128", "13"}} // 1024 or 100 x share x8 (latency) or /8 (batch)
	for fn, w := range want {
		fi := info(fn)
		if len(fi.Workers) != 1 {
			t.Fatalf("%s: workers %+v", fn, fi.Workers)
		}
		dir := filepath.Join(group, strconv.Itoa(fi.Workers[0].PID))
		v, err := os.ReadFile(filepath.Join(dir, "cpu.shares"))
		if err != nil {
			v, err = os.ReadFile(filepath.Join(dir, "cpu.weight"))
		}
		got := strings.TrimSpace(string(v))
		if err != nil || (got != w[0] && got != w[1]) {
			t.Fatalf("%s's worker %d: weight %q (%v), want %s (v1) or %s (v2)", fn, fi.Workers[0].PID, got, err, w[0], w[1])
		}
		procs, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if !strings.Contains(string(procs), strconv.Itoa(fi.Workers[0].PID)) {
			t.Fatalf("%s's worker %d is not in its group: %q", fn, fi.Workers[0].PID, procs)
		}
	}
	// The server's groups go with it.
	s.stop(t)
	if dirExists(group) {
		t.Fatalf("%s outlived the server", group)
	}
}

// serverGroup is the server's CPU group (plover-PID), which the server
// logged it made.
func serverGroup(t *testing.T, s *isoServer) string {
	t.Helper()
	for _, root := range []string{"/sys/fs/cgroup/cpu", "/sys/fs/cgroup"} {
		if d := filepath.Join(root, "plover-"+strconv.Itoa(s.pid)); dirExists(d) {
			return d
		}
	}
	t.Fatalf("the server logged CPU weights on, but there is no plover-%d group:\n%s", s.pid, grepLine(s.log.String(), "CPU weights"))
	return ""
}

// startGroupedServer builds plover and starts a server whose workers' CPU
// weights are cgroups, whose files a test reads; it skips the test where
// they cannot be (no cgroups, or nice levels).
func startGroupedServer(t *testing.T) (string, *isoServer) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds binaries and starts servers")
	}
	bin := buildPlover(t)
	s := startIsoServer(t, bin, t.TempDir(), nil)
	if strings.Contains(s.log.String(), "worker CPU weights off") || strings.Contains(s.log.String(), "by nice level") {
		t.Skipf("no cgroups to read the weight from here: %s", grepLine(s.log.String(), "CPU weights"))
	}
	return bin, s
}

// A light function's boost on a real server: the worker of a function
// that has been idle since its first request runs at 8 times its
// function's weight within a few of the boost's 250 ms windows (where
// cgroups can be written; TestSharingServed checks the weights without it).
func TestLightWorkerBoostedServed(t *testing.T) {
	bin, s := startGroupedServer(t)
	run(t, bin, []string{"PLOVER_SERVER=" + s.url}, "deploy", testkit.BundleDir(t, testkit.Manifest("idle"), nil))
	resp, err := http.Post(s.url+"/v1/functions/idle/invoke", "application/octet-stream", bytes.NewReader([]byte{1}))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var fi api.FunctionInfo
	getJSON(t, http.DefaultClient, s.url+"/v1/functions/idle", &fi)
	if len(fi.Workers) != 1 {
		t.Fatalf("idle's workers: %+v", fi.Workers)
	}
	dir := filepath.Join(serverGroup(t, s), strconv.Itoa(fi.Workers[0].PID))
	var got string
	waitFor(t, 10*time.Second, "the idle function's worker to be boosted", func() bool {
		v, err := os.ReadFile(filepath.Join(dir, "cpu.shares"))
		if err != nil {
			v, _ = os.ReadFile(filepath.Join(dir, "cpu.weight"))
		}
		got = strings.TrimSpace(string(v))
		return got == "8192" || got == "800" // 1024 or 100, x8
	})
}

// A flood's worker is never boosted on a real server, however little CPU
// it uses: a function whose runs sleep 20 ms, sent 4 at a time (so two or
// more are queued or running), stays at its weight while an idle
// function's worker beside it runs boosted, and is boosted itself once it
// stops. Read by CPU time alone, its sleeping worker was light and ran
// boosted beside the idle one (as the 4 MB vecadd flood's did beside the
// CNN).
func TestAFloodIsNotBoostedServed(t *testing.T) {
	bin, s := startGroupedServer(t)
	env := []string{"PLOVER_SERVER=" + s.url}
	run(t, bin, env, "deploy", testkit.BundleDir(t, testkit.Manifest("idle"), nil))
	run(t, bin, env, "deploy", testkit.BundleDir(t, testkit.Slow("flood", 20), nil))
	shares := map[string]string{}
	for _, name := range []string{"idle", "flood"} {
		resp, err := http.Post(s.url+"/v1/functions/"+name+"/invoke", "application/octet-stream", bytes.NewReader([]byte{1}))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		var fi api.FunctionInfo
		getJSON(t, http.DefaultClient, s.url+"/v1/functions/"+name, &fi)
		if len(fi.Workers) != 1 {
			t.Fatalf("%s's workers: %+v", name, fi.Workers)
		}
		shares[name] = filepath.Join(serverGroup(t, s), strconv.Itoa(fi.Workers[0].PID), "cpu.shares")
	}
	read := func(name string) string {
		v, err := os.ReadFile(shares[name])
		if err != nil { // cgroup v2
			v, _ = os.ReadFile(strings.TrimSuffix(shares[name], "cpu.shares") + "cpu.weight")
		}
		return strings.TrimSpace(string(v))
	}
	boosted := func(name string) bool { v := read(name); return v == "8192" || v == "800" }
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := http.Post(s.url+"/v1/functions/flood/invoke", "application/octet-stream", bytes.NewReader([]byte{1}))
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}
		}()
	}
	// Both at once, in one look: the idle function's worker boosted, the
	// flood's at its weight, for a second of the boost's windows.
	since := time.Time{}
	waitFor(t, 15*time.Second, "the idle worker boosted and the flood's not, for a second", func() bool {
		if !boosted("idle") || boosted("flood") {
			since = time.Time{}
			return false
		}
		if since.IsZero() {
			since = time.Now()
		}
		return time.Since(since) >= time.Second
	})
	close(stop)
	wg.Wait()
	waitFor(t, 10*time.Second, "the flood's worker boosted once it stopped and idled", func() bool { return boosted("flood") })
}

func dirExists(d string) bool {
	fi, err := os.Stat(d)
	return err == nil && fi.IsDir()
}

func grepLine(log, s string) string {
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}

// A token's auth-file limits on a real server: past its rate, 429 with
// Retry-After before anything runs (counted in the metrics); past its
// concurrency, 429 while its requests are in flight; another token is
// not affected.
func TestTokenLimitsServed(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts servers")
	}
	bin := buildPlover(t)
	dir := t.TempDir()
	authFile := filepath.Join(dir, "tokens")
	tok := map[string]string{}
	var lines []string
	for _, l := range []struct{ name, scopes, limits string }{
		{"root", "admin", ""},
		{"metered", "invoke", "rate=2,burst=2"},
		{"narrow", "invoke", "concurrency=1"},
	} {
		out := run(t, bin, nil, "token", "new", l.name, "--scopes", l.scopes, "--json", "--limits", l.limits)
		if l.limits == "" {
			out = run(t, bin, nil, "token", "new", l.name, "--scopes", l.scopes, "--json")
		}
		var r struct{ Token, Line string }
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("token new: %v: %s", err, out)
		}
		tok[l.name] = r.Token
		lines = append(lines, r.Line)
	}
	if err := os.WriteFile(authFile, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startIsoServer(t, bin, t.TempDir(), nil, "--auth-file", authFile)
	run(t, bin, []string{"PLOVER_SERVER=" + s.url, "PLOVER_TOKEN=" + tok["root"]}, "deploy", testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	run(t, bin, []string{"PLOVER_SERVER=" + s.url, "PLOVER_TOKEN=" + tok["root"]}, "deploy", testkit.BundleDir(t, testkit.Slow("slow", 400), nil))
	call := func(name, fn string) *http.Response {
		req, _ := http.NewRequest("POST", s.url+"/v1/functions/"+fn+"/invoke", bytes.NewReader([]byte{1}))
		req.Header.Set("Authorization", "Bearer "+tok[name])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	// The burst of 2 at once, then the third is over the rate of 2/s.
	for i := 0; i < 2; i++ {
		if r := call("metered", "echo"); r.StatusCode != 200 {
			t.Fatalf("request %d within the burst: %d", i+1, r.StatusCode)
		}
	}
	r := call("metered", "echo")
	if r.StatusCode != 429 || r.Header.Get("Retry-After") != "1" {
		t.Fatalf("over the rate: %d, Retry-After %q; want 429 and 1", r.StatusCode, r.Header.Get("Retry-After"))
	}
	if r := call("root", "echo"); r.StatusCode != 200 {
		t.Fatalf("another token was limited: %d", r.StatusCode)
	}

	// Concurrency 1: a second request while the first runs is refused.
	first := make(chan int, 1)
	go func() { first <- call("narrow", "slow").StatusCode }()
	waitFor(t, 5*time.Second, "the first request running", func() bool {
		var fi api.FunctionInfo
		req, _ := http.NewRequest("GET", s.url+"/v1/functions/slow", nil)
		req.Header.Set("Authorization", "Bearer "+tok["root"])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		json.NewDecoder(resp.Body).Decode(&fi)
		return fi.Busy == 1
	})
	if r := call("narrow", "echo"); r.StatusCode != 429 || r.Header.Get("Retry-After") == "" {
		t.Fatalf("a second request in flight: %d, Retry-After %q", r.StatusCode, r.Header.Get("Retry-After"))
	}
	if code := <-first; code != 200 {
		t.Fatalf("the first request: %d", code)
	}
	if r := call("narrow", "echo"); r.StatusCode != 200 {
		t.Fatalf("after the first ended: %d", r.StatusCode)
	}
	req, _ := http.NewRequest("GET", s.url+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+tok["root"])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`plover_token_limited_total{limit="rate",token="metered"} 1`, `plover_token_limited_total{limit="concurrency",token="narrow"} 1`} {
		if !strings.Contains(string(mb), want) {
			t.Fatalf("/metrics lacks %s", want)
		}
	}
}

// A followed log stream holds a place among its token's streams until it
// ends, counted apart from its requests in flight and bounded by the same
// concurrency: with one follow open, a concurrency=1 token still calls
// (the console follows a function's output while it polls: every poll was
// 429 when the stream took the token's only place), a second follow is
// refused 429, and once the client leaves the stream a follow is admitted
// again. (Before issue 42 the stream held nothing once its handler
// returned: a token of concurrency 1 could hold all of a function's 32
// follows.)
func TestFollowHoldsTokensPlace(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts servers")
	}
	bin := buildPlover(t)
	authFile := filepath.Join(t.TempDir(), "tokens")
	tok := writeLimitedAuthFile(t, authFile, []limitedToken{
		{"root", auth.Admin, auth.Limits{}},
		{"narrow", auth.Invoke | auth.Read, auth.Limits{Concurrency: 1}},
	})
	s := startIsoServer(t, bin, t.TempDir(), nil, "--auth-file", authFile)
	run(t, bin, []string{"PLOVER_SERVER=" + s.url, "PLOVER_TOKEN=" + tok["root"]}, "deploy", testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	client := &http.Client{Timeout: 10 * time.Second} // bounds a follow wrongly admitted
	do := func(method, path string) (*http.Response, string) {
		req, _ := http.NewRequest(method, s.url+path, bytes.NewReader([]byte{1}))
		req.Header.Set("Authorization", "Bearer "+tok["narrow"])
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	if r, body := do("POST", "/v1/functions/echo/invoke"); r.StatusCode != 200 {
		t.Fatalf("a call with nothing in flight: %d %s", r.StatusCode, body)
	}

	req, _ := http.NewRequest("GET", s.url+"/v1/functions/echo/logs?follow=true", nil)
	req.Header.Set("Authorization", "Bearer "+tok["narrow"])
	follow, err := http.DefaultClient.Do(req) // returns with the headers: the stream is open
	if err != nil {
		t.Fatal(err)
	}
	defer follow.Body.Close()
	if follow.StatusCode != 200 {
		t.Fatalf("follow: %d", follow.StatusCode)
	}
	if r, body := do("POST", "/v1/functions/echo/invoke"); r.StatusCode != 200 {
		t.Fatalf("a call with a follow open: %d %s, want 200 (a stream is no request in flight)", r.StatusCode, body)
	}
	r, body := do("GET", "/v1/functions/echo/logs?follow=true")
	if r.StatusCode != 429 || r.Header.Get("Retry-After") == "" || !strings.Contains(body, "1 followed log streams open") {
		t.Fatalf("a second follow: %d, Retry-After %q, %s; want 429 naming the streams", r.StatusCode, r.Header.Get("Retry-After"), body)
	}
	follow.Body.Close() // the client leaves: the server sees the connection end
	waitFor(t, 10*time.Second, "the follow's place back", func() bool {
		// Returns with the headers; closed at once.
		again, err := http.DefaultClient.Do(req.Clone(context.Background()))
		if err != nil {
			t.Fatal(err)
		}
		again.Body.Close()
		return again.StatusCode == 200
	})
}

// limitedToken is an auth-file line to write: its token's name, scopes
// and limits (every function).
type limitedToken struct {
	name   string
	scopes auth.Scope
	limits auth.Limits
}

// writeLimitedAuthFile writes a fresh token for each of lines to path and
// returns them by name.
func writeLimitedAuthFile(t *testing.T, path string, lines []limitedToken) map[string]string {
	t.Helper()
	tok := map[string]string{}
	var text []string
	for _, l := range lines {
		k, err := auth.NewToken()
		if err != nil {
			t.Fatal(err)
		}
		tok[l.name] = k
		text = append(text, auth.Line(l.name, l.scopes, auth.Hash(k), nil, l.limits))
	}
	if err := os.WriteFile(path, []byte(strings.Join(text, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return tok
}
