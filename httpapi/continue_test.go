package httpapi_test

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/selfsigned"
	"github.com/plover-run/plover/internal/testkit"
)

// expectConn is a client that sends a request's headers with Expect:
// 100-continue and holds its body back until it hears from the server.
type expectConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialExpect(t *testing.T, addr string) *expectConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &expectConn{t: t, c: c, br: bufio.NewReader(c)}
}

// serveTLS serves the HTTP API for e over TLS (a self-signed
// certificate) on a free loopback port until the test ends, and returns
// its address.
func serveTLS(t *testing.T, e *engine.Engine, opts httpapi.Options) string {
	t.Helper()
	srv := httpapi.New(testkit.Door(e, nil, nil), e.Control(), opts)
	return strings.TrimPrefix(serveOn(t, srv, tls.NewListener(listenLoopback(t), selfsigned.Config(t)), srv.Serve), "http://")
}

// listenLoopback listens on a free loopback port.
func listenLoopback(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// dialTLS connects to serveTLS's addr, closed when the test ends.
func dialTLS(t *testing.T, addr string) *tls.Conn {
	t.Helper()
	tc, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tc.Close() })
	return tc
}

// ask sends the request line and headers (headers: extra lines, each
// ending in \r\n) announcing a body of n bytes, and reads what the server
// answers before any byte of the body: a 100 Continue or a final response
// (its body read).
func (e *expectConn) ask(target, headers string, n int) (*http.Response, string) {
	e.t.Helper()
	head := "POST " + target + " HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\n" + headers +
		"Content-Length: " + strconv.Itoa(n) + "\r\nExpect: 100-continue\r\n\r\n"
	if _, err := io.WriteString(e.c, head); err != nil {
		e.t.Fatal(err)
	}
	return e.read()
}

