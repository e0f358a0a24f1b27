package httpapi_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/netguard"
)

// rawExchange sends raw on a fresh connection and returns every response
// the server writes until it closes the connection (or 3 s pass).
func rawExchange(t *testing.T, addr, raw string) []*http.Response {
	return rawExchangeWithin(t, addr, raw, 3*time.Second)
}

func rawExchangeWithin(t *testing.T, addr, raw string, d time.Duration) []*http.Response {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(d))
	br := bufio.NewReader(c)
	var out []*http.Response
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return out
		}
		io.Copy(io.Discard, resp.Body)
		out = append(out, resp)
		if resp.Close {
			return out
		}
	}
}

// A body the server does not read (a refusal, an early error) must not be
// parsed as the next request on the connection: such a request's connection
// is closed after the response. Both Content-Length and Transfer-Encoding,
// of any value, is refused and closed too.
func TestUnreadBodiesCloseTheConnection(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	tab, _ := benchTokens(t)
	addr := strings.TrimPrefix(testkit.ServeTokens(t, e, tab, httpapi.Options{MaxBodyBytes: 1 << 20}), "http://")
	smuggled := "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
	body := strings.Repeat("x", 8192) + smuggled // past fasthttp's 8 KiB pre-read
	tests := []struct {
		name   string
		raw    string
		status int
	}{
		{"refused with an unread body", fmt.Sprintf("POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n%s", len(body), body), 401},
		{"refused with an unread chunked body", fmt.Sprintf("POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(body), body), 401},
		{"wrong method with a body", fmt.Sprintf("PATCH /v1/functions/echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n%s", len(body), body), 401},
		{"Content-Length and chunked", "POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n" + smuggled, 400},
		{"Content-Length and identity", "POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: identity\r\nContent-Length: 5\r\n\r\nhello" + smuggled, 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rs := rawExchange(t, addr, tt.raw)
			if len(rs) != 1 || rs[0].StatusCode != tt.status || !rs[0].Close {
				var got []string
				for _, r := range rs {
					got = append(got, fmt.Sprintf("%d close=%v", r.StatusCode, r.Close))
				}
				t.Fatalf("responses %v, want exactly one %d that closes the connection", got, tt.status)
			}
		})
	}
}

// Every route gives back the body budget it took, whatever the outcome; a
// request that finds the budget held by another gets 503 after waiting, and
// runs once it is free.
func TestBodyBudget(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	m := testkit.Manifest("echo")
	m.MaxInputBytes = 2 << 20 // bodies held here are the function's to take
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	budget := netguard.NewBudget(256 << 10)
	url := testkit.Serve(t, e, httpapi.Options{BodyBudget: budget, MaxBodyBytes: 1 << 20})
	addr := strings.TrimPrefix(url, "http://")
	awaitBudget := func(t *testing.T, what string, ok func(int64) bool) {
		t.Helper()
		end := time.Now().Add(10 * time.Second)
		for !ok(budget.InUse()) {
			if time.Now().After(end) {
				t.Fatalf("%s: %d budget bytes in use", what, budget.InUse())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	chunk := func(s string) string { return fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(s), s) }
	for _, tt := range []struct{ name, raw string }{
		{"invoke", "POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: 3\r\n\r\nabc"},
		{"invoke chunked", "POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk("abc")},
		{"invoke json", "POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 14\r\n\r\n{\"input\":\"YQ\"}"},
		{"invoke bad json", "POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 1\r\n\r\n{"},
		{"invoke unknown", "POST /v1/functions/nope/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1\r\n\r\nx"},
		{"rollback", "POST /v1/functions/echo/rollback HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 21\r\n\r\n{\"version\":\"0000000\"}"},
		{"rollback chunked", "POST /v1/functions/echo/rollback HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(`{"version":"0000000"}`)},
		{"deploy garbage", "PUT /v1/functions/echo HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: 4\r\n\r\njunk"},
		{"body cut short", "POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: 100\r\n\r\nabc"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			raw := tt.raw
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			io.WriteString(c, raw)
			if strings.Contains(tt.name, "cut short") {
				c.(*net.TCPConn).CloseWrite() // the client gives up mid-body
			}
			c.SetReadDeadline(time.Now().Add(3 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			c.Close()
			if err != nil && !strings.Contains(tt.name, "cut short") {
				t.Fatal(err)
			}
			_ = resp
			// The release happens as the handler returns, just after the
			// response is written: wait for it.
			awaitBudget(t, "given back after "+tt.name, func(n int64) bool { return n == 0 })
		})
	}

	t.Run("a body cut midway gives back what it held", func(t *testing.T) {
		// A client announces 1 MiB, sends 190 KiB and leaves: the server
		// held what it sent (and the window it waited on), all given back.
		hog, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer hog.Close()
		fmt.Fprintf(hog, "POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", 1<<20)
		hog.Write(make([]byte, 190<<10))
		awaitBudget(t, "the hog's bytes held", func(n int64) bool { return n >= 190<<10 })
		hog.Close()
		awaitBudget(t, "the hog's bytes given back", func(n int64) bool { return n == 0 })
	})

	t.Run("full budget: 503, then room again", func(t *testing.T) {
		// The budget is held here, not by a hog connection: a hog that
		// waits on its socket takes a window for each read, and a second
		// request that took the room between two of them left the hog to
		// be refused (after its own 5 s wait, a few ms before the
		// second's), and the second to run.
		held := budget.Max() - 50_000
		if !budget.TryAcquire(held) {
			t.Fatalf("%d budget bytes in use before the test", budget.InUse())
		}
		released := false
		defer func() {
			if !released {
				budget.Release(held)
			}
		}()
		start := time.Now()
		rs := rawExchangeWithin(t, addr, "POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: 100000\r\n\r\n"+strings.Repeat("y", 100000), 10*time.Second)
		if len(rs) == 0 || rs[0].StatusCode != 503 {
			t.Fatalf("with the budget full: %d responses, first %v", len(rs), statusOf(rs))
		}
		t.Logf("503 after %v", time.Since(start))
		awaitBudget(t, "the refused request's bytes given back", func(n int64) bool { return n == held })
		budget.Release(held)
		released = true
		if rs := rawExchange(t, addr, "POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nConnection: close\r\nContent-Length: 100000\r\n\r\n"+strings.Repeat("y", 100000)); len(rs) != 1 || rs[0].StatusCode != 200 {
			t.Fatalf("with room again: %d responses, first %v", len(rs), statusOf(rs))
		}
	})
}

func statusOf(rs []*http.Response) int {
	if len(rs) == 0 {
		return 0
	}
	return rs[0].StatusCode
}

// A scrape takes no body: GET /metrics that carries one is answered without
// reading it, and its connection closed, as any request whose body is left
// unread. fasthttpadaptor (behind /metrics) reads a request's whole body
// into memory first: outside --max-body-memory and, chunked, past
// --max-body too, and a client that held the rest of its body back held
// its answer back until the read timeout.
func TestMetricsScrapeReadsNoBody(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	budget := netguard.NewBudget(1 << 20)
	url := testkit.Serve(t, e, httpapi.Options{BodyBudget: budget, MaxBodyBytes: 1 << 20, ReadTimeout: 30 * time.Second})
	addr := strings.TrimPrefix(url, "http://")
	const sent = 8 << 20 // past --max-body: a chunked body has no length to refuse
	for _, tc := range []struct {
		name, head string
		body       int
	}{
		{"chunked", fmt.Sprintf("Transfer-Encoding: chunked\r\n\r\n%x\r\n", 64<<20), sent},
		{"Content-Length", fmt.Sprintf("Content-Length: %d\r\n\r\n", 1<<20), 512 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			// The body's first bytes, and the rest held back: the
			// server has nothing to wait for before it answers.
			go func() {
				io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n"+tc.head)
				c.Write(make([]byte, tc.body))
			}()
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("no answer to a scrape with a %d-byte body still open after 5 s: %v", tc.body, err)
			}
			io.Copy(io.Discard, resp.Body)
			if resp.StatusCode != 200 || !resp.Close {
				t.Fatalf("%d close=%v, want 200 and the connection closed (its body unread)", resp.StatusCode, resp.Close)
			}
		})
	}
}
