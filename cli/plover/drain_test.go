package main_test

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

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
	if testing.Short() {
		t.Skip("starts a server")
	}
	bin := buildPlover(t)
	metrics := freeAddr(t)
	const grace = 8 * time.Second
	srv := startServer(t, bin, "--grace", grace.String(), "--metrics-listen", metrics)
	m := testkit.Slow("slow", 800)
	run(t, bin, []string{"PLOVER_SERVER=" + srv.url}, "deploy", testkit.BundleDir(t, m, nil))
	invokeHTTP(srv.url, "slow", []byte("warm"))

	for _, addr := range []string{strings.TrimPrefix(srv.url, "http://"), metrics} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	type result struct {
		code int
		out  []byte
		err  error
	}
	res := make(chan result, 1)
	go func() {
		code, out, err := invokeHTTP(srv.url, "slow", []byte("drain me"))
		res <- result{code, out, err}
	}()
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	srv.cmd.Process.Signal(syscall.SIGTERM)
	r := <-res
	if r.err != nil || r.code != 200 || !bytes.HasPrefix(r.out, []byte("drain me")) {
		t.Fatalf("in-flight request during shutdown: %d %v %q", r.code, r.err, r.out)
	}
	done := make(chan error, 1)
	go func() { done <- srv.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v (want status 0)", err)
		}
	case <-time.After(grace + 5*time.Second):
		t.Fatal("server did not exit after SIGTERM")
	}
	took := time.Since(start)
	log := srv.log.String()
	t.Logf("the in-flight request was answered, and the server exited %v after SIGTERM", took.Round(time.Millisecond))
	if took > grace/2 || !strings.Contains(log, `msg=stopped`) {
		t.Fatalf("exited %v after SIGTERM (grace %v; the request took 800 ms), stopped cleanly: %v; want well within the grace and cleaned up",
			took.Round(time.Millisecond), grace, strings.Contains(log, `msg=stopped`))
	}
	if g := regexp.MustCompile(`cgroup=(\S+)`).FindStringSubmatch(log); g != nil {
		if _, err := os.Stat(g[1]); err == nil {
			t.Fatalf("the server's cgroup %s is still there after it stopped", g[1])
		}
	}
}

