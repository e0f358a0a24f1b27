package main_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/internal/testkit"
)

// TestSIGTERMClosesConnectionsWithoutRequests: connections that hold no
// request (opened and silent, as a browser's preconnect or a load
// balancer's pool, on the API and on --metrics-listen) are closed as the
// server drains: the in-flight request is answered, the server exits as
// soon as it is, and it cleans up after itself (engine, devices, its
// workers' cgroups) rather than leaving them to the end of --grace as if
// requests still ran.
func TestSIGTERMClosesConnectionsWithoutRequests(t *testing.T) {
	const grace = 8 * time.Second
	srv := servedWithGrace(t, grace, testkit.Slow("slow", 800), "--metrics-listen", "127.0.0.1:0")
	metrics := srv.metrics
	invokeHTTP(srv.url, "slow", []byte("warm"))
	dial(t, strings.TrimPrefix(srv.url, "http://"))
	dial(t, metrics)

	res := invokeInFlight(t, srv, "slow", []byte("drain me"))
	start := time.Now()
	srv.cmd.Process.Signal(syscall.SIGTERM)
	(<-res).echoed(t, []byte("drain me"), "during shutdown")
	stoppedWithin(t, srv, exited(t, srv, start, grace+5*time.Second), grace/2)
}

// TestSIGTERMGraceEndsSlowClients: a client sending its headers a byte
// at a time, and one that does not read its answer, hold connections the
// drain leaves to the end of --grace (their requests had begun); then
// they are closed, and the server, with no request running, exits within
// its bound and cleans up after itself.
func TestSIGTERMGraceEndsSlowClients(t *testing.T) {
	const grace = 4 * time.Second
	m := testkit.Manifest("big")
	m.MaxInputBytes, m.OutBytes = 64<<20, 64<<20
	srv := servedWithGrace(t, grace, m)
	addr := strings.TrimPrefix(srv.url, "http://")

	send(t, dial(t, addr), []byte("GET /v1/functions HTTP/1.1\r\nHo"))
	deaf := dial(t, addr)
	deaf.(*net.TCPConn).SetReadBuffer(4 << 10)
	in := make([]byte, 64<<20)
	send(t, deaf, append(fmt.Appendf(nil, "POST /v1/functions/big/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n", len(in)), in...))
	// Its run is over (the instance idle again): its answer is being
	// written to a client that does not read it.
	waitFor(t, 10*time.Second, "the run to end", func() bool { return metric(t, srv.url, `plover_instances{function="big",state="idle"}`) >= 1 })
	start := time.Now()
	srv.cmd.Process.Signal(syscall.SIGTERM)
	stoppedWithin(t, srv, exited(t, srv, start, 3*grace), grace+2*time.Second)
}

// TestSIGTERMEndsUnfinishedGRPCHandshakes: a connection to --grpc-listen
// that never finishes its handshake (silent, or part of the HTTP/2
// preface) is ended as the server drains: gRPC-Go's Stop and GracefulStop
// wait for every handshake in progress (up to its connection timeout,
// two minutes) before they even tell the other clients to go away, which
// held the exit past any --grace.
func TestSIGTERMEndsUnfinishedGRPCHandshakes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	bin := buildPlover(t)
	const grace = 6 * time.Second
	srv := startServer(t, bin, "--grace", grace.String(), "--grpc-listen", "127.0.0.1:0")
	grpcListen := srv.grpc
	dial(t, grpcListen)
	send(t, dial(t, grpcListen), []byte("PRI * HTTP/2.0\r\n"))
	waitFor(t, 10*time.Second, "the server to count both connections", func() bool { return metric(t, srv.url, "plover_connections_open") >= 2 })
	start := time.Now()
	srv.cmd.Process.Signal(syscall.SIGTERM)
	stoppedWithin(t, srv, exited(t, srv, start, 3*grace), grace/2)
}

