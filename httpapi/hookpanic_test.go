package httpapi_test

import (
	"bufio"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/selfsigned"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/netguard"
	"github.com/plover-run/plover/reqmetrics"
)

// A panic in a hook fasthttp calls outside the handler, which it does not
// recover either (the process ended, every tenant's requests with it), is
// recovered as a handler's is: logged once and counted, the request
// answered 500 internal without its handler (HeaderReceived: what the hook
// left of the request is unknown) or in place of the error's answer
// (ErrorHandler), its connection closed; one in ConnState, which has no
// request to answer, closes the connection. The server goes on serving. A
// request that expects 100-continue is not told to send its body first
// (it was, and the server then waited for it). One whose body then failed
// (no handler run) is answered 500 too, as recorded (it was a 400), its
// mark taken (it stayed, every later request taking its lock).
func TestPanicOutsideTheHandlerIsRecovered(t *testing.T) {
	for _, tc := range []struct {
		hook, request string
		cut           bool   // the client shuts its side after the request
		status        int    // the answer's (0: none, the connection closed)
		route         string // in the log line ("": not checked)
		function      string
	}{
		{"header", "GET /v1/functions/f HTTP/1.1\r\nHost: localhost\r\nX-Test-Panic: 1\r\n\r\n", false, 500, "GET /v1/functions/f", "f"},
		{"header", "POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\nX-Test-Panic: 1\r\nExpect: 100-continue\r\nContent-Length: 10\r\n\r\n",
			false, 500, "POST /v1/functions/echo/invoke", "echo"},
		{"header, Expect taken", "POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\nX-Test-Panic: 1\r\nExpect: 100-continue\r\nContent-Length: 10\r\n\r\n",
			false, 500, "POST /v1/functions/echo/invoke", "echo"},
		// Its body cut short (the client closes its side): fasthttp
		// answers that (ErrorHandler) and runs no handler; its mark must
		// not answer a later request.
		{"header", "POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\nX-Test-Panic: 1\r\nContent-Length: 100\r\n\r\nonly this",
			true, 500, "POST /v1/functions/echo/invoke", "echo"},
		{"parse error", "GET /readyz HTTP/1.1\r\nHost: localhost\r\nContent-Length: nope\r\n\r\n", false, 500, "", ""},
		{"conn state", "GET /readyz HTTP/1.1\r\nHost: localhost\r\n\r\n", false, 0, "", ""},
	} {
		t.Run(tc.hook, func(t *testing.T) {
			var log testkit.LogBuffer
			reg := prometheus.NewRegistry()
			door := frontdoor.New(frontdoor.Config{Runner: testkit.PanicRunner{}, Metrics: reqmetrics.New(reg),
				Log: slog.New(slog.NewTextHandler(&log, nil))})
			srv := httpapi.New(door, panicAdmin{}, httpapi.Options{Registry: reg}) // a handler run would panic too, a second line
			httpapi.PanicIn(srv, tc.hook, "a bug in the "+tc.hook)
			url := testkit.ServeWith(t, srv)

			c := dialRaw(t, strings.TrimPrefix(url, "http://"))
			if _, err := io.WriteString(c, tc.request); err != nil {
				t.Fatal(err)
			}
			if tc.cut {
				c.(*net.TCPConn).CloseWrite()
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			switch {
			case tc.status == 0 && err == nil:
				t.Fatalf("answered %d: want the connection closed", resp.StatusCode)
			case tc.status != 0 && err != nil:
				t.Fatalf("no answer: %v (did the server die?)", err)
			case tc.status != 0:
				body, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != tc.status || !resp.Close || tc.status == 500 && !strings.Contains(string(body), `"code":"internal"`) ||
					strings.Contains(string(body), "a bug in") {
					t.Fatalf("%d %s (close %v): want %d, telling nothing of the panic, its connection closed", resp.StatusCode, body, resp.Close, tc.status)
				}
				if n := httpapi.HeaderMarks(srv); n != 0 {
					t.Errorf("%d marks left once answered: want none", n)
				}
			}
			for range 3 { // on fresh connections, the pooled request state perhaps the panicked one's
				if resp, err := http.Get(url + "/readyz"); err != nil || resp.StatusCode != 200 {
					t.Fatalf("the next request, GET /readyz: %v %v", resp, err)
				} else {
					resp.Body.Close()
				}
			}
			onePanic(t, log.String(), reg, tc.route, "a bug in the "+tc.hook, tc.function)
		})
	}
}

// panickyListener's Accept panics once, before it accepts (as a bug in
// the server's listener would: netguard's, its connection cap), when
// accept is set; so does its connections' read that brings read to 0 (a
// bug under the server's read of a request's headers), and their next
// close when close is set (netguard's: its slot given back, a lingering
// close).
type panickyListener struct {
	net.Listener
	accept *atomic.Bool
	read   *atomic.Int32
	close  *atomic.Bool
}

func (l panickyListener) Accept() (net.Conn, error) {
	if l.accept.CompareAndSwap(true, false) {
		panic("a bug in Accept")
	}
	c, err := l.Listener.Accept()
	if err != nil {
		return c, err
	}
	return panickyConn{c.(*net.TCPConn), l.read, l.close}, nil
}

type panickyConn struct {
	*net.TCPConn
	read  *atomic.Int32
	close *atomic.Bool
}

func (c panickyConn) Close() error {
	if c.close.CompareAndSwap(true, false) {
		panic("a bug in Close")
	}
	return c.TCPConn.Close()
}

// Read panics once its bytes came: a panic before would beat the
// client's request, its 500 an answer to nothing sent.
func (c panickyConn) Read(b []byte) (int, error) {
	n, err := c.TCPConn.Read(b)
	if c.read.Add(-1) == 0 {
		panic("a bug in Read")
	}
	return n, err
}

// A panic in what fasthttp calls of the server's connections outside a
// handler (the listener's Accept, in its accept loop; a connection's read
// of a request's headers, or of a TLS handshake; its close once fasthttp
// is done with it), which it does not recover, is logged and counted, the
// connection (if any) closed, a request whose read panicked answered 500;
// the server goes on accepting.
func TestPanicInAcceptOrAHeaderReadIsRecovered(t *testing.T) {
	for _, tc := range []struct {
		name, panicked     string
		accept, close, tls bool
		read               bool
		first              int // the first request's answer (0: its connection closed)
	}{
		{"accept", "a bug in Accept", true, false, false, false, 200},
		{"read", "a bug in Read", false, false, false, true, 500},
		{"tls handshake read", "a bug in Read", false, false, true, true, 0},
		{"close", "a bug in Close", false, true, false, false, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, log, reg := panicServer(t)
			accept, read, close := new(atomic.Bool), new(atomic.Int32), new(atomic.Bool)
			accept.Store(tc.accept)
			if tc.read {
				read.Store(1)
			}
			close.Store(tc.close)
			var ln net.Listener = panickyListener{listenLocal(t), accept, read, close}
			client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
			url := "http://" + ln.Addr().String()
			if tc.tls {
				ln = tls.NewListener(ln, selfsigned.Config(t))
				client.Transport.(*http.Transport).TLSClientConfig = &tls.Config{InsecureSkipVerify: true}
				url = "https://" + ln.Addr().String()
			}
			serveOn(t, srv, ln, srv.Serve)
			if resp, err := client.Get(url + "/readyz"); err == nil {
				resp.Body.Close()
				if resp.StatusCode != tc.first {
					t.Fatalf("the first request was answered %d: want %d (0: its connection closed)", resp.StatusCode, tc.first)
				}
			} else if tc.first != 0 {
				t.Fatalf("GET /readyz: %v: want %d", err, tc.first)
			}
			if resp, err := client.Get(url + "/readyz"); err != nil || resp.StatusCode != 200 {
				t.Fatalf("the next request, GET /readyz: %v %v", resp, err)
			} else {
				resp.Body.Close()
			}
			panicSeen(t, log, reg)
			onePanic(t, log.String(), reg, "", tc.panicked, "")
		})
	}
}