func (e *expectConn) read() (*http.Response, string) {
	e.t.Helper()
	e.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(e.br, nil)
	if err != nil {
		e.t.Fatalf("reading the answer: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatalf("reading the answer's body: %v", err)
	}
	return resp, string(b)
}

// closed reports whether the server closed the connection (EOF, or a
// reset, once what it sent is read).
func (e *expectConn) closed() bool {
	e.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := e.br.ReadByte()
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// A client that asks before sending its body (Expect: 100-continue, as
// curl does past 1 MiB) gets the server's refusal in place of 100
// Continue whenever the headers are enough to refuse: a token that is
// missing, unknown, not for the function or over its limits, a function
// the server does not have, a body over a limit. It uploads nothing, the
// connection is closed after the answer (the body the client may still
// send would otherwise be read as a request), and the refusal holds no
// token's place. An admitted request gets 100 Continue and its answer,
// on a connection that stays open.
func TestExpectContinueRefusesBeforeTheBody(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	m := testkit.Manifest("echo")
	m.OutBytes = 32 << 10 // the echo: the input, zero-padded
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	other := testkit.Manifest("other")
	other.MaxInputBytes = 4 << 10
	testkit.Deploy(t, e, testkit.BundleDir(t, other, nil))

	tokens := map[string]string{}
	var lines []string
	for _, tk := range []struct {
		name   string
		fns    []string
		limits auth.Limits
	}{
		{"full", nil, auth.Limits{}},
		{"echoonly", []string{"echo"}, auth.Limits{}},
		{"slow", nil, auth.Limits{Rate: 0.001, Burst: 1}},
		{"single", nil, auth.Limits{Concurrency: 1}},
	} {
		tok, err := auth.NewToken()
		if err != nil {
			t.Fatal(err)
		}
		tokens[tk.name] = "Authorization: Bearer " + tok + "\r\n"
		lines = append(lines, auth.Line(tk.name, auth.Invoke|auth.Read, auth.Hash(tok), tk.fns, tk.limits))
	}
	tab, err := auth.Parse(strings.NewReader(strings.Join(lines, "\n")+"\n"), "tokens")
	if err != nil {
		t.Fatal(err)
	}
	url := testkit.ServeTokens(t, e, tab, httpapi.Options{MaxBodyBytes: 48 << 10}) // under echo's max_input_bytes
	addr := strings.TrimPrefix(url, "http://")

	// The slow token's one request is spent; the single token's one place
	// is held by a request whose handler reads its body (its 100 Continue
	// says so) while the cases run.
	if rs := rawExchangeWithin(t, addr, "GET /v1/functions HTTP/1.1\r\nHost: localhost\r\n"+tokens["slow"]+"\r\n", 5*time.Second); statusOf(rs) != 200 {
		t.Fatalf("the slow token's first request: %d", statusOf(rs))
	}
	holder := dialExpect(t, addr)
	if resp, body := holder.ask("/v1/functions/echo/invoke", tokens["single"], 100); resp.StatusCode != 100 {
		t.Fatalf("the single token's first request: %d %s, want 100 Continue", resp.StatusCode, body)
	}

	for _, tc := range []struct {
		name, target, headers string
		n                     int
		code                  int
		says                  string
		header                string // a header the refusal carries
	}{
		{"no token", "/v1/functions/echo/invoke", "", 1 << 20, 401, "", "Www-Authenticate"},
		{"unknown token", "/v1/functions/echo/invoke", "Authorization: Bearer nope\r\n", 1 << 20, 401, "", "Www-Authenticate"},
		{"token not for the function", "/v1/functions/other/invoke", tokens["echoonly"], 1 << 20, 403, "", ""},
		{"token over its rate", "/v1/functions/echo/invoke", tokens["slow"], 1 << 20, 429, "", "Retry-After"},
		{"token over its concurrency", "/v1/functions/echo/invoke", tokens["single"], 1 << 20, 429, "", "Retry-After"},
		{"unknown function", "/v1/functions/nope/invoke", tokens["full"], 1 << 20, 404, "nope", ""},
		{"unknown function, small body", "/v1/functions/nope/invoke", tokens["full"], 100, 404, "nope", ""},
		{"v2 unknown model", "/v2/models/nope/infer", tokens["full"], 1 << 20, 404, "nope", ""},
		{"v2 over max_input_bytes", "/v2/models/other/infer", tokens["full"] + "Inference-Header-Content-Length: 100\r\n", 1 << 20, 413, "max_input_bytes", ""},
		{"over --max-body", "/v1/functions/echo/invoke", tokens["full"], 1 << 20, 413, "--max-body", ""},
		{"over max_input_bytes", "/v1/functions/other/invoke", tokens["full"], 1 << 20, 413, "max_input_bytes", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialExpect(t, addr)
			resp, body := c.ask(tc.target, tc.headers, tc.n)
			if resp.StatusCode != tc.code {
				t.Fatalf("before the body: %d %s, want %d", resp.StatusCode, body, tc.code)
			}
			if !strings.Contains(body, `"error"`) || !strings.Contains(body, tc.says) {
				t.Errorf("%d says %s, want Plover's error naming %q", tc.code, body, tc.says)
			}
			if tc.header != "" && resp.Header.Get(tc.header) == "" {
				t.Errorf("%d without %s: %v", tc.code, tc.header, resp.Header)
			}
			if !resp.Close || !c.closed() {
				t.Errorf("the connection stays open after a refusal of a body not sent")
			}
		})
	}

	// The refusals held no place: the single token's request, done, leaves
	// its one place to the next, which is served on a connection that
	// stays open for another.
	if _, err := io.WriteString(holder.c, strings.Repeat("h", 100)); err != nil {
		t.Fatal(err)
	}
	if resp, body := holder.read(); resp.StatusCode != 200 || !strings.HasPrefix(body, strings.Repeat("h", 100)) {
		t.Fatalf("the holder's answer: %d, %.200q", resp.StatusCode, body)
	}
	c := dialExpect(t, addr)
	payload := strings.Repeat("p", 20000)
	for i := range 2 {
		resp, body := c.ask("/v1/functions/echo/invoke", tokens["single"], len(payload))
		if resp.StatusCode != 100 {
			t.Fatalf("request %d: %d %s before the body, want 100 Continue", i, resp.StatusCode, body)
		}
		if _, err := io.WriteString(c.c, payload); err != nil {
			t.Fatal(err)
		}
		if resp, body = c.read(); resp.StatusCode != 200 || !strings.HasPrefix(body, payload) || resp.Close {
			t.Fatalf("request %d: %d (close %v), %d bytes back, want 200 echoing the %d sent", i, resp.StatusCode, resp.Close, len(body), len(payload))
		}
	}
}

// The admitted side: a chunked body gets its 100 Continue as a body of
// known length does; a client that sends its body without waiting is
// answered (a 100 Continue before the answer or none at all, both
// allowed); an HTTP/1.0 request's Expect is ignored (RFC 9110 section
// 10.1.1): no 100 Continue, the body read as sent.
func TestExpectContinueAdmitted(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	addr := strings.TrimPrefix(testkit.Serve(t, e, httpapi.Options{}), "http://")
	const post = "POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\n"
	body := strings.Repeat("b", 20000)
	for _, tc := range []struct {
		name, head, body string // body: sent once the head is answered 100 Continue, or at once without wait
		wait             bool
	}{
		{"chunked", post + "Transfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n", fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(body), body), true},
		{"case of the expectation", post + "Content-Length: 20000\r\nExpect: 100-Continue\r\n\r\n", body, true},
		{"body sent without waiting", post + "Content-Length: 20000\r\nExpect: 100-continue\r\n\r\n", body, false},
		{"small body sent without waiting", post + "Content-Length: 100\r\nExpect: 100-continue\r\n\r\n", body[:100], false},
		{"HTTP/1.0", strings.Replace(post, "HTTP/1.1", "HTTP/1.0", 1) + "Content-Length: 20000\r\nExpect: 100-continue\r\n\r\n", body, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialExpect(t, addr)
			send := tc.head
			if !tc.wait {
				send += tc.body
			}
			if _, err := io.WriteString(c.c, send); err != nil {
				t.Fatal(err)
			}
			resp, got := c.read()
			if tc.wait {
				if resp.StatusCode != 100 {
					t.Fatalf("before the body: %d %s, want 100 Continue", resp.StatusCode, got)
				}
				if _, err := io.WriteString(c.c, tc.body); err != nil {
					t.Fatal(err)
				}
				resp, got = c.read()
			} else if resp.StatusCode == 100 {
				if strings.HasPrefix(tc.name, "HTTP/1.0") {
					t.Fatalf("100 Continue to an HTTP/1.0 request")
				}
				resp, got = c.read()
			}
			want := strings.Repeat("b", min(len(body), 256))
			if tc.name == "small body sent without waiting" {
				want = body[:100]
			}
			if resp.StatusCode != 200 || !strings.HasPrefix(got, want) {
				t.Fatalf("%d, %.200q, want 200 echoing the body", resp.StatusCode, got)
			}
		})
	}
}

