package main_test

// The isolation battery: hostile bundles (internal/testkit/hostile.cu,
// hostile_ctor.cu) against a real `plover serve` process, once with
// --isolation process (every function in its own worker process) and once
// with --isolation none (kernels in the server process). Both runs share one
// table; each case says whether in-process serving can contain it, and the
// none run skips those that it cannot (or, for the leaks, asserts the
// documented in-process behaviour, which also proves the hostile kernel
// works). Throughout, a background loop invokes a well-behaved function and
// every answer must be exactly its echo.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"github.com/plover-run/plover/api"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/worker/contain"
)

func TestIsolationProcess(t *testing.T) { runIsolation(t, "process") }
func TestIsolationNone(t *testing.T)    { runIsolation(t, "none") }

// isoCase is one hostile behaviour. noneSkip says why --isolation none cannot
// contain it ("" when it runs in both modes); none, if set, runs instead of
// skipping there and asserts the documented in-process behaviour.
type isoCase struct {
	name     string
	noneSkip string
	none     func(t *testing.T, h *isoHarness)
	run      func(t *testing.T, h *isoHarness)
}

const (
	goodName     = "good"   // kernels.cu echo, invoked by the load loop
	hostileOut   = 64 << 10 // out_bytes of the hostile functions
	overrideOut  = 256      // out_bytes of the per-request echo override
	crashTimeout = 10_000   // X-Plover-Timeout-Ms for requests that should crash fast
	backoffAfter = 5        // crashes within a minute that back a function off
	deadlineSlop = 3 * time.Second
)

var (
	secretAWS    = "plover-test-secret-" + randHex(8)
	secretPlover = "plover-env-secret-" + randHex(8)
)

const (
	skipCrash    = "a kernel that crashes or exits takes the in-process server down with it"
	skipDeadline = "an in-process kernel cannot be interrupted: a stuck request holds its instance (and a server thread) until the kernel returns"
)

func isolationCases() []isoCase {
	return []isoCase{
		{name: "baseline", run: caseBaseline},
		{name: "segv", noneSkip: skipCrash, run: crashCase("segv", "segv", diedBy("SIGSEGV"))},
		{name: "abort", noneSkip: skipCrash, run: crashCase("abort-now", "abort_now", diedBy("SIGABRT"))},
		{name: "exit-zero", noneSkip: skipCrash, run: crashCase("exit-zero", "exit_zero", exitedWith(0))},
		{name: "sigterm-self", noneSkip: "SIGTERM to its own process shuts the in-process server down", run: crashCase("sigterm-self", "sigterm_self", diedBy("SIGTERM"))},
		{name: "overflow-out", noneSkip: "a wild write past out corrupts or crashes the server process", run: crashCase("overflow-out", "overflow_out", nil)},
		{name: "close-fds", noneSkip: "closing fds 3..1023 closes the server's own listener and connections", run: caseCloseFDs},
		{name: "ring-twice", noneSkip: skipRing, run: caseRingTwice},
		{name: "ring-control", noneSkip: skipRing, run: caseRingControl},
		{name: "backoff", noneSkip: skipCrash, run: caseBackoff},
		{name: "deadline-spin", noneSkip: skipDeadline, run: deadlineCase("spin", "spin")},
		{name: "deadline-sleep", noneSkip: skipDeadline, run: deadlineCase("sleep-long", "sleep_long")},
		{name: "deadline-many", noneSkip: skipDeadline, run: caseDeadlineMany},
		{name: "fork-accept", noneSkip: "a forked child inherits the server's listening socket and answers its clients", run: caseForkAccept},
		{name: "threads", noneSkip: "threads started by a kernel live in the server process; removing the function cannot end them", run: caseThreads},
		{name: "spawn", noneSkip: "a process a kernel starts is the server's child", run: caseSpawn},
		{name: "env", noneSkip: "a kernel sees the server's environment", none: caseEnvNone, run: caseEnv},
		{name: "read-file", noneSkip: "a kernel can read everything the server can", none: caseReadFileNone, run: caseReadFile},
		{name: "read-server-environ", noneSkip: "the server's /proc/PID/environ is the kernel's own", run: caseReadServerEnviron},
		{name: "memscan", noneSkip: "every function's requests live in one address space", none: caseMemscanNone, run: caseMemscan},
		{name: "signal-others", noneSkip: "a kernel in the server process can signal anything the server can", run: caseSignalOthers},
		{name: "connect-tcp", noneSkip: "a kernel in the server process has the server's network", run: caseConnectTCP},
		{name: "send-udp", noneSkip: "a kernel in the server process has the server's network", none: caseSendUDPNone, run: caseSendUDP},
		{name: "memory-limit", noneSkip: "a kernel in the server process grows the server", run: caseMemoryLimit},
		{name: "memory-tree", noneSkip: "a kernel in the server process grows the server", run: caseMemoryTree},
		{name: "accounting", noneSkip: "no worker processes to account", run: caseAccounting},
		{name: "ctor-hang", noneSkip: "a constructor that never returns hangs the server's dlopen", run: caseCtorHang},
		{name: "ctor-crash", noneSkip: "a library constructor that crashes on dlopen takes the server down", run: caseCtorCrash},
	}
}

// diedBy matches a message naming the signal (a worker that died with exit
// status 2 after a Go crash report has lost the cause).
func diedBy(sig string) *regexp.Regexp { return regexp.MustCompile(`\b` + sig + `\b`) }

// exitedWith matches "exit status N" or "exited with status N".
func exitedWith(code int) *regexp.Regexp {
	return regexp.MustCompile(fmt.Sprintf(`exit(ed with)? status %d\b`, code))
}

// isoHarness is what the cases share: the server, the built libraries and
// the deploy and invoke helpers.
type isoHarness struct {
	mode     string
	bin      string
	srv      *isoServer
	args     []string // serve flags after --listen/--data/--device
	env      []string // extra server environment (the secrets)
	hostile  string   // built hostile.so
	ctor     string   // built hostile_ctor.so
	client   *http.Client
	ctorUsed bool // the ctor-crash case deployed its function: restart the server at the end
}

