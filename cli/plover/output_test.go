package main_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/internal/testkit"
)

// outputBundle is a bundle directory of the printing test kernels
// (testkit.OutputSource) named name, its chain the one kernel.
func outputBundle(t *testing.T, name, kernel string, grid, block int) (string, *abi.Manifest) {
	t.Helper()
	m := testkit.OutputManifest(name, kernel, grid, block)
	dir := t.TempDir()
	testkit.BuildLib(t, testkit.OutputSource(), dir, m.Library, "-Wall", "-Wextra")
	testkit.WriteManifest(t, dir, m)
	return dir, m
}

// ploverOut runs the plover CLI with env and returns its combined output.
func ploverOut(t *testing.T, bin string, env []string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestFunctionOutput: what a function prints, from its entry and from a
// kernel, on stdout and stderr, reaches `plover logs NAME` (and --follow as
// it comes, --since) and GET /v1/functions/{name}/logs with the read scope,
// each line with its time, stream and worker pid; a line printed just
// before a crash survives; a flood is kept bounded and traced in the
// server's log at a bounded rate; `plover run` shows both streams, marked.
func TestFunctionOutput(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts a server")
	}
	bin := buildPlover(t)
	authFile := filepath.Join(t.TempDir(), "tokens")
	toks := writeAuthFile(t, authFile, [][3]string{{"root", "admin", "*"}, {"dash", "read", "*"}, {"app", "invoke", "*"}})
	srv := startIsoServer(t, bin, t.TempDir(), nil, "--auth-file", authFile)
	c := &http.Client{Timeout: 30 * time.Second}
	fn := srv.url + "/v1/functions/"
	deploy := func(dir, name string) {
		t.Helper()
		if r := secDo(t, c, "PUT", fn+name, toks["root"], bundle.MediaType, packDir(t, dir)); r.code != 201 {
			t.Fatalf("deploy %s: %d %s", name, r.code, r.body)
		}
	}
	invoke := func(name, in string) secResp {
		t.Helper()
		return secDo(t, c, "POST", fn+name+"/invoke", toks["app"], "application/octet-stream", []byte(in))
	}
	cliEnv := []string{"PLOVER_SERVER=" + srv.url, "PLOVER_TOKEN=" + toks["dash"]}

	dir, _ := outputBundle(t, "talker", "say", 1, 3)
	deploy(dir, "talker")

	// Followed from before the function first runs.
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	follow := exec.CommandContext(ctx, bin, "logs", "talker", "--follow")
	follow.Env = append(os.Environ(), cliEnv...)
	followOut, err := follow.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	follow.Stderr = os.Stderr
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stop(); follow.Wait() }() // stopped before it is waited for, or a failure hangs here
	followed := &lockedBuf{}
	go func() {
		sc := bufio.NewScanner(followOut)
		for sc.Scan() {
			followed.add(sc.Text())
		}
	}()

	if r := invoke("talker", "hello"); r.code != 200 || !strings.HasPrefix(r.body, "hello") {
		t.Fatalf("invoke: %d %.200s", r.code, r.body)
	}
	var fi api.FunctionInfo
	if r := secDo(t, c, "GET", fn+"talker", toks["dash"], "", nil); r.code != 200 || json.Unmarshal([]byte(r.body), &fi) != nil || len(fi.Workers) != 1 {
		t.Fatalf("show: %d %s", r.code, r.body)
	}
	pid := fi.Workers[0].PID
	// 2026-05-01 10:00:00.123 stdout[4242] | say: hello
	wantLines := []*regexp.Regexp{}
	for _, l := range []string{`stdout\[%d\] \| say: hello`, `stderr\[%d\] \| warn: hello`, `stdout\[%d\] \| kernel 7 thread 0 of 3`, `stdout\[%d\] \| kernel 7 thread 2 of 3`} {
		wantLines = append(wantLines, regexp.MustCompile(`(?m)^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} `+fmt.Sprintf(l, pid)+`$`))
	}
	hasAll := func(out string) bool {
		for _, re := range wantLines {
			if !re.MatchString(out) {
				return false
			}
		}
		return true
	}
	waitFor(t, 10*time.Second, "plover logs --follow to show the function's lines as they come", func() bool { return hasAll(followed.String()) })
	out, err := ploverOut(t, bin, cliEnv, "logs", "talker")
	if err != nil || !hasAll(out) {
		t.Fatalf("plover logs talker: %v\n%s", err, out)
	}
	t.Logf("plover logs talker:\n%s", out)

	// --since and ?since=: lines from then on.
	t1 := time.Now()
	if r := invoke("talker", "again"); r.code != 200 {
		t.Fatalf("invoke: %d %s", r.code, r.body)
	}
	waitFor(t, 10*time.Second, "the follower to see the second request's lines", func() bool {
		return strings.Contains(followed.String(), "| say: again")
	})
	r := secDo(t, c, "GET", fn+"talker/logs?since="+t1.UTC().Format(time.RFC3339Nano), toks["dash"], "", nil)
	if r.code != 200 || r.hdr.Get("Content-Type") != "application/x-ndjson" || !strings.Contains(r.body, `"line":"say: again"`) || strings.Contains(r.body, "hello") {
		t.Fatalf("logs since %v: %d %q %s", t1, r.code, r.hdr.Get("Content-Type"), r.body)
	}
	for _, l := range strings.Split(strings.TrimSpace(r.body), "\n") {
		var ll api.LogLine
		if err := json.Unmarshal([]byte(l), &ll); err != nil || ll.PID != pid || ll.Time.Before(t1) || (ll.Stream != "stdout" && ll.Stream != "stderr") {
			t.Errorf("log line %s: %+v, %v", l, ll, err)
		}
	}
	if out, err := ploverOut(t, bin, cliEnv, "logs", "talker", "--since", "1h", "--json"); err != nil || !strings.Contains(out, `"line":"say: hello"`) {
		t.Fatalf("plover logs --since 1h --json: %v\n%s", err, out)
	}

	// The route's scope is read: no token 401, an invoke token 403; an
	// unknown function 404, a bad since 400.
	for _, tc := range []struct {
		path, token string
		code        int
	}{{"talker/logs", "", 401}, {"talker/logs", toks["app"], 403}, {"nope/logs", toks["dash"], 404},
		{"talker/logs?since=yesterday", toks["dash"], 400}, {"talker/logs?follow=maybe", toks["dash"], 400}} {
		if r := secDo(t, c, "GET", fn+tc.path, tc.token, "", nil); r.code != tc.code {
			t.Errorf("GET %s: %d %s, want %d", tc.path, r.code, r.body, tc.code)
		}
	}

	// A line printed just before a crash, never flushed by the bundle.
	dir, _ = outputBundle(t, "crasher", "say_then_crash", 1, 1)
	deploy(dir, "crasher")
	if r := invoke("crasher", "x"); r.code != 500 || r.errc != "worker_crashed" {
		t.Fatalf("crasher: %d %s", r.code, r.body)
	}
	if out, err := ploverOut(t, bin, cliEnv, "logs", "crasher"); err != nil || !strings.Contains(out, "] | last words\n") {
		t.Fatalf("plover logs crasher: %v\n%s", err, out)
	}

	// A flood: the last lines kept, a long line cut and said so, the
	// server's log traces a bounded number.
	dir, _ = outputBundle(t, "flood", "flood", 20000, 1)
	deploy(dir, "flood")
	if r := invoke("flood", "x"); r.code != 200 {
		t.Fatalf("flood: %d %s", r.code, r.body)
	}
	var lines []string
	waitFor(t, 10*time.Second, "the flood's last line", func() bool {
		out, err := ploverOut(t, bin, cliEnv, "logs", "flood")
		lines = strings.Split(strings.TrimSpace(out), "\n")
		return err == nil && strings.HasSuffix(lines[len(lines)-1], "| flood done")
	})
	if len(lines) > 1000 || !strings.HasSuffix(lines[len(lines)-2], fmt.Sprintf(" [%d more bytes cut]", 10000-api.LogLineMax)) {
		t.Errorf("flood: %d lines kept, the long one %.80q...%q", len(lines), lines[len(lines)-2], lines[len(lines)-2][max(0, len(lines[len(lines)-2])-40):])
	}
	if n := strings.Count(srv.log.String(), "function=flood stream=stdout"); n == 0 || n > 20 {
		t.Errorf("the server log traced %d of the flood's 20002 lines, want 1 to 20", n)
	}

	// Deleting the function ends its followers.
	stopped := make(chan error, 1)
	go func() { stopped <- follow.Wait() }()
	if r := secDo(t, c, "DELETE", fn+"talker", toks["root"], "", nil); r.code != 200 {
		t.Fatalf("delete: %d %s", r.code, r.body)
	}
	select {
	case err := <-stopped:
		if err != nil {
			t.Errorf("plover logs --follow after the function was deleted: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("plover logs --follow still runs after its function was deleted")
	}

	// plover run shows both streams as they come, marked.
	in := filepath.Join(t.TempDir(), "in.bin")
	os.WriteFile(in, []byte("hi"), 0o644)
	dir, _ = outputBundle(t, "local", "say", 1, 2)
	out, err = ploverOut(t, bin, nil, "run", dir, "--in", in, "--out", os.DevNull)
	for _, want := range []string{"stdout | say: hi\n", "stderr | warn: hi\n", "stdout | kernel 7 thread 1 of 2\n"} {
		if err != nil || !strings.Contains(out, want) {
			t.Fatalf("plover run: %v, want %q in:\n%s", err, want, out)
		}
	}
	t.Logf("plover run:\n%s", out)
	// What the bundle prints reaches the terminal escaped, as plover logs
	// shows it: a bidi override and an escape sequence do not act.
	os.WriteFile(in, []byte("hi\u202e\x1b[2J"), 0o644)
	out, err = ploverOut(t, bin, nil, "run", dir, "--in", in, "--out", os.DevNull)
	if want := `stdout | say: hi\u202e\x1b[2J` + "\n"; err != nil || !strings.Contains(out, want) || strings.ContainsAny(out, "\u202e\x1b") {
		t.Fatalf("plover run of a line with controls: %v, want %q in:\n%q", err, want, out)
	}
}

// TestDeadWorkerNoticedAtOnce: a request whose chain never returns gets
// 504; its worker is killed past the grace, and without another request
// the function's listing shows no instance and no worker within a bounded
// time, and the server's log says `worker died` with the function, its
// version, the worker's pid and why.
func TestDeadWorkerNoticedAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts a server")
	}
	bin := buildPlover(t)
	srv := startIsoServer(t, bin, t.TempDir(), nil)
	c := &http.Client{Timeout: 30 * time.Second}
	fn := srv.url + "/v1/functions/"
	dir, _ := outputBundle(t, "looper", "say_then_spin", 1, 1)
	if r := secDo(t, c, "PUT", fn+"looper", "", bundle.MediaType, packDir(t, dir)); r.code != 201 {
		t.Fatalf("deploy: %d %s", r.code, r.body)
	}
	req, _ := http.NewRequest("POST", fn+"looper/invoke", strings.NewReader("x"))
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("X-Plover-Timeout-Ms", "300")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	t504 := time.Now()
	if resp.StatusCode != 504 {
		t.Fatalf("a chain that never returns, 300 ms deadline: %d, want 504", resp.StatusCode)
	}
	// Its worker's pid, from what it printed.
	var pid int
	waitFor(t, 10*time.Second, "the function's line", func() bool {
		r := secDo(t, c, "GET", fn+"looper/logs", "", "", nil)
		var l api.LogLine
		if json.Unmarshal([]byte(r.body), &l) == nil && l.Line == "spinning" {
			pid = l.PID
		}
		return pid != 0
	})

	var fi api.FunctionInfo
	waitFor(t, 5*time.Second, "the listing to show no instance of the dead worker", func() bool {
		r := secDo(t, c, "GET", fn+"looper", "", "", nil)
		fi = api.FunctionInfo{}
		return r.code == 200 && json.Unmarshal([]byte(r.body), &fi) == nil && fi.Busy == 0 && fi.Idle == 0 && len(fi.Workers) == 0
	})
	t.Logf("%v after the 504: busy %d, idle %d, workers %v", time.Since(t504).Round(time.Millisecond), fi.Busy, fi.Idle, fi.Workers)
	died := regexp.MustCompile(`msg="worker died" function=looper version=` + regexp.QuoteMeta(fi.Version) +
		fmt.Sprintf(` pid=%d reason="[^"]*deadline[^"]*" during="running the chain"`, pid))
	waitFor(t, 5*time.Second, "the server's log to say the worker died", func() bool { return died.MatchString(srv.log.String()) })
	line := died.FindString(srv.log.String())
	t.Logf("server log: %s", line)
	if r := secDo(t, c, "GET", fn+"looper", "", "", nil); !strings.Contains(r.body, `"requests":1`) {
		t.Errorf("the function served another request meanwhile: %s", r.body)
	}
}