// readCount is a body that counts what of it the client read to send.
type readCount struct {
	r    io.Reader
	read int
}

func (c *readCount) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.read += n
	return n, err
}

// Go's own client, asking before it sends a bundle (Expect: 100-continue
// and an ExpectContinueTimeout), reads none of the bundle to send when the
// deploy is refused, and deploys once admitted.
func TestExpectContinueDeploy(t *testing.T) {
	tokens := map[string]string{}
	var lines []string
	for name, scopes := range map[string]auth.Scope{"reader": auth.Read, "deployer": auth.Deploy | auth.Read} {
		tok, err := auth.NewToken()
		if err != nil {
			t.Fatal(err)
		}
		tokens[name] = tok
		lines = append(lines, auth.Line(name, scopes, auth.Hash(tok), nil, auth.Limits{}))
	}
	tab, err := auth.Parse(strings.NewReader(strings.Join(lines, "\n")+"\n"), "tokens")
	if err != nil {
		t.Fatal(err)
	}
	e := testkit.Engine(t, engine.Config{})
	url := testkit.ServeTokens(t, e, tab, httpapi.Options{})
	b, _, _, err := bundle.PackBytes(testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{ExpectContinueTimeout: time.Minute}}
	for _, tc := range []struct {
		token string
		code  int
	}{
		{"no token", 401},
		{"reader", 403},
		{"deployer", 201},
	} {
		t.Run(tc.token, func(t *testing.T) {
			body := &readCount{r: bytes.NewReader(b)}
			req, _ := http.NewRequest(http.MethodPut, url+"/v1/functions/echo", body)
			req.ContentLength = int64(len(b))
			req.Header.Set("Content-Type", bundle.MediaType)
			req.Header.Set("Expect", "100-continue")
			if tok, ok := tokens[tc.token]; ok {
				req.Header.Set("Authorization", "Bearer "+tok)
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.code {
				t.Fatalf("%d %s, want %d", resp.StatusCode, got, tc.code)
			}
			if sent := body.read; (tc.code == 201) != (sent == len(b)) || (tc.code != 201 && sent != 0) {
				t.Fatalf("%d after the client read %d of the bundle's %d bytes to send", tc.code, sent, len(b))
			}
		})
	}
}

// Clients at once, each alternating requests that expect 100-continue
// with requests that do not on one connection, and bodies of their own
// lengths: each gets its own body back, whatever the others announced.
func TestExpectContinueConcurrent(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	m := testkit.Manifest("echo")
	m.OutBytes = 32 << 10
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	addr := strings.TrimPrefix(testkit.Serve(t, e, httpapi.Options{}), "http://")
	var wg sync.WaitGroup
	for client := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			br := bufio.NewReader(c)
			for i := range 6 {
				payload := strings.Repeat(string(rune('a'+client)), 9000+client*1000+i*7)
				expect := ""
				if i%2 == 0 {
					expect = "Expect: 100-continue\r\n"
				}
				fmt.Fprintf(c, "POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n%s\r\n", len(payload), expect)
				c.SetReadDeadline(time.Now().Add(10 * time.Second))
				if expect != "" {
					resp, err := http.ReadResponse(br, nil)
					if err != nil || resp.StatusCode != 100 {
						t.Errorf("client %d request %d: %v %v, want 100 Continue", client, i, resp, err)
						return
					}
				}
				io.WriteString(c, payload)
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Errorf("client %d request %d: %v", client, i, err)
					return
				}
				got, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != 200 || !strings.HasPrefix(string(got), payload) || resp.Close {
					t.Errorf("client %d request %d: %d (close %v), %.100q", client, i, resp.StatusCode, resp.Close, got)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// A request that expects 100-continue pipelined behind another, its
// headers in the same write as the first request: fasthttp reads them from
// its buffer and flushes the first answer only before its next read, so a
// 100 Continue the handler wrote went out ahead of that answer (which a
// client takes as the first request's interim), and the answer stayed in
// the buffer while the handler waited for a body the client held back.
// Such a request is left to fasthttp, whose 100 goes out after the answer.
func TestExpectContinuePipelined(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	addr := strings.TrimPrefix(testkit.Serve(t, e, httpapi.Options{}), "http://")
	const post = "POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\n"
	c := dialExpect(t, addr)
	if _, err := io.WriteString(c.c, post+"Content-Length: 5\r\n\r\nhello"+post+"Content-Length: 20000\r\nExpect: 100-continue\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if resp, got := c.read(); resp.StatusCode != 200 || !strings.HasPrefix(got, "hello") {
		t.Fatalf("first on the wire: %d %.80q, want the first request's 200", resp.StatusCode, got)
	}
	if resp, got := c.read(); resp.StatusCode != 100 {
		t.Fatalf("second on the wire: %d %.80q, want the second request's 100 Continue", resp.StatusCode, got)
	}
	body := strings.Repeat("p", 20000)
	if _, err := io.WriteString(c.c, body); err != nil {
		t.Fatal(err)
	}
	if resp, got := c.read(); resp.StatusCode != 200 || !strings.HasPrefix(got, body[:256]) {
		t.Fatalf("second: %d %.80q, want 200 echoing its body", resp.StatusCode, got)
	}
}

// Over TLS the 100 Continue is written through the TLS connection (the
// drain's wrapper is above it): a raw write would corrupt the stream.
func TestExpectContinueOverTLS(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	tc := dialTLS(t, serveTLS(t, e, httpapi.Options{}))
	c := &expectConn{t: t, c: tc, br: bufio.NewReader(tc)}
	body := strings.Repeat("s", 20000)
	for i := 0; i < 3; i++ {
		if resp, got := c.ask("/v1/functions/echo/invoke", "", len(body)); resp.StatusCode != 100 {
			t.Fatalf("request %d: %d %s, want 100 Continue", i, resp.StatusCode, got)
		}
		if _, err := io.WriteString(tc, body); err != nil {
			t.Fatal(err)
		}
		if resp, got := c.read(); resp.StatusCode != 200 || !strings.HasPrefix(got, body[:256]) {
			t.Fatalf("request %d: %d %.80q, want 200 echoing its body", i, resp.StatusCode, got)
		}
	}
	if resp, _ := c.ask("/v1/functions/nosuch/invoke", "", len(body)); resp.StatusCode != 404 || !c.closed() {
		t.Fatalf("unknown function over TLS: %d, want 404 before the body and the connection closed", resp.StatusCode)
	}
}

// fasthttp gives a connection's request context back to its pool before
// it closes the connection, and the server hears of the close (ConnState)
// only after: a new connection's first request, read into that context,
// was taken for one pipelined on the closing connection, whose last
// handler had returned with no read since. Its expectation was left to
// fasthttp, which said 100 Continue before any handler and read the body
// under the read timeout alone: an unknown function's 404 came after the
// body, and a request whose body never came got 408 at the read timeout,
// not 504 at its deadline. Here the first connection's close is held, on
// one P so that fasthttp's pool hands its context to the next (a few
// rounds: under the race detector the pool drops some).
func TestExpectContinueOnAClosingConnectionsContext(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	const readTimeout = 4 * time.Second
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	hl := &holdListener{Listener: listenLoopback(t), closing: make(chan *heldConn, 1)}
	srv := httpapi.New(testkit.Door(e, nil, nil), e.Control(), httpapi.Options{ReadTimeout: readTimeout})
	addr := strings.TrimPrefix(serveOn(t, srv, hl, srv.Serve), "http://")
	for _, c := range []struct {
		name  string
		check func(t *testing.T, b *expectConn)
	}{
		{"unknown function", func(t *testing.T, b *expectConn) {
			if resp, got := b.ask("/v1/functions/nosuch/invoke", "", 20000); resp.StatusCode != 404 {
				t.Fatalf("%d %s, want 404 in place of 100 Continue", resp.StatusCode, got)
			}
		}},
		{"nothing after 100 Continue", func(t *testing.T, b *expectConn) {
			start := time.Now()
			if resp, got := b.ask("/v1/functions/echo/invoke", "X-Plover-Timeout-Ms: 300\r\n", 20000); resp.StatusCode != 100 {
				t.Fatalf("%d %s, want 100 Continue", resp.StatusCode, got)
			}
			resp, got := b.read()
			if took := time.Since(start); resp.StatusCode != 504 || took > readTimeout/2 {
				t.Fatalf("%d after %v: %.200s; want 504 at the 300 ms deadline, well before the %v read timeout",
					resp.StatusCode, took.Round(time.Millisecond), got, readTimeout)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			for round := 0; round < 4; round++ {
				hl.next.Store(true)
				a := dialExpect(t, addr)
				if _, err := io.WriteString(a.c, "GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"); err != nil {
					t.Fatal(err)
				}
				if resp, got := a.read(); resp.StatusCode != 200 {
					t.Fatalf("/healthz: %d %s", resp.StatusCode, got)
				}
				var held *heldConn
				select {
				case held = <-hl.closing:
				case <-time.After(5 * time.Second):
					t.Fatal("the server did not close the connection of a request that asked it to")
				}
				func() {
					defer close(held.release)
					c.check(t, dialExpect(t, addr))
				}()
			}
		})
	}
}

// holdListener holds the Close of the connection it accepts next, once
// asked (next), until the test releases it.
type holdListener struct {
	net.Listener
	next    atomic.Bool
	closing chan *heldConn // a held connection's Close began
}

func (l *holdListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil || !l.next.Swap(false) {
		return c, err
	}
	return &heldConn{Conn: c, l: l, release: make(chan struct{})}, nil
}

type heldConn struct {
	net.Conn
	l       *holdListener
	release chan struct{}
	once    sync.Once
}

func (c *heldConn) Close() error {
	c.once.Do(func() {
		c.l.closing <- c
		<-c.release
	})
	return c.Conn.Close()
}
