package httpapi_test

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
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
// (it was, and the server then waited for it).
func TestPanicOutsideTheHandlerIsRecovered(t *testing.T) {
	for _, tc := range []struct {
		hook, request string
		status        int    // the answer's (0: none, the connection closed)
		route         string // in the log line ("": not checked)
		function      string
	}{
		{"header", "GET /v1/functions/f HTTP/1.1\r\nHost: localhost\r\nX-Test-Panic: 1\r\n\r\n", 500, "GET /v1/functions/f", "f"},
		{"header", "POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\nX-Test-Panic: 1\r\nExpect: 100-continue\r\nContent-Length: 10\r\n\r\n",
			500, "POST /v1/functions/echo/invoke", "echo"},
		// Its body cut short (the client closes its side): fasthttp
		// answers that (ErrorHandler) and runs no handler; its mark must
		// not answer a later request.
		{"header", "POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\nX-Test-Panic: 1\r\nContent-Length: 100\r\n\r\nonly this",
			400, "POST /v1/functions/echo/invoke", "echo"},
		{"parse error", "GET /readyz HTTP/1.1\r\nHost: localhost\r\nContent-Length: nope\r\n\r\n", 500, "", ""},
		{"conn state", "GET /readyz HTTP/1.1\r\nHost: localhost\r\n\r\n", 0, "", ""},
	} {
		t.Run(tc.hook, func(t *testing.T) {
			var log testkit.LogBuffer
			reg := prometheus.NewRegistry()
			door := frontdoor.New(frontdoor.Config{Runner: testkit.PanicRunner{}, Metrics: reqmetrics.New(reg),
				Log: slog.New(slog.NewTextHandler(&log, nil))})
			srv := httpapi.New(door, panicAdmin{}, httpapi.Options{Registry: reg}) // a handler run would panic too, a second line
			httpapi.PanicIn(srv, tc.hook, "a bug in the "+tc.hook)
			url := testkit.ServeWith(t, srv)

			c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.WriteString(c, tc.request); err != nil {
				t.Fatal(err)
			}
			if tc.status == 400 {
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
			}
			for range 3 { // on fresh connections, the pooled request state perhaps the panicked one's
				if resp, err := http.Get(url + "/readyz"); err != nil || resp.StatusCode != 200 {
					t.Fatalf("the next request, GET /readyz: %v %v", resp, err)
				} else {
					resp.Body.Close()
				}
			}
			lines := testkit.PanicLines(log.String())
			if len(lines) != 1 || !strings.Contains(lines[0], `panic="a bug in the `+tc.hook+`"`) || !strings.Contains(lines[0], "stack=") ||
				!strings.Contains(lines[0], `route="`+tc.route) || strings.Contains(lines[0], "function=") != (tc.function != "") ||
				tc.function != "" && !strings.HasSuffix(lines[0], " function="+tc.function) {
				t.Fatalf("want one line about the panic, route %q, function %q:\n%s", tc.route, tc.function, log.String())
			}
			if n := testkit.Panics(t, reg, "http"); n != 1 {
				t.Errorf("plover_panics_total{transport=\"http\"} = %v, want 1", n)
			}
		})
	}
}