// addrPanicListener's first connection's RemoteAddr panics, as a bug
// under netguard's ClientKey would, after netguard took its slot.
type addrPanicListener struct {
	net.Listener
	once *atomic.Bool
}

func (l addrPanicListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil && l.once.CompareAndSwap(false, true) {
		return addrPanicConn{c.(*net.TCPConn)}, nil
	}
	return c, err
}

type addrPanicConn struct{ *net.TCPConn }

func (addrPanicConn) RemoteAddr() net.Addr { panic("a bug in RemoteAddr") }

// A panic in netguard's Accept after it took the connection's slot,
// recovered by the server, gives the slot back and closes that
// connection: each such panic took a slot for good, and the socket with
// it, the server refusing every client once none was left. Accepting goes
// on at once, not after the second fasthttp waits on an accept's timeout.
func TestAcceptPanicGivesBackItsSlot(t *testing.T) {
	srv, log, reg := panicServer(t)
	g := netguard.NewListener(addrPanicListener{listenLocal(t), new(atomic.Bool)}, 1)
	g.PerClient = 1
	serveOn(t, srv, g, srv.Serve)
	c := dialRaw(t, g.Addr().String())
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("the client whose accept panicked reads %v: want EOF, its socket closed", err)
	}
	start := time.Now()
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get("http://" + g.Addr().String() + "/readyz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("the next request: %v %v: want 200, the panicked accept's slot given back", resp, err)
	}
	resp.Body.Close()
	if d := time.Since(start); d > 900*time.Millisecond {
		t.Errorf("the next request took %v: want no second's pause after the panic", d)
	}
	panicSeen(t, log, reg)
	onePanic(t, log.String(), reg, "", "a bug in RemoteAddr", "")
}