func runIsolation(t *testing.T, mode string) {
	if testing.Short() {
		t.Skip("builds binaries and starts servers")
	}
	bin := buildPlover(t)
	h := &isoHarness{mode: mode, bin: bin, env: []string{"AWS_SECRET_ACCESS_KEY=" + secretAWS, "PLOVER_TEST_SECRET=" + secretPlover},
		client: &http.Client{Timeout: 20 * time.Second}}
	h.args = []string{"--isolation", mode}
	if mode == "process" {
		h.args = append(h.args, "--standby-workers", "2")
	}
	libs := t.TempDir()
	h.hostile = testkit.BuildLib(t, testkit.HostileSource(), libs, "hostile.so", "-Wall", "-Wextra")
	h.ctor = testkit.BuildLib(t, testkit.HostileCtorSource(), libs, "hostile_ctor.so", "-Wall", "-Wextra")
	good := testkit.BundleDir(t, testkit.Manifest(goodName), nil)

	h.srv = startIsoServer(t, bin, t.TempDir(), h.env, h.args...)
	t.Logf("server pid %d at %s, flags %v", h.srv.pid, h.srv.url, h.args)
	h.mustDeployDir(t, good)
	load := startLoad(h.srv.url, goodName, 100*time.Second, 20000)
	defer load.stopAndWait() // also on an early Fatal

	for _, c := range isolationCases() {
		ok := t.Run(c.name, func(t *testing.T) {
			if mode == "none" && c.noneSkip != "" {
				if c.none == nil {
					t.Skip("--isolation none cannot contain this: " + c.noneSkip)
				}
				t.Log("--isolation none does not contain this (" + c.noneSkip + "); asserting the documented in-process behaviour")
				c.none(t, h)
				return
			}
			c.run(t, h)
		})
		h.srv.mustBeHealthy(t, "after case "+c.name)
		if !ok {
			t.Logf("case %s failed; continuing with the next", c.name)
		}
	}

	load.waitCount(t, 20, 10*time.Second) // a sensible sample even when every case was quick or skipped
	n, fails := load.stopAndWait()
	t.Logf("background load on %s: %d requests, %d failures", goodName, n, len(fails))
	if len(fails) > 0 {
		t.Errorf("the well-behaved function failed %d of %d requests during the hostile cases; first: %s", len(fails), n, strings.Join(fails[:min(5, len(fails))], "; "))
	}
	if n < 20 {
		t.Errorf("background load made only %d requests", n)
	}

	if h.ctorUsed {
		t.Run("ctor-crash-restart", h.restartAfterCtor)
	}
}

// ---- the cases -----------------------------------------------------------

func caseBaseline(t *testing.T, h *isoHarness) {
	h.mustDeploy(t, hostileManifest("baseline", launch("echo", 1, 64)), h.hostile)
	in := []byte("baseline " + randHex(8))
	r := h.invoke(t, "baseline", in, 0)
	if r.code != 200 || !bytes.Equal(r.body, padTo(in, hostileOut)) {
		t.Fatalf("baseline echo: %d %.200q", r.code, r.body)
	}
	h.expectEchoOverride(t, "baseline", 0)
}

// crashCase: a kernel that kills its worker. The request gets 500
// worker_crashed naming the function and how the worker died (want, when
// set: the signal's name, or the exit status); the next request starts a
// fresh worker.
func crashCase(name, kernel string, want *regexp.Regexp) func(t *testing.T, h *isoHarness) {
	return func(t *testing.T, h *isoHarness) {
		h.mustDeploy(t, hostileManifest(name, launch(kernel, 1, 1)), h.hostile)
		r := h.invoke(t, name, []byte("boom"), crashTimeout)
		msg := expectError(t, r, 500, "worker_crashed", name)
		if want != nil && !want.MatchString(msg) {
			t.Errorf("worker_crashed message %q does not say how the worker died (%s)", msg, want)
		}
		h.expectEchoOverride(t, name, 0)
	}
}

// caseCloseFDs: a kernel that closes every fd from 3 up and returns. A worker
// whose channel to the server was among them dies with it (500
// worker_crashed); one that talks over fds 0-2 may answer 200. Either way
// the function recovers (at most one more worker_crashed while the damaged
// worker is found out) and the server is unaffected.
func caseCloseFDs(t *testing.T, h *isoHarness) {
	h.mustDeploy(t, hostileManifest("close-fds", launch("close_fds", 1, 1)), h.hostile)
	r := h.invoke(t, "close-fds", []byte("x"), crashTimeout)
	if r.code == 200 {
		t.Logf("close_fds returned 200 (%.40q): the worker's channel survived", r.body)
	} else {
		expectError(t, r, 500, "worker_crashed", "close-fds")
	}
	h.expectEchoOverride(t, "close-fds", 1)
}

const skipRing = "a kernel in the server process writes to the server's own sockets"

// caseRingTwice: a kernel that writes a forged reply on each of its
// worker's channels before the worker's own reply. The server must not take
// it for the run's reply (the request would be answered before its chain
// ended, and the next with this one's output): the reply does not echo the
// run's sequence number, so the worker is ended and the request is 500
// saying why; the function's next request gets its own bytes.
func caseRingTwice(t *testing.T, h *isoHarness) {
	h.mustDeploy(t, hostileManifest("ring-twice", launch("ring_twice", 1, 1)), h.hostile)
	r := h.invoke(t, "ring-twice", []byte("first"), crashTimeout)
	expectError(t, r, 500, "worker_crashed", "answered out of turn")
	h.expectEchoOverride(t, "ring-twice", 0)
}

// caseRingControl: a kernel that writes a forged reply on its worker's
// control channel alone, then answers its request. The server's next call
// on that channel (here the echo override's kernel lookup) finds a message
// waiting before it asked, ends the worker and looks the kernel up again on
// a fresh one, instead of reading the forgery as the kernel's index.
func caseRingControl(t *testing.T, h *isoHarness) {
	h.mustDeploy(t, hostileManifest("ring-control", launch("ring_control", 1, 1)), h.hostile)
	in := []byte("rang the control channel")
	r := h.invoke(t, "ring-control", in, crashTimeout)
	if r.code != 200 || !bytes.Equal(r.body, padTo(in, hostileOut)) {
		t.Fatalf("ring_control: %d %.100q, want its input echoed", r.code, r.body)
	}
	h.expectEchoOverride(t, "ring-control", 0)
	waitFor(t, 10*time.Second, "the server's log to say why the worker was ended", func() bool {
		return strings.Contains(h.srv.log.String(), "wrote to its control channel out of turn")
	})
}

// caseBackoff: a function whose workers crash backoffAfter times within a
// minute is backed off (503 unavailable saying so and until when), for every
// request, until a redeploy clears it.
func caseBackoff(t *testing.T, h *isoHarness) {
	m := hostileManifest("crashy", launch("segv", 1, 1))
	h.mustDeploy(t, m, h.hostile)
	crashes := 0
	var r isoResp
	for i := 0; i < backoffAfter+3; i++ {
		r = h.invoke(t, "crashy", []byte("again"), crashTimeout)
		if r.code != 500 {
			break
		}
		expectError(t, r, 500, "worker_crashed", "crashy")
		crashes++
	}
	msg := expectError(t, r, 503, "unavailable", "crashy")
	if l := strings.ToLower(msg); !strings.Contains(l, "back-off") && !strings.Contains(l, "backing off") {
		t.Errorf("503 message %q does not say the function is backed off", msg)
	}
	if !regexp.MustCompile(`\d`).MatchString(msg) {
		t.Errorf("503 message %q does not say when the back-off clears", msg)
	}
	if crashes != backoffAfter {
		t.Errorf("backed off after %d crashes, want %d", crashes, backoffAfter)
	}
	t.Logf("after %d crashes: 503 %q (Retry-After %q)", crashes, msg, r.hdr.Get("Retry-After"))
	// The back-off covers the function, not only its manifest chain.
	expectError(t, h.override(t, "crashy", []byte("still off?")), 503, "unavailable", "")

	// A redeploy (a new version) clears it: an echo works at once and the
	// crashing chain crashes again instead of being refused.
	m.MaxQueue = 7 // a different bundle, so certainly a new version
	v := h.mustDeploy(t, m, h.hostile)
	t.Logf("redeployed crashy as version %s", v)
	h.expectEchoOverride(t, "crashy", 0)
	expectError(t, h.invoke(t, "crashy", []byte("crash once more"), crashTimeout), 500, "worker_crashed", "crashy")
}

