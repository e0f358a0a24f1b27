package main_test

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/internal/testkit"
)

// metric is the value of a /metrics series (name with its labels as
// written, e.g. `plover_io_pieces{function="big",state="moving"}`), or -1
// when the server does not report it.
func metric(t *testing.T, url, series string) float64 {
	t.Helper()
	return metricsOf(t, http.DefaultClient, url)(series)
}

// metricsOf reads url's /metrics once, through client, and returns what
// metric says of each series in it.
func metricsOf(t *testing.T, client *http.Client, url string) func(series string) float64 {
	t.Helper()
	b := metricsText(t, client, url)
	return func(series string) float64 { return seriesIn(b, series) }
}

// metricsText is url's /metrics, read once through client.
func metricsText(t *testing.T, client *http.Client, url string) []byte {
	t.Helper()
	resp, err := client.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return b
}

// seriesIn is series's value in the metrics text b, or -1.
func seriesIn(b []byte, series string) float64 {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindSubmatch(b)
	if m == nil {
		return -1
	}
	f, _ := strconv.ParseFloat(string(m[1]), 64)
	return f
}

// waitMetric waits, bounded, until series satisfies ok in three reads in a
// row (a state, not an instant between two pieces).
func waitMetric(t *testing.T, url, series, want string, ok func(float64) bool) {
	t.Helper()
	var v float64
	row := 0
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if v = metric(t, url, series); !ok(v) {
			row = 0
		} else if row++; row == 3 {
			return
		}
	}
	t.Fatalf("%s is %v, want %s", series, v, want)
}

// echoBig deploys big: echo_exact, 16 MiB in and out, a body's bytes back.
func echoBig(t *testing.T, bin string, env []string) { echoBigAs(t, bin, env, "big") }

// echoBigAs is echoBig under another name.
func echoBigAs(t *testing.T, bin string, env []string, name string) {
	t.Helper()
	m := testkit.Manifest(name)
	m.MaxInputBytes, m.OutBytes = 16<<20, 16<<20
	m.ZeroOut = new(bool)
	m.Chain = []abi.Launch{{Kernel: "echo_exact", Grid: 1, Block: 256}}
	run(t, bin, env, "deploy", testkit.BundleDir(t, m, nil))
}

// postEcho posts to big, as client's request req, n bytes that say whose
// they are (body), and wants them back whole.
func postEcho(url string) func(client, req, n int) error { return postEchoVia(http.DefaultClient, url) }

// postEchoVia is postEcho through hc (its TLS roots, say).
func postEchoVia(hc *http.Client, url string) func(client, req, n int) error {
	return func(client, req, n int) error {
		in := body(client, req, n)
		resp, err := hc.Post(url+"/v1/functions/big/invoke", "application/octet-stream", bytes.NewReader(in))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || !bytes.Equal(out, in) {
			return fmt.Errorf("client %d request %d: %d, %d bytes back of %d sent, equal %v", client, req, resp.StatusCode, len(out), len(in), bytes.Equal(out, in))
		}
		return nil
	}
}

// concurrently runs clients 1..clients at once, each posting each requests
// of size(client, request) bytes in turn, and reports every failure.
func concurrently(t *testing.T, clients, each int, size func(c, i int) int, post func(client, req, n int) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for c := 1; c <= clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if err := post(c, i, size(c, i)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// rawPost starts a POST of n body bytes on its own connection and sends
// the first sent of them; the caller sends the rest (or not).
func rawPost(t *testing.T, url, fn string, n int) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "POST /v1/functions/%s/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", fn, n)
	return c
}

// wantEcho reads the answer to a request sent on c by hand, and wants it a
// 200 of in's bytes.
func wantEcho(t *testing.T, c net.Conn, in []byte, what string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !bytes.Equal(out, in) {
		t.Fatalf("%s: %d, %d bytes of %d, equal %v", what, resp.StatusCode, len(out), len(in), bytes.Equal(out, in))
	}
}