// TestSIGTERMFinishesInFlightDeploy: a deploy whose bundle is still
// arriving when the drain begins is finished, as an invoke is: the
// control plane's calls took fasthttp's request context, which the
// shutdown cancels at once.
func TestSIGTERMFinishesInFlightDeploy(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	bin := buildPlover(t)
	srv := startServer(t, bin, "--grace", "10s")
	b, _, _, err := bundle.PackBytes(testkit.BundleDir(t, testkit.Manifest("late"), nil))
	if err != nil {
		t.Fatal(err)
	}
	// The count includes the connection metric itself keeps open.
	open := metric(t, srv.url, "plover_connections_open")
	c := dial(t, strings.TrimPrefix(srv.url, "http://"))
	half := len(b) / 2
	send(t, c, append(fmt.Appendf(nil, "PUT /v1/functions/late HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/vnd.plover.bundle+zstd\r\nContent-Length: %d\r\n\r\n", len(b)), b[:half]...))
	// Accepted: a connection still in the listen queue as the drain
	// closes the listener is reset by the kernel, its request never begun.
	waitFor(t, 10*time.Second, "the server to accept the deploy's connection", func() bool {
		return metric(t, srv.url, "plover_connections_open") > open
	})
	srv.cmd.Process.Signal(syscall.SIGTERM)
	waitFor(t, 10*time.Second, "the shutdown's log line", func() bool { return strings.Contains(srv.log.String(), "shutting down") })
	// The rest comes after the drain began (fasthttp cancelled its
	// request contexts then).
	send(t, c, b[half:])
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	answer, _ := io.ReadAll(c)
	if !bytes.HasPrefix(answer, []byte("HTTP/1.1 201 ")) {
		t.Fatalf("a deploy in flight as the server drained was answered %q; want 201", answer)
	}
}

// TestSIGHUPDuringDrainIsNoExit: a SIGHUP (a certificate or token
// reload, a log rotation) that comes while the server drains after
// SIGTERM leaves the drain to finish: the in-flight request is answered
// and the server exits 0, rather than dying of the signal.
func TestSIGHUPDuringDrainIsNoExit(t *testing.T) {
	srv := servedWithGrace(t, 10*time.Second, testkit.Slow("slow", 1500))
	invokeHTTP(srv.url, "slow", []byte("warm"))

	res := invokeInFlight(t, srv, "slow", []byte("drain me"))
	start := time.Now()
	srv.cmd.Process.Signal(syscall.SIGTERM)
	waitFor(t, 10*time.Second, "the shutdown's log line", func() bool { return strings.Contains(srv.log.String(), "shutting down") })
	addr := strings.TrimPrefix(srv.url, "http://")
	waitFor(t, 10*time.Second, "the API's listener to close (the drain under way)", func() bool {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	srv.cmd.Process.Signal(syscall.SIGHUP)
	(<-res).echoed(t, []byte("drain me"), "during shutdown and SIGHUP")
	exited(t, srv, start, 15*time.Second)
}

// servedWithGrace starts a server with --grace grace and args, m deployed
// on it; the test is skipped in -short.
func servedWithGrace(t *testing.T, grace time.Duration, m *abi.Manifest, args ...string) *server {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a server")
	}
	bin := buildPlover(t)
	srv := startServer(t, bin, append([]string{"--grace", grace.String()}, args...)...)
	run(t, bin, []string{"PLOVER_SERVER=" + srv.url}, "deploy", testkit.BundleDir(t, m, nil))
	return srv
}

// invoked is the outcome of an invoke.
type invoked struct {
	code int
	out  []byte
	err  error
}

// invokeInFlight invokes name with in and returns once its run has begun
// on the device (an instance of it busy); the outcome comes on the
// channel.
func invokeInFlight(t *testing.T, srv *server, name string, in []byte) <-chan invoked {
	t.Helper()
	res := make(chan invoked, 1)
	go func() {
		code, out, err := invokeHTTP(srv.url, name, in)
		res <- invoked{code, out, err}
	}()
	waitFor(t, 10*time.Second, "the request to run", func() bool {
		return metric(t, srv.url, `plover_instances{function="`+name+`",state="busy"}`) >= 1
	})
	return res
}

// echoed fails the test unless r is a 200 whose answer begins with in.
func (r invoked) echoed(t *testing.T, in []byte, when string) {
	t.Helper()
	if r.err != nil || r.code != 200 || !bytes.HasPrefix(r.out, in) {
		t.Errorf("in-flight request %s: %d %v %q", when, r.code, r.err, r.out)
	}
}

// exited waits up to bound for srv to exit, fails the test unless it
// exits 0, and returns how long after since it did.
func exited(t *testing.T, srv *server, since time.Time, bound time.Duration) time.Duration {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- srv.wait(bound) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v (want status 0)", err)
		}
	case <-time.After(bound):
		t.Fatalf("server still running %v after SIGTERM", bound)
	}
	took := time.Since(since)
	t.Logf("the server exited %v after SIGTERM", took.Round(time.Millisecond))
	return took
}