// deadlineCase: a kernel that never returns (or not for 10 s) with a 500 ms
// deadline gets 504 timeout promptly, and the function keeps serving.
func deadlineCase(name, kernel string) func(t *testing.T, h *isoHarness) {
	return func(t *testing.T, h *isoHarness) {
		h.mustDeploy(t, hostileManifest(name, launch(kernel, 1, 1)), h.hostile)
		r := h.invoke(t, name, []byte("stuck"), 500)
		expectError(t, r, 504, "timeout", "")
		if r.dur > deadlineSlop {
			t.Errorf("504 came after %v; the deadline was 500ms", r.dur)
		}
		t.Logf("504 after %v", r.dur.Round(time.Millisecond))
		h.expectEchoOverride(t, name, 0)
	}
}

// caseDeadlineMany: more stuck requests than max_instances (4); each gets 504
// by its own deadline (running or queued), and the function serves after.
func caseDeadlineMany(t *testing.T, h *isoHarness) {
	m := hostileManifest("spin-many", launch("spin", 1, 1))
	m.MaxInstances, m.MaxQueue = 4, 16
	h.mustDeploy(t, m, h.hostile)
	const n = 6
	res := make([]isoResp, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i] = h.invokeNoFatal("spin-many", []byte(fmt.Sprintf("stuck %d", i)), 500)
		}()
	}
	wg.Wait()
	for i, r := range res {
		if r.err != nil {
			t.Errorf("request %d: %v", i, r.err)
			continue
		}
		expectError(t, r, 504, "timeout", "")
		if r.dur > deadlineSlop {
			t.Errorf("request %d: 504 after %v; the deadline was 500ms", i, r.dur)
		}
	}
	t.Logf("%d stuck requests all answered within %v", n, time.Since(start).Round(time.Millisecond))
	h.expectEchoOverride(t, "spin-many", 0)
}