// A request's bytes move a piece at a time in its function's turns
// (--io-slots 1: one piece in the whole server at once), and a client that
// stops sending holds no turn: the server waits for its socket, not in its
// turn, while every other request moves and is answered with its own
// bytes. A body cut midway gives its turn back at once.
func TestIOTurns(t *testing.T) {
	bin := buildPlover(t)
	srv := startServer(t, bin, "--isolation", "process", "--io-shares", "on", "--io-slots", "1", "--timeout", "20s")
	env := []string{"PLOVER_SERVER=" + srv.url}
	echoBig(t, bin, env)
	post := postEcho(srv.url)
	if err := post(0, 0, 1<<20); err != nil {
		t.Fatal(err)
	}
	moving := `plover_io_pieces{function="big",state="moving"}`
	if s := metric(t, srv.url, `plover_io_seconds_total{function="big"}`); s <= 0 {
		t.Fatalf("a 1 MiB body and answer moved in pieces cost %v s of the server's CPU: want it counted", s)
	}

	t.Run("a stalled body holds no turn", func(t *testing.T) {
		const size = 4 << 20
		in := body(50, 0, size)
		spent := metric(t, srv.url, `plover_io_seconds_total{function="big"}`)
		c := rawPost(t, srv.url, "big", size)
		if _, err := c.Write(in[:1<<20]); err != nil {
			t.Fatal(err)
		}
		// Its first MiB is read, in turns; then the server waits for the
		// rest holding none: no piece of big is moving.
		waitMetric(t, srv.url, `plover_io_seconds_total{function="big"}`, "more than before the body", func(v float64) bool { return v > spent })
		waitMetric(t, srv.url, moving, "0 while a body waits for its client", func(v float64) bool { return v == 0 })
		concurrently(t, 4, 3, func(c, i int) int { return 1<<20 + c*8 }, post)
		if _, err := c.Write(in[1<<20:]); err != nil {
			t.Fatal(err)
		}
		wantEcho(t, c, in, "the stalled body, sent at last")
	})

	t.Run("a trickled chunked body is charged its bytes, not its waits", func(t *testing.T) {
		// Each chunk is read by a piece that may block (no socket
		// readiness tells a chunk's end), waiting about 10 ms for the
		// next: charged its wall time up to the 2 ms hold, 30 chunks
		// would cost the function 60 ms of I/O time.
		const chunks, size = 30, 100
		spent := metric(t, srv.url, `plover_io_seconds_total{function="big"}`)
		c, err := net.Dial("tcp", strings.TrimPrefix(srv.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST /v1/functions/big/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		in := body(70, 0, chunks*size)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for i := range chunks {
			<-tick.C
			if _, err := fmt.Fprintf(c, "%x\r\n%s\r\n", size, in[i*size:(i+1)*size]); err != nil {
				t.Fatal(err)
			}
		}
		fmt.Fprintf(c, "0\r\n\r\n")
		wantEcho(t, c, in, "the trickled body")
		d := metric(t, srv.url, `plover_io_seconds_total{function="big"}`) - spent
		t.Logf("charged %.3f ms", d*1000)
		if d <= 0 || d > 0.015 {
			t.Fatalf("a %d-byte body trickled in %d chunks cost the function %.1f ms of I/O time: want a little, well under the %d ms of 2 ms a chunk", chunks*size, chunks, d*1000, 2*chunks)
		}
	})

	t.Run("a body cut midway gives its turn back", func(t *testing.T) {
		const size = 4 << 20
		c := rawPost(t, srv.url, "big", size)
		c.Write(body(60, 0, size)[:2<<20])
		c.Close()
		waitMetric(t, srv.url, moving, "0 once the cut body is dropped", func(v float64) bool { return v == 0 })
		waitMetric(t, srv.url, `plover_io_pieces{function="big",state="waiting"}`, "0", func(v float64) bool { return v == 0 })
		if err := post(61, 0, size); err != nil {
			t.Fatal(err)
		}
	})
}

// No foreign bytes while bytes move in turns: clients of random body sizes
// (from a few bytes to 3 MiB), some of which stop mid-upload or read only
// part of their answer, and a worker killed in the middle: every 200 is
// exactly its own request's bytes. With one function its pieces move
// alone (up to 1 MiB a turn, at the server's CPU weight); with two, each
// function's pieces wait for their turns beside the other's (256 KiB, at
// their function's weight) while both are about.
func TestIOTurnsKeepEveryAnswerItsOwn(t *testing.T) {
	bin := buildPlover(t)
	for _, names := range [][]string{{"big"}, {"big", "big2"}} {
		t.Run(strings.Join(names, ","), func(t *testing.T) { keepEveryAnswerItsOwn(t, bin, names) })
	}
}

func keepEveryAnswerItsOwn(t *testing.T, bin string, names []string) {
	srv := startServer(t, bin, "--isolation", "process", "--io-shares", "on", "--io-slots", "1", "--timeout", "20s", "--max-instances", "4")
	env := []string{"PLOVER_SERVER=" + srv.url}
	for _, n := range names {
		echoBigAs(t, bin, env, n)
	}
	mixedClients(t, srv.url, names[0], 7, func(rng *rand.Rand, c, i int) (bool, string) {
		n := 1 + rng.IntN(3<<20)
		in := body(100+c, i, n)
		fn := names[c%len(names)]
		url := srv.url + "/v1/functions/" + fn + "/invoke"
		switch rng.IntN(6) {
		case 0: // stops mid-upload
			conn := rawPost(t, srv.url, fn, n)
			conn.Write(in[:n/2])
			conn.Close()
			return false, ""
		case 1: // reads only part of its answer
			resp, err := http.Post(url, "application/octet-stream", bytes.NewReader(in))
			if err == nil {
				io.CopyN(io.Discard, resp.Body, int64(n/3))
				resp.Body.Close()
			}
			return false, ""
		}
		resp, err := http.Post(url, "application/octet-stream", bytes.NewReader(in))
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		return ownEcho(resp, in)
	})
}

// mixedClients runs 8 clients of 12 requests each (try, given each
// client's own random source, seeded with seed), kills fn's worker
// half-way through client 0's, and fails t for each request try calls
// bad, and where fewer than a third were ok.
func mixedClients(t *testing.T, url, fn string, seed uint64, try func(rng *rand.Rand, client, req int) (ok bool, bad string)) {
	t.Helper()
	mixedClientsVia(t, http.DefaultClient, url, fn, seed, try)
}

// mixedClientsVia is mixedClients finding fn's worker through hc (its
// token, say).
func mixedClientsVia(t *testing.T, hc *http.Client, url, fn string, seed uint64, try func(rng *rand.Rand, client, req int) (ok bool, bad string)) {
	t.Helper()
	const clients, each = 8, 12
	var wg sync.WaitGroup
	var mu sync.Mutex
	var bad []string
	oks := 0
	kill := make(chan struct{})
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), seed))
			for i := range each {
				if c == 0 && i == each/2 {
					close(kill)
				}
				ok, b := try(rng, c, i)
				mu.Lock()
				if b != "" {
					bad = append(bad, fmt.Sprintf("client %d request %d: %s", c, i, b))
				} else if ok {
					oks++
				}
				mu.Unlock()
			}
		}()
	}
	<-kill
	if pid := workerPIDVia(t, hc, url, fn); pid > 0 {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	wg.Wait()
	for _, b := range bad {
		t.Error(b)
	}
	if oks < clients*each/3 {
		t.Errorf("only %d requests of %d answered 200 or OK", oks, clients*each)
	}
}