// stoppedWithin fails the test unless srv exited within bound of SIGTERM
// (took) having cleaned up: the engine and devices closed (its log's last
// word) and its workers' cgroup, where it made one, removed.
func stoppedWithin(t *testing.T, srv *server, took, bound time.Duration) {
	t.Helper()
	log := srv.log.String()
	if stopped := strings.Contains(log, `msg=stopped`); took > bound || !stopped {
		t.Fatalf("exited %v after SIGTERM, stopped cleanly: %v; want within %v and cleaned up", took.Round(time.Millisecond), stopped, bound)
	}
	if g := regexp.MustCompile(`cgroup=(\S+)`).FindStringSubmatch(log); g != nil {
		if _, err := os.Stat(g[1]); err == nil {
			t.Fatalf("the server's cgroup %s is still there after it stopped", g[1])
		}
	}
}

// dial connects to addr, closed as the test ends.
func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// send writes b to c.
func send(t *testing.T, c net.Conn, b []byte) {
	t.Helper()
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
}

// TestADrainCutShortFails: a drain ended with a request still running,
// by a second SIGTERM (or Ctrl-C) or by the end of --grace, cuts it and
// exits with a failing status saying why. The second signal had been
// caught and dropped (only SIGKILL stopped the server before a long
// request ended), and the grace's end exited 0 as if the drain had
// finished.
func TestADrainCutShortFails(t *testing.T) {
	for _, tc := range []struct {
		name, says string
		grace      time.Duration
		second     bool
	}{
		{"second signal", "a second signal", 2 * time.Minute, true},
		{"grace over", "grace period over with requests still running", time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := servedWithGrace(t, tc.grace, testkit.Slow("slow", 60000))
			res := invokeInFlight(t, srv, "slow", []byte("cut me"))
			waitFor(t, 10*time.Second, "the run to start", func() bool {
				return metric(t, srv.url, `plover_instances{function="slow",state="busy"}`) >= 1
			})
			srv.cmd.Process.Signal(syscall.SIGTERM)
			if tc.second {
				waitFor(t, 10*time.Second, "the shutdown's log line", func() bool { return strings.Contains(srv.log.String(), "shutting down") })
				srv.cmd.Process.Signal(syscall.SIGTERM)
			}
			done := make(chan error, 1)
			go func() { done <- srv.wait(30 * time.Second) }()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(srv.log.String(), tc.says) {
					t.Fatalf("exit: %v, want a failing status and the log saying %q\n%s", err, tc.says, srv.log.String())
				}
			case <-time.After(30 * time.Second): // the run takes a minute
				t.Fatal("server still running 30 s after the drain was cut short")
			}
			if r := <-res; r.err == nil && r.code == 200 {
				t.Fatalf("the minute-long request was answered 200 though the drain was cut")
			}
		})
	}
}