// caseForkAccept: a kernel forks a child that accepts on every listening
// socket it inherited and answers with a fake healthz. The server's clients
// must only ever reach the server.
func caseForkAccept(t *testing.T, h *isoHarness) {
	h.mustDeploy(t, hostileManifest("fork-accept", launch("fork_accept", 10, 1)), h.hostile)
	r := h.invoke(t, "fork-accept", []byte("fork"), crashTimeout)
	if r.code != 200 {
		t.Fatalf("fork_accept: %d %.300s", r.code, r.body)
	}
	t.Logf("kernel said %q", cstr(r.body))
	// Each probe on a new connection, so each is a new accept() the child
	// could win.
	probe := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for i := 0; i < 20; i++ {
		resp, err := probe.Get(h.srv.url + "/healthz")
		if err != nil {
			t.Fatalf("healthz %d after the fork: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var hz struct {
			Status  string            `json:"status"`
			Devices []json.RawMessage `json:"devices"`
		}
		if resp.StatusCode != 200 || json.Unmarshal(b, &hz) != nil || hz.Status != "ok" || hz.Devices == nil || bytes.Contains(b, []byte("hijacked")) {
			t.Fatalf("healthz %d after the fork answered by someone else: %d %q", i, resp.StatusCode, b)
		}
	}
}

// caseThreads: a kernel leaves 4 spinning threads behind; removing the
// function ends its worker process and all its threads.
func caseThreads(t *testing.T, h *isoHarness) {
	h.mustDeploy(t, hostileManifest("threads", launch("threads", 1, 1)), h.hostile)
	pid := h.pidOf(t, "threads")
	if pid == h.srv.pid {
		t.Fatalf("the kernel ran in the server process (pid %d)", pid)
	}
	if !descendantOf(pid, h.srv.pid) {
		t.Fatalf("pid %d from the kernel is not a process under the server (pid %d): a PID namespace?", pid, h.srv.pid)
	}
	if n := liveTasks(pid); n < 5 {
		t.Fatalf("worker %d has %d live threads, want at least 5 (4 spinning + its own)", pid, n)
	}
	// The threads' CPU is the function's device time, with no run in
	// flight: its one run reported a few milliseconds.
	h.awaitBilled(t, "threads", 0.5)
	run(t, h.bin, []string{"PLOVER_SERVER=" + h.srv.url}, "rm", "threads")
	deadline := time.Now().Add(5 * time.Second)
	for liveTasks(pid) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("worker %d still has %d live threads 5s after rm", pid, liveTasks(pid))
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("worker %d and its threads gone after rm", pid)
	expectError(t, h.invoke(t, "threads", []byte("t"), crashTimeout), 404, "not_found", "")
}

// caseSpawn: a kernel starts a process that spins, orphaned at once as a
// daemon's grandchild is (to its worker's PID namespace's init, or to the
// worker as a child subreaper); its CPU is the function's device time, as
// its worker's threads' is (that it ends with its worker: daemon_test.go).
func caseSpawn(t *testing.T, h *isoHarness) {
	h.mustDeploy(t, hostileManifest("spawn", launch("spawn_spinner", 2, 1)), h.hostile)
	if r := h.invoke(t, "spawn", []byte("x"), crashTimeout); r.code != 200 || !bytes.HasPrefix(r.body, []byte("spawned")) {
		t.Fatalf("spawn: %d %q", r.code, r.body[:min(len(r.body), 64)])
	}
	h.awaitBilled(t, "spawn", 0.5)
	run(t, h.bin, []string{"PLOVER_SERVER=" + h.srv.url}, "rm", "spawn")
}

// awaitBilled waits until function name is billed at least secs of
// device time (20 s at most).
func (h *isoHarness) awaitBilled(t *testing.T, name string, secs float64) {
	t.Helper()
	var fi api.FunctionInfo
	waitFor(t, 20*time.Second, fmt.Sprintf("%g device s billed to %s", secs, name), func() bool {
		getJSON(t, h.client, h.srv.url+"/v1/functions/"+name, &fi)
		return fi.DeviceSeconds >= secs
	})
	t.Logf("%s billed %.2f device s with no run in flight", name, fi.DeviceSeconds)
}

func caseEnv(t *testing.T, h *isoHarness) {
	out := h.envOut(t)
	for _, s := range []string{secretAWS, secretPlover} {
		if strings.Contains(out, s) {
			t.Errorf("the worker's environment contains the server's secret %q", s)
		}
	}
	t.Logf("worker environment: %d variables", strings.Count(out, "\n"))
}

func caseEnvNone(t *testing.T, h *isoHarness) {
	if out := h.envOut(t); !strings.Contains(out, secretAWS) || !strings.Contains(out, secretPlover) {
		t.Errorf("in-process kernel should see the server's environment (the hostile env kernel is broken?): %.300q", out)
	}
}

func (h *isoHarness) envOut(t *testing.T) string {
	h.mustDeploy(t, hostileManifest("env", launch("env", 1, 1)), h.hostile)
	r := h.invoke(t, "env", nil, crashTimeout)
	if r.code != 200 {
		t.Fatalf("env: %d %.300s", r.code, r.body)
	}
	return cstr(r.body)
}

// readFileTargets deploys read-file, plants a secret file in the data
// directory and returns the paths to try with their content, or "" when the
// content is not known (the store record).
func (h *isoHarness) readFileTargets(t *testing.T) map[string]string {
	h.mustDeploy(t, hostileManifest("read-file", launch("read_file", 1, 1)), h.hostile)
	secret := filepath.Join(h.srv.data, "plover-file-secret.txt")
	content := "plover-file-secret " + randHex(8)
	if err := os.WriteFile(secret, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	record := filepath.Join(h.srv.data, "store", "functions", "read-file.json")
	if _, err := os.Stat(record); err != nil {
		t.Fatalf("the store record is not where the test expects it: %v", err)
	}
	return map[string]string{
		secret: content,
		record: "",
		fmt.Sprintf("/proc/%d/root%s", h.srv.pid, secret): content,
	}
}

func caseReadFile(t *testing.T, h *isoHarness) {
	for path := range h.readFileTargets(t) {
		out := h.readFile(t, path)
		if !strings.HasPrefix(out, "ERR") {
			t.Errorf("the worker read %s: %.100q", path, out)
		} else {
			t.Logf("%s: %s", path, out)
		}
	}
}

func caseReadFileNone(t *testing.T, h *isoHarness) {
	for path, content := range h.readFileTargets(t) {
		out := h.readFile(t, path)
		if strings.HasPrefix(out, "ERR") || (content != "" && !strings.HasPrefix(out, content)) {
			t.Errorf("in-process kernel should read %s (the hostile read_file kernel is broken?): %.100q", path, out)
		}
	}
}

func (h *isoHarness) readFile(t *testing.T, path string) string {
	r := h.invoke(t, "read-file", []byte(path), crashTimeout)
	if r.code != 200 {
		t.Fatalf("read_file %s: %d %.300s", path, r.code, r.body)
	}
	return cstr(r.body)
}

// caseReadServerEnviron: the server's environment must not be reachable
// through /proc either (a worker running as the server's user could read
// /proc/SERVER/environ).
func caseReadServerEnviron(t *testing.T, h *isoHarness) {
	h.mustDeploy(t, hostileManifest("read-environ", launch("read_file", 1, 1)), h.hostile)
	path := fmt.Sprintf("/proc/%d/environ", h.srv.pid)
	r := h.invoke(t, "read-environ", []byte(path), crashTimeout)
	if r.code != 200 {
		t.Fatalf("read_file %s: %d %.300s", path, r.code, r.body)
	}
	for _, s := range []string{secretAWS, secretPlover} {
		if bytes.Contains(r.body, []byte(s)) {
			t.Errorf("a worker read the secret %q from %s", s, path)
		}
	}
	t.Logf("%s: %.60q", path, cstr(r.body))
}

// memscanInput is the marker as memscan takes it (every byte XOR 0x5A), so
// no copy of memscan's own request contains the marker itself.
func memscanInput(marker []byte) []byte {
	in := make([]byte, len(marker))
	for i, b := range marker {
		in[i] = b ^ 0x5A
	}
	return in
}

// memscanSetup deploys A (echo) and B (memscan), checks that B's scanner
// finds a planted copy (a self-test), has A echo a fresh 32-byte marker and
// returns what B finds of it.
func (h *isoHarness) memscanSetup(t *testing.T) string {
	h.mustDeploy(t, hostileManifest("memscan-a", launch("echo", 1, 64)), h.hostile)
	h.mustDeploy(t, hostileManifest("memscan", launch("memscan", 1, 1)), h.hostile)
	marker := make([]byte, 32)
	rand.Read(marker)
	if r := h.invoke(t, "memscan-a", marker, crashTimeout); r.code != 200 || !bytes.HasPrefix(r.body, marker) {
		t.Fatalf("function A echo of the marker: %d", r.code)
	}
	r := h.invoke(t, "memscan", memscanInput(marker), crashTimeout)
	if r.code != 200 {
		t.Fatalf("memscan: %d %.300s", r.code, r.body)
	}
	// The self-test runs after the real scan (and wipes its planted copy), so
	// it cannot be what the real scan found.
	other := make([]byte, 32)
	rand.Read(other)
	self := h.overrideChain(t, "memscan", memscanInput(other), launch("memscan", 2, 1))
	if self.code != 200 || cstr(self.body) != "FOUND" {
		t.Fatalf("memscan self-test (a planted copy) should be FOUND: %d %.100q", self.code, self.body)
	}
	return cstr(r.body)
}

func caseMemscan(t *testing.T, h *isoHarness) {
	if got := h.memscanSetup(t); got != "NOTFOUND" {
		t.Errorf("function B scanned its memory for A's request bytes: %q, want NOTFOUND", got)
	}
}

func caseMemscanNone(t *testing.T, h *isoHarness) {
	// Not asserted: whether A's request bytes are still in the shared
	// process's buffers depends on buffer reuse.
	t.Logf("in process: B looking for A's marker: %s", h.memscanSetup(t))
}

// caseCtorCrash: a library whose constructor segfaults, with min_instances 1
// so the server loads it at deploy (and again at every start). The server
// survives the deploy and answers invokes with worker_crashed or, once backed
// off, unavailable; restartAfterCtor then restarts the server on the same
// data directory.
func caseCtorCrash(t *testing.T, h *isoHarness) {
	m := hostileManifest("ctor", launch("echo", 1, 64))
	m.Library = "hostile_ctor.so"
	m.MinInstances = 1
	code, body := h.deploy(t, m, h.ctor)
	t.Logf("deploy of the crashing constructor: %d %.300s", code, body)
	h.ctorUsed = true
	h.srv.mustBeHealthy(t, "after deploying the crashing constructor")
	h.expectCtorRefused(t)
}

func (h *isoHarness) expectCtorRefused(t *testing.T) {
	r := h.invoke(t, "ctor", []byte("x"), crashTimeout)
	switch r.code {
	case 500:
		expectError(t, r, 500, "worker_crashed", "ctor")
	case 503:
		expectError(t, r, 503, "unavailable", "")
	default:
		t.Fatalf("invoke of the crashing constructor: %d %.300s, want 500 worker_crashed or 503 unavailable", r.code, r.body)
	}
}

// restartAfterCtor restarts the server on the same data directory, with
// the crashing min_instances function in its store: it must come up, serve
// the good function and keep refusing the bad one without a crash loop.
func (h *isoHarness) restartAfterCtor(t *testing.T) {
	h.srv.stop(t)
	h.srv = startIsoServer(t, h.bin, h.srv.data, h.env, h.args...)
	t.Logf("restarted: pid %d at %s", h.srv.pid, h.srv.url)
	h.srv.mustBeHealthy(t, "after restart")
	for i := 0; i < 20; i++ {
		in := []byte(fmt.Sprintf("after restart %d %s", i, randHex(4)))
		r := h.invoke(t, goodName, in, crashTimeout)
		if r.code != 200 || !bytes.Equal(r.body, padTo(in, 256)) {
			t.Fatalf("good function after restart: %d %.100q", r.code, r.body)
		}
	}
	h.expectCtorRefused(t)
	h.srv.mustBeHealthy(t, "after invoking the crashing constructor post-restart")
}

// ---- deploy and invoke -----------------------------------------------------

func launch(kernel string, grid, block int) abi.Launch {
	return abi.Launch{Kernel: kernel, Grid: grid, Block: block}
}

func hostileManifest(name string, chain ...abi.Launch) *abi.Manifest {
	return &abi.Manifest{Name: name, ABI: abi.Major, Target: abi.TargetHost, Library: "hostile.so",
		MaxInputBytes: 1 << 16, TmpBytes: 64, OutBytes: hostileOut, Chain: chain}
}

// deploy PUTs a bundle of m and lib; it returns the status and body.
func (h *isoHarness) deploy(t *testing.T, m *abi.Manifest, lib string) (int, []byte) {
	t.Helper()
	dir := t.TempDir()
	b, err := os.ReadFile(lib)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, m.Library), b, 0o755); err != nil {
		t.Fatal(err)
	}
	testkit.WriteManifest(t, dir, m)
	return h.deployDir(t, dir)
}