// panicServer is a server whose handlers panic, logging to log.
func panicServer(t *testing.T) (*httpapi.Server, *testkit.LogBuffer, *prometheus.Registry) {
	log, reg := new(testkit.LogBuffer), prometheus.NewRegistry()
	door := frontdoor.New(frontdoor.Config{Runner: testkit.PanicRunner{}, Metrics: reqmetrics.New(reg),
		Log: slog.New(slog.NewTextHandler(log, nil))})
	return httpapi.New(door, panicAdmin{}, httpapi.Options{Registry: reg}), log, reg
}

func listenLocal(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// panicSeen waits until a panic is logged and counted: one in closing a
// connection is recorded in fasthttp's worker, after the client had its
// answer, and counted before it is logged.
func panicSeen(t *testing.T, log *testkit.LogBuffer, reg *prometheus.Registry) {
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if len(testkit.PanicLines(log.String())) > 0 && testkit.Panics(t, reg, "http") > 0 {
			return
		}
	}
}

// A panic in reading a request's body before its handler, pipelined
// behind a request whose answer fasthttp still buffers, leaves that
// answer delivered, then a 500: the connection was closed at once, the
// answer lost.
func TestReadPanicKeepsAPipelinedAnswer(t *testing.T) {
	srv, log, reg := panicServer(t)
	read := new(atomic.Int32)
	read.Store(2) // the first read brings both requests' headers, the second a body
	ln := panickyListener{listenLocal(t), new(atomic.Bool), read, new(atomic.Bool)}
	serveOn(t, srv, ln, srv.Serve)
	c := dialRaw(t, ln.Addr().String())
	io.WriteString(c, "GET /readyz HTTP/1.1\r\nHost: localhost\r\n\r\n"+
		"POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n")
	for end := time.Now().Add(10 * time.Second); read.Load() > 1; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the server did not read the requests")
		}
	}
	io.WriteString(c, strings.Repeat("x", 100))
	br := bufio.NewReader(c)
	for _, want := range []int{200, 500} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("want %d: %v", want, err)
		}
		io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != want {
			t.Fatalf("answered %d: want %d", resp.StatusCode, want)
		}
	}
	panicSeen(t, log, reg)
	onePanic(t, log.String(), reg, "", "a bug in Read", "")
}