// TestGraceEndRefusesQueuedRequests: requests still queued when --grace
// ends (behind the one instance of a function whose run outlasts the
// grace), which never started, are answered 503 unavailable, the server
// shutting down, with Retry-After and Connection: close over HTTP, and
// Unavailable over gRPC; the running request is cut, with no status; the
// server exits about a second after the grace, its log counting both.
// All of them were cut bare at the grace's end: a client could not tell
// the queued ones from the one that ran, and a proxy answered them 502.
func TestGraceEndRefusesQueuedRequests(t *testing.T) {
	const grace = 2 * time.Second
	m := testkit.Slow("slow", 60000)
	m.MaxInstances = 1
	srv := servedWithGrace(t, grace, m, "--grpc-listen", "127.0.0.1:0")
	running := invokeInFlight(t, srv, "slow", []byte("cut me"))

	queued := make(chan *http.Response, 2)
	for range 2 {
		go func() {
			resp, err := http.Post(srv.url+"/v1/functions/slow/invoke", "application/octet-stream", strings.NewReader("refuse me"))
			if err != nil {
				t.Errorf("a queued HTTP request got no answer: %v", err)
			}
			queued <- resp
		}()
	}
	conn, err := grpc.NewClient(srv.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	queuedGRPC := make(chan error, 1)
	go func() {
		_, err := inferBytes(conn, "slow", []byte("refuse me"))
		queuedGRPC <- err
	}()
	waitFor(t, 10*time.Second, "three requests queued", func() bool {
		return metric(t, srv.url, `plover_queue_depth{function="slow"}`) >= 3
	})

	start := time.Now()
	srv.cmd.Process.Signal(syscall.SIGTERM)
	for range 2 {
		if resp := <-queued; resp != nil {
			refusedHTTP(t, resp)
		}
	}
	if err := <-queuedGRPC; status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "shutting down") {
		t.Errorf("the queued gRPC call: %v; want Unavailable, the server shutting down", err)
	}
	if r := <-running; r.err == nil || r.code != 0 {
		t.Errorf("the running request: %d %v %q; want it cut, with no status", r.code, r.err, r.out)
	}
	if err := srv.wait(3 * grace); err == nil {
		t.Errorf("the server exited 0; want a failing status, a request was cut")
	}
	took := time.Since(start)
	t.Logf("the server exited %v after SIGTERM", took.Round(time.Millisecond))
	if took > grace+2*time.Second {
		t.Errorf("the server exited %v after SIGTERM; want about a second after --grace %v", took.Round(time.Millisecond), grace)
	}
	if !regexp.MustCompile(`grace period over with requests still running.* cut=1 refused=3`).MatchString(srv.log.String()) {
		t.Errorf("the log does not count 1 request cut and 3 refused:\n%s", srv.log)
	}
}

// refusedHTTP fails the test unless resp is the 503 of a request refused
// as the server shuts down: to retry (Retry-After), on another node
// (Connection: close).
func refusedHTTP(t *testing.T, resp *http.Response) {
	t.Helper()
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var e struct {
		Error struct{ Code, Message string }
	}
	json.NewDecoder(bytes.NewReader(b)).Decode(&e)
	if resp.StatusCode != http.StatusServiceUnavailable || e.Error.Code != "unavailable" || !strings.Contains(e.Error.Message, "shutting down") ||
		resp.Header.Get("Retry-After") == "" || !resp.Close {
		t.Errorf("a queued HTTP request: %d (Retry-After %q, Connection: close %v) %s; want 503 unavailable, the server shutting down, Retry-After and Connection: close",
			resp.StatusCode, resp.Header.Get("Retry-After"), resp.Close, b)
	}
}

// TestAFailedListenerDrainsTheRest: when the API's listener fails (its
// accept loop ends with an error), the server drains as for a signal,
// answering the request in flight and cleaning up after itself, and
// exits with a failing status naming the failure, where it had returned
// at once, cutting that request and leaving its workers' groups behind.
// The failure is made from outside: the test takes a copy of the
// server's listening socket (pidfd_getfd) and shuts it down, so that the
// server's accept fails with EINVAL.
func TestAFailedListenerDrainsTheRest(t *testing.T) {
	const grace = 8 * time.Second
	srv := servedWithGrace(t, grace, testkit.Slow("slow", 1500))
	invokeHTTP(srv.url, "slow", []byte("warm"))
	res := invokeInFlight(t, srv, "slow", []byte("finish me"))
	ln := listeningSocket(t, srv.cmd.Process.Pid, strings.TrimPrefix(srv.url, "http://"))
	start := time.Now()
	if err := unix.Shutdown(ln, unix.SHUT_RDWR); err != nil {
		t.Fatalf("shutting the server's listener down: %v", err)
	}
	unix.Close(ln)
	(<-res).echoed(t, []byte("finish me"), "as the listener failed")
	done := make(chan error, 1)
	go func() { done <- srv.wait(grace + 5*time.Second) }()
	var err error
	select {
	case err = <-done:
	case <-time.After(grace + 5*time.Second):
		t.Fatalf("server still running %v after its listener failed", grace+5*time.Second)
	}
	log := srv.log.String()
	if err == nil || !strings.Contains(log, "server stopped") || !strings.Contains(log, "invalid argument") {
		t.Fatalf("exit after the listener failed: %v; want a failing status and the log naming the failure\n%s", err, log)
	}
	stoppedWithin(t, srv, time.Since(start), grace/2)
}