func (h *isoHarness) deployDir(t *testing.T, dir string) (int, []byte) {
	t.Helper()
	packed, _, m, err := bundle.PackBytes(dir)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPut, h.srv.url+"/v1/functions/"+m.Name, bytes.NewReader(packed))
	req.Header.Set("Content-Type", bundle.MediaType)
	resp, err := h.client.Do(req)
	if err != nil {
		t.Fatalf("deploy %s: %v", m.Name, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, body
}

// mustDeploy deploys and returns the new version.
func (h *isoHarness) mustDeploy(t *testing.T, m *abi.Manifest, lib string) string {
	t.Helper()
	return deployed(t, m.Name)(h.deploy(t, m, lib))
}

func (h *isoHarness) mustDeployDir(t *testing.T, dir string) string {
	t.Helper()
	return deployed(t, filepath.Base(dir))(h.deployDir(t, dir))
}

func deployed(t *testing.T, what string) func(int, []byte) string {
	return func(code int, body []byte) string {
		t.Helper()
		var fi struct {
			Version string `json:"version"`
		}
		if code != 201 || json.Unmarshal(body, &fi) != nil {
			t.Fatalf("deploy %s: %d %.300s", what, code, body)
		}
		return fi.Version
	}
}

type isoResp struct {
	code int
	body []byte
	hdr  http.Header
	dur  time.Duration
	err  error
}

// invokeNoFatal posts in as application/octet-stream, with a deadline
// header when timeoutMs > 0. Safe from any goroutine.
func (h *isoHarness) invokeNoFatal(name string, in []byte, timeoutMs int) isoResp {
	req, _ := http.NewRequest(http.MethodPost, h.srv.url+"/v1/functions/"+name+"/invoke", bytes.NewReader(in))
	req.Header.Set("Content-Type", "application/octet-stream")
	if timeoutMs > 0 {
		req.Header.Set("X-Plover-Timeout-Ms", strconv.Itoa(timeoutMs))
	}
	return h.do(req, timeoutMs)
}

// do sends req; the client gives up 4.5 s after the request's own deadline
// (timeoutMs, else 15.5 s), so a server that ignores deadlines fails the
// case in bounded time instead of stalling the battery.
func (h *isoHarness) do(req *http.Request, timeoutMs int) isoResp {
	if timeoutMs <= 0 {
		timeoutMs = 11_000
	}
	ctx, cancel := context.WithTimeout(req.Context(), time.Duration(timeoutMs)*time.Millisecond+4500*time.Millisecond)
	defer cancel()
	req = req.WithContext(ctx)
	start := time.Now()
	resp, err := h.client.Do(req)
	if err != nil {
		return isoResp{err: err, dur: time.Since(start)}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return isoResp{code: resp.StatusCode, body: body, hdr: resp.Header, dur: time.Since(start), err: err}
}

func (h *isoHarness) invoke(t *testing.T, name string, in []byte, timeoutMs int) isoResp {
	t.Helper()
	r := h.invokeNoFatal(name, in, timeoutMs)
	if r.err != nil {
		t.Fatalf("invoke %s: %v (after %v)", name, r.err, r.dur)
	}
	return r
}

// overrideChain invokes name through the JSON shape with a per-request chain
// and out_bytes overrideOut; body is the decoded output on 200, the error
// JSON otherwise.
func (h *isoHarness) overrideChain(t *testing.T, name string, in []byte, chain ...abi.Launch) isoResp {
	t.Helper()
	reqBody, _ := json.Marshal(map[string]any{"input": base64.StdEncoding.EncodeToString(in), "chain": chain,
		"out_bytes": overrideOut, "timeout_ms": crashTimeout})
	req, _ := http.NewRequest(http.MethodPost, h.srv.url+"/v1/functions/"+name+"/invoke", bytes.NewReader(reqBody))
	req.Header.Set("Content-Type", "application/json")
	r := h.do(req, crashTimeout)
	if r.err != nil {
		t.Fatalf("invoke %s (chain override): %v", name, r.err)
	}
	if r.code == 200 {
		var out struct {
			Output []byte `json:"output"`
		}
		if err := json.Unmarshal(r.body, &out); err != nil {
			t.Fatalf("invoke %s (chain override): bad JSON %v: %.200q", name, err, r.body)
		}
		r.body = out.Output
	}
	return r
}

func (h *isoHarness) override(t *testing.T, name string, in []byte) isoResp {
	t.Helper()
	return h.overrideChain(t, name, in, launch("echo", 1, 64))
}

// expectEchoOverride: the function serves a well-behaved chain (its
// library's echo) correctly; up to allowCrashes worker_crashed answers may
// come first.
func (h *isoHarness) expectEchoOverride(t *testing.T, name string, allowCrashes int) {
	t.Helper()
	for i := 0; ; i++ {
		in := []byte("recovered? " + randHex(8))
		r := h.override(t, name, in)
		if r.code == 200 {
			if !bytes.Equal(r.body, padTo(in, overrideOut)) {
				t.Fatalf("%s echo override: wrong bytes %.100q", name, r.body)
			}
			return
		}
		if i < allowCrashes && r.code == 500 && apiErrorOf(r.body).Code == "worker_crashed" {
			t.Logf("%s: echo override met the damaged worker first: %s", name, r.body)
			continue
		}
		t.Fatalf("%s does not serve after the hostile request: echo override got %d %.300s", name, r.code, r.body)
	}
}

type apiError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func apiErrorOf(body []byte) apiError {
	var e struct {
		Error apiError `json:"error"`
	}
	json.Unmarshal(body, &e)
	return e.Error
}

// expectError checks an error answer's status and code, and that its
// message names mention (when set); it returns the message.
func expectError(t *testing.T, r isoResp, status int, code, mention string) string {
	t.Helper()
	e := apiErrorOf(r.body)
	if r.code != status || e.Code != code {
		t.Fatalf("got %d %.300s, want %d %s", r.code, r.body, status, code)
	}
	if mention != "" && !strings.Contains(e.Message, mention) {
		t.Errorf("%s message %q does not name %q", code, e.Message, mention)
	}
	return e.Message
}

// ---- the server process ----------------------------------------------------

// isoServer is a `plover serve` process whose exit is observed.
type isoServer struct {
	url, data string
	pid       int
	cmd       *exec.Cmd
	log       *lockedBuf
	exited    chan struct{}
	waitErr   error
	stopOnce  sync.Once
}

type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) add(s string) { l.mu.Lock(); l.b.WriteString(s + "\n"); l.mu.Unlock() }
func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startIsoServer starts `plover serve` on a free port with data and extra
// environment; unlike startServer, stderr goes through an os.Pipe (so a
// worker's stray child holding it open delays nothing) and the exit is
// watched, so a case can tell that the server died.
func startIsoServer(t *testing.T, bin, data string, env []string, args ...string) *isoServer {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"serve", "--listen", "127.0.0.1:0", "--data", data, "--device", "host"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	return startIsoCmd(t, cmd, data)
}

// startIsoCmd starts cmd, a `plover serve` on a free port with data (or a
// wrapper that execs one, so that the process is the server), and watches
// it as startIsoServer does.
func startIsoCmd(t *testing.T, cmd *exec.Cmd, data string) *isoServer {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	s := &isoServer{data: data, pid: cmd.Process.Pid, cmd: cmd, log: &lockedBuf{}, exited: make(chan struct{})}
	go func() { s.waitErr = cmd.Wait(); close(s.exited) }()
	addrRE := regexp.MustCompile(`addr=(https?://127\.0\.0\.1:\d+)`)
	found := make(chan string, 1)
	go func() {
		defer r.Close()
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		sent := false
		for sc.Scan() {
			s.log.add(sc.Text())
			if m := addrRE.FindStringSubmatch(sc.Text()); m != nil && !sent {
				found <- m[1]
				sent = true
			}
		}
	}()
	t.Cleanup(func() {
		s.stop(t)
		if t.Failed() {
			t.Logf("server (pid %d) log:\n%s", s.pid, s.log)
		}
	})
	select {
	case s.url = <-found:
	case <-s.exited:
		t.Fatalf("plover serve exited at start (%v):\n%s", s.waitErr, s.log)
	case <-time.After(20 * time.Second):
		t.Fatalf("plover serve did not report its address:\n%s", s.log)
	}
	return s
}

// waitLog waits, bounded, until the server's log holds text.
func (s *isoServer) waitLog(t *testing.T, text string) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !strings.Contains(s.log.String(), text); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the server never logged %q:\n%s", text, s.log)
		}
	}
}