// workerPID is the pid of fn's worker, from GET /v1/functions/{fn}.
func workerPID(t *testing.T, url, fn string) int {
	t.Helper()
	return workerPIDVia(t, http.DefaultClient, url, fn)
}

// workerPIDVia is workerPID through hc.
func workerPIDVia(t *testing.T, hc *http.Client, url, fn string) int {
	t.Helper()
	resp, err := hc.Get(url + "/v1/functions/" + fn)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`"pid":\s*(\d+)`).FindSubmatch(b)
	if m == nil {
		return 0
	}
	pid, _ := strconv.Atoi(string(m[1]))
	return pid
}

// Under TLS a socket's readiness says nothing of a record: pieces move in
// turn as they come, and the answer is still the request's own bytes.
func TestIOTurnsOverTLS(t *testing.T) {
	bin := buildPlover(t)
	dir := t.TempDir()
	ca, cert, key, _ := testkit.WriteCerts(t, dir)
	srv := startIsoServer(t, bin, t.TempDir(), nil, "--tls-cert", cert, "--tls-key", key, "--io-shares", "on", "--io-slots", "1")
	env := []string{"PLOVER_SERVER=" + srv.url, "PLOVER_CACERT=" + ca}
	echoBig(t, bin, env)
	pem, err := os.ReadFile(ca)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	var wg sync.WaitGroup
	for c := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			in := body(300+c, 0, 3<<20+c)
			resp, err := client.Post(srv.url+"/v1/functions/big/invoke", "application/octet-stream", bytes.NewReader(in))
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			out, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 200 || !bytes.Equal(out, in) {
				t.Errorf("client %d over TLS: %d, %d bytes of %d, equal %v", c, resp.StatusCode, len(out), len(in), bytes.Equal(out, in))
			}
		}()
	}
	wg.Wait()
}