// TestSIGTERMGraceEndsSlowClients: a client sending its headers a byte
// at a time, and one that does not read its answer, hold connections the
// drain leaves to the end of --grace (their requests had begun); then
// they are closed, and the server, with no request running, exits within
// its bound and cleans up after itself.
func TestSIGTERMGraceEndsSlowClients(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	bin := buildPlover(t)
	const grace = 4 * time.Second
	srv := startServer(t, bin, "--grace", grace.String())
	m := testkit.Manifest("big")
	m.MaxInputBytes, m.OutBytes = 64<<20, 64<<20
	run(t, bin, []string{"PLOVER_SERVER=" + srv.url}, "deploy", testkit.BundleDir(t, m, nil))
	addr := strings.TrimPrefix(srv.url, "http://")

	slow, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	if _, err := slow.Write([]byte("GET /v1/functions HTTP/1.1\r\nHo")); err != nil {
		t.Fatal(err)
	}
	deaf, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer deaf.Close()
	deaf.(*net.TCPConn).SetReadBuffer(4 << 10)
	in := make([]byte, 64<<20)
	if _, err := fmt.Fprintf(deaf, "POST /v1/functions/big/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n", len(in)); err != nil {
		t.Fatal(err)
	}
	if _, err := deaf.Write(in); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // the answer fills the socket buffers
	start := time.Now()
	srv.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- srv.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v (want status 0)", err)
		}
	case <-time.After(3 * grace):
		t.Fatalf("server still running %v after SIGTERM (grace %v)", 3*grace, grace)
	}
	took := time.Since(start)
	t.Logf("the server exited %v after SIGTERM", took.Round(time.Millisecond))
	log := srv.log.String()
	if took > grace+2*time.Second || !strings.Contains(log, `msg=stopped`) {
		t.Fatalf("exited %v after SIGTERM (grace %v), stopped cleanly: %v; want by the grace's end and cleaned up",
			took.Round(time.Millisecond), grace, strings.Contains(log, `msg=stopped`))
	}
	if g := regexp.MustCompile(`cgroup=(\S+)`).FindStringSubmatch(log); g != nil {
		if _, err := os.Stat(g[1]); err == nil {
			t.Fatalf("the server's cgroup %s is still there after it stopped", g[1])
		}
	}
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
	grpcListen := freeAddr(t)
	const grace = 6 * time.Second
	srv := startServer(t, bin, "--grace", grace.String(), "--grpc-listen", grpcListen)
	for _, hello := range []string{"", "PRI * HTTP/2.0\r\n"} {
		c, err := net.Dial("tcp", grpcListen)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write([]byte(hello)); err != nil {
			t.Fatal(err)
		}
	}
	// Both connections are accepted (the server's count says so) before
	// the signal.
	for deadline := time.Now().Add(10 * time.Second); ; {
		if metric(t, srv.url, "plover_connections_open") >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the server never counted the two gRPC connections open")
		}
		time.Sleep(10 * time.Millisecond)
	}
	start := time.Now()
	srv.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- srv.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v (want status 0)", err)
		}
	case <-time.After(3 * grace):
		t.Fatalf("server still running %v after SIGTERM (grace %v)", 3*grace, grace)
	}
	took := time.Since(start)
	t.Logf("the server exited %v after SIGTERM", took.Round(time.Millisecond))
	if log := srv.log.String(); took > grace/2 || !strings.Contains(log, `msg=stopped`) {
		t.Fatalf("exited %v after SIGTERM (grace %v), stopped cleanly: %v; want well within the grace and cleaned up",
			took.Round(time.Millisecond), grace, strings.Contains(log, `msg=stopped`))
	}
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
	c, err := net.Dial("tcp", strings.TrimPrefix(srv.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	head := fmt.Sprintf("PUT /v1/functions/late HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/vnd.plover.bundle+zstd\r\nContent-Length: %d\r\n\r\n", len(b))
	half := len(b) / 2
	if _, err := c.Write(append([]byte(head), b[:half]...)); err != nil {
		t.Fatal(err)
	}
	srv.cmd.Process.Signal(syscall.SIGTERM)
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(srv.log.String(), "shutting down"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no shutdown log line")
		}
	}
	// The rest comes after the drain began (fasthttp cancelled its
	// request contexts then); a little later still, so that a deploy
	// cancelled by it has had time to fail.
	time.Sleep(200 * time.Millisecond)
	if _, err := c.Write(b[half:]); err != nil {
		t.Fatal(err)
	}
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
	if testing.Short() {
		t.Skip("starts a server")
	}
	bin := buildPlover(t)
	srv := startServer(t, bin, "--grace", "10s")
	m := testkit.Slow("slow", 1500)
	run(t, bin, []string{"PLOVER_SERVER=" + srv.url}, "deploy", testkit.BundleDir(t, m, nil))
	invokeHTTP(srv.url, "slow", []byte("warm"))

	type result struct {
		code int
		out  []byte
		err  error
	}
	res := make(chan result, 1)
	go func() {
		code, out, err := invokeHTTP(srv.url, "slow", []byte("drain me"))
		res <- result{code, out, err}
	}()
	for deadline := time.Now().Add(5 * time.Second); metric(t, srv.url, `plover_instances{function="slow",state="busy"}`) < 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the request never started")
		}
	}
	srv.cmd.Process.Signal(syscall.SIGTERM)
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(srv.log.String(), "shutting down"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no shutdown log line")
		}
	}
	time.Sleep(100 * time.Millisecond) // the drain is under way
	srv.cmd.Process.Signal(syscall.SIGHUP)
	r := <-res
	if r.err != nil || r.code != 200 || !bytes.HasPrefix(r.out, []byte("drain me")) {
		t.Errorf("in-flight request during shutdown and SIGHUP: %d %v %q", r.code, r.err, r.out)
	}
	done := make(chan error, 1)
	go func() { done <- srv.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit after SIGTERM and SIGHUP: %v (want status 0)", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("server did not exit after SIGTERM")
	}
}

// freeAddr is a loopback address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