// dialRaw is a connection to addr for the test, closed as it ends, its
// reads and writes bounded.
func dialRaw(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

// A panic in closing a connection under netguard's cap (its socket's
// close) gives back the connection's --max-conns slot: the recovery's
// second close closed the socket alone, and with a cap of 1 every later
// client was refused.
func TestPanicInCloseGivesBackItsSlot(t *testing.T) {
	srv, log, reg := panicServer(t)
	close := new(atomic.Bool)
	close.Store(true)
	g := netguard.NewListener(panickyListener{listenLocal(t), new(atomic.Bool), new(atomic.Int32), close}, 1)
	serveOn(t, srv, g, srv.Serve)
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for i := range 2 {
		resp, err := client.Get("http://" + g.Addr().String() + "/readyz")
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("request %d: %v %v: want 200, the panicked close's slot given back", i, resp, err)
		}
		resp.Body.Close()
		if i == 0 {
			panicSeen(t, log, reg)
		}
		for end := time.Now().Add(5 * time.Second); g.Open() != 0; time.Sleep(time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("%d connections open after request %d's: want 0", g.Open(), i)
			}
		}
	}
	onePanic(t, log.String(), reg, "", "a bug in Close", "")
}

// A panic in reading a request on the --metrics-listen address is
// answered 500, as on the API's: that server had no ErrorHandler, and
// fasthttp's answered the read's error 400 "Error when parsing request".
func TestMetricsReadPanicIsAnswered500(t *testing.T) {
	srv, log, reg := panicServer(t)
	read := new(atomic.Int32)
	read.Store(1)
	ln := panickyListener{listenLocal(t), new(atomic.Bool), read, new(atomic.Bool)}
	url := serveOn(t, srv, ln, srv.ServeMetrics)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 500 || !resp.Close {
		t.Fatalf("answered %d (close %v): want 500, its connection closed", resp.StatusCode, resp.Close)
	}
	if resp, err := client.Get(url + "/metrics"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("the next scrape: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	panicSeen(t, log, reg)
	onePanic(t, log.String(), reg, "", "a bug in Read", "")
}

// A panic in closing a connection before its socket was closed (a bug in
// netguard's Close ahead of the close) still closes the socket: its
// descriptor was held for good, its client never told. Under TLS too:
// the second try closed the TLS connection again, which returns at once
// without reaching the socket.
func TestPanicInCloseStillClosesTheSocket(t *testing.T) {
	for _, tc := range []struct {
		name string
		tls  bool
	}{{"plain", false}, {"tls", true}} {
		t.Run(tc.name, func(t *testing.T) {
			srv, log, reg := panicServer(t)
			close := new(atomic.Bool)
			close.Store(true)
			var ln net.Listener = panickyListener{listenLocal(t), new(atomic.Bool), new(atomic.Int32), close}
			if tc.tls {
				ln = tls.NewListener(ln, selfsigned.Config(t))
			}
			serveOn(t, srv, ln, srv.Serve)
			raw := dialRaw(t, ln.Addr().String())
			c := raw
			if tc.tls {
				c = tls.Client(raw, &tls.Config{InsecureSkipVerify: true})
			}
			io.WriteString(c, "GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			if tc.tls {
				br.ReadByte() // the close_notify, sent before the socket's close panicked
				br = bufio.NewReader(raw)
			}
			if _, err := br.ReadByte(); err != io.EOF {
				t.Fatalf("read past the answer: %v: want EOF, the socket closed", err)
			}
			panicSeen(t, log, reg)
			onePanic(t, log.String(), reg, "", "a bug in Close", "")
		})
	}
}