// listeningSocket is a copy, in this process, of the socket pid listens
// on at addr (host:port); the test is skipped where pidfd_getfd is not
// allowed (it needs the right to ptrace pid).
func listeningSocket(t *testing.T, pid int, addr string) int {
	t.Helper()
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Skipf("pidfd_open: %v", err)
	}
	defer unix.Close(pidfd)
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range fds {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		fd, err := unix.PidfdGetfd(pidfd, n, 0)
		if err != nil {
			if errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENOSYS) {
				t.Skipf("pidfd_getfd: %v", err)
			}
			continue // closed meanwhile
		}
		sa, err := unix.Getsockname(fd)
		listening, _ := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN)
		if in4, ok := sa.(*unix.SockaddrInet4); ok && err == nil && listening == 1 &&
			net.JoinHostPort(net.IP(in4.Addr[:]).String(), strconv.Itoa(in4.Port)) == addr {
			return fd
		}
		unix.Close(fd)
	}
	t.Fatalf("no socket of pid %d listens on %s", pid, addr)
	return -1
}

// TestAFailedStartLeavesNoGroups: a server that fails to start after its
// workers' groups were made (its --listen address in use, a --repository
// that is not there) removes them before it exits, as a drain does: they
// outlived it before, a cgroup tree of about twenty directories each time.
func TestAFailedStartLeavesNoGroups(t *testing.T) {
	if testing.Short() {
		t.Skip("starts servers")
	}
	bin := buildPlover(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, tc := range []struct {
		name string
		args []string
		says string
	}{
		{"--listen in use", []string{"--listen", busy.Addr().String()}, "address already in use"},
		{"no --repository", []string{"--listen", "127.0.0.1:0", "--repository", filepath.Join(t.TempDir(), "none")}, "--repository"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(bin, append([]string{"serve", "--data", t.TempDir(), "--device", "host"}, tc.args...)...)
			out, err := cmd.CombinedOutput()
			if err == nil || !strings.Contains(string(out), tc.says) {
				t.Fatalf("serve %v: %v; want a failure saying %q\n%s", tc.args, err, tc.says, out)
			}
			g := regexp.MustCompile(`msg="worker CPU weights on" cgroup=(\S+)`).FindSubmatch(out)
			if g == nil {
				t.Skip("the server made no CPU groups here (no writable cgroups): nothing to leave")
			}
			if _, err := os.Stat(string(g[1])); err == nil {
				t.Fatalf("the failed server's group %s is still there", g[1])
			}
		})
	}
}

// TestASignalWhileStartingStopsTheStart: a stop signal while the node
// opens (here an S3 store that accepts connections and never answers)
// ends the start at once, opens no listener and exits 0, as a stop the
// operator asked for, where the start failed with "context canceled".
func TestASignalWhileStartingStopsTheStart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	bin := buildPlover(t)
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	accepted := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	cmd := exec.Command(bin, "serve", "--listen", "127.0.0.1:0", "--data", t.TempDir(), "--device", "host",
		"--store", "s3://bucket", "--s3-endpoint", "http://"+silent.Addr().String())
	cmd.Env = append(os.Environ(), "AWS_ACCESS_KEY_ID=x", "AWS_SECRET_ACCESS_KEY=y")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	select {
	case c := <-accepted: // the server is opening its store
		defer c.Close()
	case <-time.After(20 * time.Second):
		t.Fatal("the server never reached its store")
	}
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil || !strings.Contains(out.String(), "stopped by a signal while starting") || strings.Contains(out.String(), "plover serving") {
			t.Fatalf("exit after SIGTERM while starting: %v, want status 0, the log saying why and no listener\n%s", err, out.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("server still starting 20 s after SIGTERM")
	}
}
