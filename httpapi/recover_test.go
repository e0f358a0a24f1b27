package httpapi_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/funclog"
	"github.com/plover-run/plover/gate"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/ioshare"
	"github.com/plover-run/plover/reqmetrics"
)

// panicAdmin is a control plane with a bug: listing or describing a
// function panics.
type panicAdmin struct{ httpapi.Admin }

func (panicAdmin) Functions(context.Context) ([]api.FunctionInfo, error) {
	panic("a bug in Functions")
}

func (panicAdmin) Function(context.Context, string) (api.FunctionInfo, error) {
	panic("a bug in Function")
}

// landPanics is testkit.PanicRunner with I/O shares: a raw invoke finds
// its flow before its slot is lent (after its body is read), and the
// panic it meets is Land's.
type landPanics struct{ testkit.PanicRunner }

func (landPanics) IO(string) *ioshare.Flow { return nil }

// A request whose handling panics (a bug) is answered 500 internal in its
// route's error shape, on the API's address and the metrics one, and its
// connection closed; the panic is logged once, with its route, function
// and stack, and counted in plover_panics_total; the server goes on
// serving. fasthttp recovers no panic: one ended the process, every
// tenant's requests with it.
func TestPanicIsAnswered500(t *testing.T) {
	var log testkit.LogBuffer
	reg := prometheus.NewRegistry()
	door := frontdoor.New(frontdoor.Config{Runner: landPanics{}, Metrics: reqmetrics.New(reg),
		Log: slog.New(slog.NewTextHandler(&log, nil))})
	srv := httpapi.New(door, panicAdmin{}, httpapi.Options{Registry: reg})
	httpapi.PanicOnScrape(srv, "a bug in the scrape")
	api := testkit.ServeWith(t, srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.ServeMetrics(ln) // shut down with the API's server (ServeWith)
	metrics := "http://" + ln.Addr().String()

	client := &http.Client{Timeout: 10 * time.Second}
	do := func(method, url, body string, panics bool) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(method, url, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if panics {
			req.Header.Set("X-Test-Panic", "1")
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v (did the server die?)", method, url, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	for i, tc := range []struct {
		name, method, url, body  string
		panicked, says, function string
		next                     string // a request that must then be answered 200
	}{
		{"list", "GET", api + "/v1/functions", "", "a bug in Functions", `"code":"internal"`, "", api + "/readyz"},
		{"describe", "GET", api + "/v1/functions/f", "", "a bug in Function", `"code":"internal"`, "f", api + "/readyz"},
		{"invoke", "POST", api + "/v1/functions/echo/invoke", "some input", "a bug in Land", `"code":"internal"`, "echo", api + "/readyz"},
		{"v2 metadata", "GET", api + "/v2/models/m", "", "a bug in Pin", `{"error":"internal error`, "m", api + "/readyz"},
		{"scrape", "GET", api + "/metrics", "", "a bug in the scrape", `"code":"internal"`, "", api + "/metrics"},
		{"metrics address", "GET", metrics + "/metrics", "", "a bug in the scrape", `"code":"internal"`, "", metrics + "/metrics"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := do(tc.method, tc.url, tc.body, true)
			if resp.StatusCode != 500 || !strings.Contains(body, tc.says) || !strings.Contains(body, "plover_panics_total") {
				t.Fatalf("%s %s: %d %s, want 500 with %s", tc.method, tc.url, resp.StatusCode, body, tc.says)
			}
			if strings.Contains(body, tc.panicked) || strings.Contains(body, "goroutine") {
				t.Errorf("the answer tells the panic: %s", body)
			}
			if !resp.Close {
				t.Errorf("the connection of a request that panicked is kept open: %v", resp.Header)
			}
			if resp, body := do("GET", tc.next, "", false); resp.StatusCode != 200 {
				t.Fatalf("the next request, GET %s: %d %s", tc.next, resp.StatusCode, body)
			}
			lines := testkit.PanicLines(log.String())
			if len(lines) != i+1 {
				t.Fatalf("%d panics, %d lines logged:\n%s", i+1, len(lines), log.String())
			}
			line := lines[i]
			route := "route=\"" + tc.method + " " + strings.TrimPrefix(strings.TrimPrefix(tc.url, api), metrics) + "\""
			for _, want := range []string{"transport=http", route, "panic=\"" + tc.panicked + "\"", "stack=", `\npanic({`} {
				if !strings.Contains(line, want) {
					t.Errorf("the log line lacks %s: %s", want, line)
				}
			}
			if has := strings.Contains(line, "function="); has != (tc.function != "") || tc.function != "" && !strings.HasSuffix(line, " function="+tc.function) {
				t.Errorf("the log line should name function %q: %s", tc.function, line)
			}
		})
	}
	if _, body := do("GET", metrics+"/metrics", "", false); !strings.Contains(body, "plover_panics_total{transport=\"http\"} 6\n") ||
		!strings.Contains(body, "plover_panics_total{transport=\"grpc\"} 0\n") {
		t.Errorf("plover_panics_total after 6 panics over HTTP:\n%s", grep(body, "plover_panics_total"))
	}
}

// grep is the lines of s that hold sub.
func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// lookupOnce is a token table whose lookups after the first panic: a
// request is let in, and its followed log stream's recheck meets the bug.
type lookupOnce struct {
	gate.Tokens
	n *atomic.Int32
}

func (l lookupOnce) Lookup(tok []byte) *auth.Principal {
	if l.n.Add(1) > 1 {
		panic("a bug in Lookup")
	}
	return l.Tokens.Lookup(tok)
}

// A followed log stream is written after its handler returned, in a
// goroutine of fasthttp's, where a panic ended the process. Its answer has
// begun (200, lines): the panic closes the connection, so that the client
// finds the stream cut, not ended as a deleted function's is; it is logged
// and counted as the others, and the server goes on.
func TestPanicInAFollowedStreamCutsIt(t *testing.T) {
	defer httpapi.SetFollowTimes(30*time.Second, time.Hour)() // no keep-alive noise
	tok, err := auth.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	tab, err := auth.Parse(strings.NewReader(auth.Line("dash", auth.Read, auth.Hash(tok), []string{"f"}, auth.Limits{})+"\n"), "tokens")
	if err != nil {
		t.Fatal(err)
	}
	var log testkit.LogBuffer
	reg := prometheus.NewRegistry()
	door := frontdoor.New(frontdoor.Config{Gate: gate.New(lookupOnce{tab, new(atomic.Int32)}, nil), Metrics: reqmetrics.New(reg),
		Log: slog.New(slog.NewTextHandler(&log, nil))})
	adm := logAdmin{store: funclog.New(nil), followers: make(chan *funclog.Follower, 4)}
	url := testkit.ServeWith(t, httpapi.New(door, adm, httpapi.Options{Registry: reg}))
	adm.store.Sink("f").Add(logLine("before the bug"))

	req, _ := http.NewRequest("GET", url+"/v1/functions/f/logs?follow=true", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	client := &http.Client{Timeout: 30 * time.Second}
	resp, err := client.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("follow: %v %v", resp, err)
	}
	defer resp.Body.Close()
	<-adm.followers
	body := bufio.NewReader(resp.Body)
	if l, err := body.ReadString('\n'); err != nil || !strings.Contains(l, "before the bug") {
		t.Fatalf("the stream's first line: %q %v", l, err)
	}
	adm.store.Sink("f").Add(logLine("after")) // the stream asks the gate again before it writes it
	if rest, err := io.ReadAll(body); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("after the panic the stream read %q, %v: want it cut (unexpected EOF), not ended", rest, err)
	}
	if resp, err := client.Get(url + "/readyz"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("the next request, GET /readyz: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	onePanic(t, log.String(), reg, "GET /v1/functions/f/logs", "a bug in Lookup", "f")
}

// onePanic checks that log holds one line about a recovered panic, of
// panicked, with its stack, its route when route is set ("": not looked
// at) and function (""; none named), and that reg counted one over HTTP.
func onePanic(t *testing.T, log string, reg *prometheus.Registry, route, panicked, function string) {
	t.Helper()
	lines := testkit.PanicLines(log)
	if len(lines) != 1 || !strings.Contains(lines[0], `panic="`+panicked+`"`) || !strings.Contains(lines[0], "stack=") ||
		route != "" && !strings.Contains(lines[0], `route="`+route+`"`) || strings.Contains(lines[0], "function=") != (function != "") ||
		function != "" && !strings.HasSuffix(lines[0], " function="+function) {
		t.Errorf("want one line about the panic (%s), route %q, function %q:\n%s", panicked, route, function, log)
	}
	if n := testkit.Panics(t, reg, "http"); n != 1 {
		t.Errorf("plover_panics_total{transport=\"http\"} = %v, want 1", n)
	}
}

// slotRunner answers an invoke by writing "answer" into the request's
// output buffer where it has room, as the engine reuses the buffer a
// request brings; an input of "panic" has its output pointed at slot (the
// engine points it at a device slot, a worker's mapped memory) and panics,
// as a device's run with a bug does there.
type slotRunner struct {
	testkit.PanicRunner
	slot []byte
}

func (slotRunner) IO(string) *ioshare.Flow { return nil }

func (r slotRunner) Invoke(_ context.Context, _ string, req *call.Request) error {
	if string(req.Input) == "panic" {
		req.Output = r.slot[:0]
		panic("a bug in Invoke")
	}
	req.Output = append(req.Output[:0], "answer"...)
	return nil
}

// An invoke whose handling panicked leaves its exchange (the pooled
// per-request state) to the collector: its output buffer may be a device
// slot's memory, left there by the run, which the next request on the
// exchange took as its own and wrote its answer into (a slot the panicked
// request never released, to be unmapped with its worker: a fault then,
// not a panic).
func TestPanickedInvokeLeavesNoBufferBehind(t *testing.T) {
	slot := []byte("slot's bytes, the device's")
	srv := httpapi.New(frontdoor.New(frontdoor.Config{Runner: slotRunner{slot: slot}}), nil, httpapi.Options{})
	invoke := func(input string) (panicked any, body string) {
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod("POST")
		ctx.Request.SetRequestURI("/v1/functions/f/invoke")
		ctx.Request.Header.SetContentType("application/json")
		ctx.Request.SetBodyString(`{"input":"` + base64.StdEncoding.EncodeToString([]byte(input)) + `"}`)
		defer func() { panicked = recover() }()
		srv.Handle(&ctx) // in process: no recovery around it
		return nil, string(ctx.Response.Body())
	}
	for i := range 20 {
		if p, _ := invoke("panic"); p == nil {
			t.Fatal("the invoke did not panic")
		}
		if p, body := invoke("fine"); p != nil || !strings.Contains(body, base64.StdEncoding.EncodeToString([]byte("answer"))) {
			t.Fatalf("the next invoke: panic %v, %s", p, body)
		}
		if string(slot) != "slot's bytes, the device's" {
			t.Fatalf("round %d: the next invoke wrote its answer into the panicked one's slot: %q", i, slot)
		}
	}
}