// stop sends SIGINT and waits for the exit (killing after 15 s).
func (s *isoServer) stop(t *testing.T) {
	s.stopOnce.Do(func() {
		s.cmd.Process.Signal(os.Interrupt)
		select {
		case <-s.exited:
		case <-time.After(15 * time.Second):
			t.Errorf("server pid %d did not stop within 15s of SIGINT; killing it", s.pid)
			s.cmd.Process.Kill()
			<-s.exited
		}
	})
}

// mustBeHealthy: the same server process is still running and /healthz is
// 200 with status ok.
func (s *isoServer) mustBeHealthy(t *testing.T, when string) {
	t.Helper()
	select {
	case <-s.exited:
		t.Fatalf("%s: the server (pid %d) exited: %v", when, s.pid, s.waitErr)
	default:
	}
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(s.url + "/healthz")
	if err != nil {
		select { // a server that just died: say how
		case <-s.exited:
			t.Fatalf("%s: the server (pid %d) exited: %v (healthz: %v)", when, s.pid, s.waitErr, err)
		case <-time.After(time.Second):
		}
		t.Fatalf("%s: healthz: %v", when, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Contains(b, []byte(`"status":"ok"`)) {
		t.Fatalf("%s: healthz %d %.200q", when, resp.StatusCode, b)
	}
}

// ---- the background load ---------------------------------------------------

// loadLoop invokes a well-behaved echo function with distinct payloads until
// stopped, maxDur passes or maxN requests were made, and records every answer
// that is not 200 with exactly the echoed bytes.
type loadLoop struct {
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once
	n     atomic.Int64
	mu    sync.Mutex
	fails []string
}

func startLoad(url, name string, maxDur time.Duration, maxN int) *loadLoop {
	return startLoadAs(&http.Client{Timeout: 15 * time.Second}, url, name, maxDur, maxN)
}

// startLoadAs is startLoad through client (a tenant's token).
func startLoadAs(client *http.Client, url, name string, maxDur time.Duration, maxN int) *loadLoop {
	l := &loadLoop{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		end := time.Now().Add(maxDur)
		tick := time.NewTicker(4 * time.Millisecond)
		defer tick.Stop()
		for i := 0; i < maxN && time.Now().Before(end); i++ {
			select {
			case <-l.stop:
				return
			case <-tick.C:
			}
			in := []byte(fmt.Sprintf("load %d %s", i, strings.Repeat(string(rune('a'+i%26)), i%200)))
			l.n.Add(1)
			resp, err := client.Post(url+"/v1/functions/"+name+"/invoke", "application/octet-stream", bytes.NewReader(in))
			var fail string
			if err != nil {
				fail = fmt.Sprintf("request %d: %v", i, err)
			} else {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || !bytes.Equal(b, padTo(in, 256)) {
					fail = fmt.Sprintf("request %d: %d %.120q", i, resp.StatusCode, b)
				}
			}
			if fail != "" {
				l.mu.Lock()
				l.fails = append(l.fails, fail)
				l.mu.Unlock()
			}
		}
	}()
	return l
}

// waitCount waits until the loop has made n requests (or stopped by itself).
func (l *loadLoop) waitCount(t *testing.T, n int64, d time.Duration) {
	deadline := time.Now().Add(d)
	for l.n.Load() < n && time.Now().Before(deadline) {
		select {
		case <-l.done:
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func (l *loadLoop) stopAndWait() (int64, []string) {
	l.once.Do(func() { close(l.stop) })
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n.Load(), l.fails
}

// ---- small helpers ---------------------------------------------------------

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func padTo(b []byte, n int) []byte {
	out := make([]byte, n)
	copy(out, b)
	return out
}

// cstr is b up to its first NUL.
func cstr(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// procStat returns the state and parent pid of /proc/PID/stat (or
// /proc/PID/task/TID/stat).
func procStat(path string) (state byte, ppid int, ok bool) {
	f := statFields(path)
	if len(f) < 2 {
		return 0, 0, false
	}
	ppid, _ = strconv.Atoi(f[1])
	return f[0][0], ppid, true
}

// statFields are the fields of a /proc stat file after the process's name
// (which may hold anything): the state (field 3) first.
func statFields(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(string(b[i+1:]))
}

func descendantOf(pid, ancestor int) bool {
	for i := 0; i < 64 && pid > 1; i++ {
		_, ppid, ok := procStat(fmt.Sprintf("/proc/%d/stat", pid))
		if !ok {
			return false
		}
		if ppid == ancestor {
			return true
		}
		pid = ppid
	}
	return false
}

// liveTasks counts the threads of pid that are neither zombies nor dead (0
// once the process is gone or only its zombie is left).
func liveTasks(pid int) int {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range ents {
		st, _, ok := procStat(fmt.Sprintf("/proc/%d/task/%s/stat", pid, e.Name()))
		if ok && st != 'Z' && st != 'X' {
			n++
		}
	}
	return n
}

// caseSignalOthers: a worker can signal neither the server nor another
// function's worker (Landlock scopes signals to the worker's own domain;
// uid separation alone would not, since all workers share --worker-user).
func caseSignalOthers(t *testing.T, h *isoHarness) {
	if abi := contain.LandlockABI(); abi < 6 {
		t.Skipf("this kernel's Landlock (ABI %d) cannot scope signals (ABI 6)", abi)
	}
	h.mustDeploy(t, hostileManifest("whoami", launch("whoami", 1, 1)), h.hostile)
	h.mustDeploy(t, hostileManifest("signaller", launch("signal_pid", 1, 1)), h.hostile)
	victim := strconv.Itoa(h.pidOf(t, "whoami"))
	for _, target := range []struct{ what, pid string }{
		{"the server", strconv.Itoa(h.srv.pid)},
		{"another function's worker", victim},
	} {
		r := h.invoke(t, "signaller", []byte(target.pid), crashTimeout)
		if r.code != 200 || !strings.HasPrefix(cstr(r.body), "ERR") {
			t.Errorf("SIGKILL to %s (pid %s): %d %q, want the kernel to refuse", target.what, target.pid, r.code, cstr(r.body))
		}
	}
	if pid := strconv.Itoa(h.pidOf(t, "whoami")); pid != victim {
		t.Errorf("the other function's worker changed: %s, was %s", pid, victim)
	}
}

// caseConnectTCP: a worker cannot open TCP connections, not even to the
// server it runs under: its seccomp filter refuses it IP sockets, and
// Landlock (from its ABI 4) TCP connect.
func caseConnectTCP(t *testing.T, h *isoHarness) {
	h.mustDeploy(t, hostileManifest("connect", launch("connect_tcp", 1, 1)), h.hostile)
	addr := strings.TrimPrefix(h.srv.url, "http://")
	r := h.invoke(t, "connect", []byte(addr), crashTimeout)
	if abi := contain.LandlockABI(); abi < 4 && !h.workerFiltered(t, "connect") {
		t.Skipf("this kernel has no seccomp filters and its Landlock (ABI %d) no TCP rules (ABI 4)", abi)
	}
	if r.code != 200 || !strings.HasPrefix(cstr(r.body), "ERR") {
		t.Errorf("connect to %s from a worker: %d %q, want the kernel to refuse", addr, r.code, cstr(r.body))
	}
}

// caseSendUDP: a worker cannot send a datagram, not even to this machine's
// loopback: Landlock has no UDP rule and a worker shares the server's
// network, so it is the seccomp filter, which refuses it every socket
// family but Unix's and netlink, that keeps it off the network.
func caseSendUDP(t *testing.T, h *isoHarness) {
	l := listenUDP(t)
	h.mustDeploy(t, hostileManifest("send-udp", launch("send_udp", 1, 1)), h.hostile)
	r := h.invoke(t, "send-udp", []byte(l.LocalAddr().String()), crashTimeout)
	if !h.workerFiltered(t, "send-udp") {
		t.Skip("this kernel has no seccomp filters: a worker can send UDP")
	}
	if r.code != 200 || cstr(r.body) != "ERR EPERM" {
		t.Errorf("UDP to %s from a worker: %d %q, want the filter to refuse its socket (ERR EPERM)", l.LocalAddr(), r.code, cstr(r.body))
	}
	if got := udpBefore(t, l); len(got) > 0 {
		t.Errorf("the listener received %q from the worker", got)
	}
}

// caseSendUDPNone: an in-process kernel sends the datagram, which the
// listener receives (the send_udp kernel works).
func caseSendUDPNone(t *testing.T, h *isoHarness) {
	l := listenUDP(t)
	h.mustDeploy(t, hostileManifest("send-udp", launch("send_udp", 1, 1)), h.hostile)
	r := h.invoke(t, "send-udp", []byte(l.LocalAddr().String()), crashTimeout)
	if r.code != 200 || cstr(r.body) != "OK" {
		t.Fatalf("in-process kernel should send to %s (the hostile send_udp kernel is broken?): %d %q", l.LocalAddr(), r.code, cstr(r.body))
	}
	if got := udpBefore(t, l); len(got) != 1 || got[0] != "plover-udp" {
		t.Errorf("the listener received %q, want the kernel's one datagram", got)
	}
}

func listenUDP(t *testing.T) net.PacketConn {
	t.Helper()
	l, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// udpBefore sends l a marker datagram of its own and returns what l
// received before it. Called once a kernel's sendto has returned, so that
// what it sent is queued ahead of the marker: loopback delivers a datagram
// in the softirq that runs as the sender's sendto leaves the network stack
// (unless softirqs are pushed off to ksoftirqd, when it could come later and
// go unseen here; the request's own answer says whether it sent one).
func udpBefore(t *testing.T, l net.PacketConn) []string {
	t.Helper()
	c, err := net.Dial("udp4", l.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	marker := "marker-" + randHex(8)
	if _, err := c.Write([]byte(marker)); err != nil {
		t.Fatal(err)
	}
	l.SetReadDeadline(time.Now().Add(10 * time.Second)) // only turns a lost marker into a failure
	var got []string
	buf := make([]byte, 2048)
	for {
		n, _, err := l.ReadFrom(buf)
		if err != nil {
			t.Fatalf("waiting for the marker datagram: %v (received before it: %q)", err, got)
		}
		if string(buf[:n]) == marker {
			return got
		}
		got = append(got, string(buf[:n]))
	}
}

// workerFiltered reports whether name's workers run under a seccomp filter
// (/proc/PID/status "Seccomp: 2"), the reach filter a worker installs
// where the kernel has filters. Call it once name has been invoked.
func (h *isoHarness) workerFiltered(t *testing.T, name string) bool {
	t.Helper()
	ws := h.functionView(t, name).Workers
	if len(ws) == 0 {
		t.Fatalf("%s has no workers", name)
	}
	for _, w := range ws {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", w.PID))
		if err != nil {
			t.Fatal(err)
		}
		if !regexp.MustCompile(`(?m)^Seccomp:\s+2$`).Match(b) {
			return false
		}
	}
	return true
}

// caseMemoryLimit: a worker past its max_host_memory_mb is killed while the
// request runs, and the request says why.
func caseMemoryLimit(t *testing.T, h *isoHarness) {
	m := hostileManifest("hog", launch("hog_memory", 256, 300))
	m.MaxHostMemoryMB = 64
	h.mustDeploy(t, m, h.hostile)
	expectError(t, h.invoke(t, "hog", []byte("x"), 10000), 500, "worker_crashed", "max_host_memory_mb")
	// Within the limit it runs.
	r := h.overrideChain(t, "hog", []byte("x"), launch("hog_memory", 8, 1))
	if r.code != 200 {
		t.Fatalf("8 MiB under a 64 MiB limit: %d %.300s", r.code, r.body)
	}
}

// caseMemoryTree: where cgroups can be written, a worker's memory cgroup
// counts what its resident-memory check cannot see (here a memfd it never
// maps, 256 MiB under a limit of 64): the kernel kills it, and the request
// says why.
func caseMemoryTree(t *testing.T, h *isoHarness) {
	// Whether the server's workers have memory groups is the server's to
	// find (a read-only cgroupfs, v2 without CPU groups: none), and it
	// says so as it starts.
	if !strings.Contains(h.srv.log.String(), "backed by a memory cgroup per worker") {
		t.Skip("the server's workers have no memory cgroups here (its log says none): the worker's own resident memory alone is checked")
	}
	m := hostileManifest("hider", launch("hide_memory", 256, 1))
	m.MaxHostMemoryMB = 64
	h.mustDeploy(t, m, h.hostile)
	msg := expectError(t, h.invoke(t, "hider", []byte("x"), crashTimeout), 500, "worker_crashed", "max_host_memory_mb")
	t.Logf("hider: %s", msg)
	if !strings.Contains(msg, "OOM killer in its memory cgroup") {
		t.Errorf("worker_crashed message %q does not say its memory cgroup's OOM killer ended it", msg)
	}
}

// caseAccounting: the function view, /metrics and plover ls show the
// worker's real pid, resident memory and threads.
func caseAccounting(t *testing.T, h *isoHarness) {
	h.mustDeploy(t, hostileManifest("acct", launch("whoami", 1, 1)), h.hostile)
	pid := h.pidOf(t, "acct")
	fi := h.functionView(t, "acct")
	if len(fi.Workers) != 1 || fi.Workers[0].PID != pid || fi.Workers[0].Resident < 1<<20 || fi.Workers[0].Threads < 2 || fi.Workers[0].Device == "" {
		t.Fatalf("workers %+v, want one on a named device with pid %d, at least 1 MiB resident and 2 threads", fi.Workers, pid)
	}
	// Shared pages (the binary, libraries) count divided in PSS: less than
	// RSS, more than nothing.
	if w := fi.Workers[0]; w.PSS <= 0 || w.PSS > w.Resident {
		t.Errorf("worker PSS %d with %d resident: want 0 < PSS <= RSS", w.PSS, w.Resident)
	}
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err == nil && filepath.Base(exe) != "plover-worker" {
		t.Errorf("the worker runs %s, want plover-worker (built beside plover)", exe)
	}
	resp, err := h.client.Get(h.srv.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	var metrics bytes.Buffer
	metrics.ReadFrom(resp.Body)
	resp.Body.Close()
	for _, series := range []string{"plover_worker_resident_bytes{", "plover_worker_pss_bytes{", "plover_worker_threads{"} {
		if !strings.Contains(metrics.String(), series+`device=`) || !strings.Contains(metrics.String(), `function="acct"}`) {
			t.Errorf("/metrics has no %s series for acct's worker", series)
		}
	}
	if ls := run(t, h.bin, []string{"PLOVER_SERVER=" + h.srv.url}, "ls", "-o", "wide"); !strings.Contains(ls, strconv.Itoa(pid)+" ") {
		t.Errorf("plover ls does not show worker %d:\n%s", pid, ls)
	}
}

// caseCtorHang: a library whose constructor never returns. The request's
// deadline bounds the load (504 at the deadline, the worker killed), and
// the function keeps answering so rather than wedging.
func caseCtorHang(t *testing.T, h *isoHarness) {
	lib := testkit.BuildLib(t, testkit.HostileCtorSource(), t.TempDir(), "hang.so", "-DPLOVER_CTOR_HANG")
	h.mustDeploy(t, hostileManifest("ctor-hang", launch("echo", 1, 64)), lib)
	for i := 0; i < 2; i++ {
		t0 := time.Now()
		expectError(t, h.invoke(t, "ctor-hang", []byte("x"), 500), 504, "timeout", "loading")
		if d := time.Since(t0); d > 3*time.Second {
			t.Errorf("504 after %v, want about the 500 ms deadline", d)
		}
	}
}

// pidOf invokes name, whose chain writes the pid of the process it runs in
// as that process's /proc says (whoami, threads; in the PID namespace of
// its worker, its pid there), and returns the pid on this machine of the
// function's worker that ran it: the one whose NSpid ends with that pid.
func (h *isoHarness) pidOf(t *testing.T, name string) int {
	t.Helper()
	r := h.invoke(t, name, []byte("?"), crashTimeout)
	if r.code != 200 {
		t.Fatalf("%s: %d %.300s", name, r.code, r.body)
	}
	inner, err := strconv.Atoi(cstr(r.body))
	if err != nil {
		t.Fatalf("%s wrote %q, not a pid", name, cstr(r.body))
	}
	fi := h.functionView(t, name)
	for _, w := range fi.Workers {
		if ns := nsPIDs(w.PID); len(ns) > 0 && ns[len(ns)-1] == inner {
			return w.PID
		}
	}
	t.Fatalf("%s ran in pid %d, which is none of its workers %+v", name, inner, fi.Workers)
	return 0
}

// funcView is the part of GET /v1/functions/NAME the tests read.
type funcView struct {
	Workers []struct {
		Device   string `json:"device"`
		PID      int    `json:"pid"`
		Resident int64  `json:"resident_bytes"`
		PSS      int64  `json:"pss_bytes"`
		Threads  int    `json:"threads"`
	} `json:"workers"`
}

func (h *isoHarness) functionView(t *testing.T, name string) funcView {
	t.Helper()
	resp, err := h.client.Get(h.srv.url + "/v1/functions/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var fi funcView
	if err := json.NewDecoder(resp.Body).Decode(&fi); err != nil {
		t.Fatal(err)
	}
	return fi
}

// nsPIDs is the NSpid line of /proc/PID/status: the process's pid in this
// machine's namespace first, then in each nested one (nil: gone).
func nsPIDs(pid int) []int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			var ids []int
			for _, f := range strings.Fields(rest) {
				if v, err := strconv.Atoi(f); err == nil {
					ids = append(ids, v)
				}
			}
			return ids
		}
	}
	return []int{pid} // a kernel without NSpid (before 4.1): no namespaces
}
