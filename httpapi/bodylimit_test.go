package httpapi_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"github.com/plover-run/plover/api"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/netguard"
)

// A function's max_input_bytes bounds what the server reads for it, not
// only --max-body: a body it could never take is a 413 at once, from its
// Content-Length or as a chunked body passes the bound, on every route
// that runs it, naming the bound; and it never waits for the body budget.
func TestFunctionBoundsItsBody(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	m := testkit.Manifest("small")
	m.MaxInputBytes = 3136 // the CNN's
	fi := testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	budget := netguard.NewBudget(128 << 10)
	addr := strings.TrimPrefix(testkit.Serve(t, e, httpapi.Options{BodyBudget: budget, MaxBodyBytes: 256 << 20}), "http://")
	const huge = 100 << 20
	// fasthttp reads up to 8 KiB of a body before any handler runs: a
	// client that sends (as curl does, after Expect: 100-continue) is
	// answered once it has.
	preRead := strings.Repeat("x", 8<<10)
	for _, tc := range []struct {
		name, head string
		body       string // sent after head; the rest of an announced body never is
		want       string
		code       int // 0: 413
	}{
		{"v1 raw", "POST /v1/functions/small/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: " + fmt.Sprint(huge) + "\r\n\r\n", preRead,
			"request body of 104857600 bytes is over the limit of 3136 bytes for function small (its max_input_bytes, 3136)", 0},
		{"v1 json", "POST /v1/functions/small/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: " + fmt.Sprint(huge) + "\r\n\r\n", preRead,
			"over the limit of 71808 bytes for function small (its max_input_bytes, 3136, as base64 in JSON)", 0},
		{"v2", "POST /v2/models/small/infer HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: " + fmt.Sprint(huge) + "\r\n\r\n", preRead,
			"over the limit of 165888 bytes for function small (its max_input_bytes, 3136, as JSON numbers)", 0},
		{"v2 binary extension", "POST /v2/models/small/infer HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nInference-Header-Content-Length: 100\r\nContent-Length: " + fmt.Sprint(huge) + "\r\n\r\n", preRead,
			"over the limit of 3236 bytes for function small", 0},
		{"v2 naming its version", "POST /v2/models/small/versions/" + fi.Version + "/infer HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: " + fmt.Sprint(huge) + "\r\n\r\n", preRead,
			"over the limit of 165888 bytes for function small", 0},
		{"v2 naming an unknown version", "POST /v2/models/small/versions/0123456789abcdef/infer HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: " + fmt.Sprint(huge) + "\r\n\r\n", preRead,
			"has no version", 404},
		{"v1 chunked", "POST /v1/functions/small/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
			fmt.Sprintf("%x\r\n%s\r\n", 16<<10, strings.Repeat("z", 16<<10)), "request body of more than 3136 bytes is over the limit of 3136 bytes for function small", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			code, b := firstResponse(t, addr, tc.head+tc.body, 3*time.Second)
			if tc.code == 0 {
				tc.code = 413
			}
			if code != tc.code {
				t.Fatalf("%d after %v, want %d at once", code, time.Since(start), tc.code)
			}
			if !strings.Contains(b, tc.want) {
				t.Fatalf("%d says %s, want it to say %q", code, b, tc.want)
			}
		})
	}

	// Bodies announced for a small function cannot hold the budget that a
	// function taking large inputs needs: eight such clients sending slowly
	// are refused at once, and a 100 KiB body to echo is served.
	big := testkit.Manifest("echo")
	big.MaxInputBytes = 1 << 20
	testkit.Deploy(t, e, testkit.BundleDir(t, big, nil))
	var wg sync.WaitGroup
	for range 8 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST /v1/functions/small/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", 1<<20)
		wg.Add(1)
		go func() { // what a hog sends, slowly, while the server lets it
			defer wg.Done()
			for range 16 {
				if _, err := c.Write(make([]byte, 16<<10)); err != nil {
					return
				}
			}
		}()
	}
	rs := rawExchangeWithin(t, addr, "POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: 102400\r\n\r\n"+strings.Repeat("y", 100<<10), 4*time.Second)
	if len(rs) == 0 || rs[0].StatusCode != 200 {
		t.Fatalf("a 100 KiB body for echo beside 8 clients sending 1 MiB bodies to small: %v (budget in use %d of %d)", statusOf(rs), budget.InUse(), budget.Max())
	}
	wg.Wait()
}

// A body a small function could take, sent and then stalled, holds no more
// of the body budget than the function's bound (plus the byte that tells a
// body too long): before, each held what it had sent plus a read window
// (4 KiB to 64 KiB, whatever buffer it was read into), so that eight such
// chunked bodies left no room for a 100 KiB body to echo (503 after 5 s).
func TestStalledBodyHoldsItsFunctionsBound(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	m := testkit.Manifest("small")
	m.MaxInputBytes = 3136
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	big := testkit.Manifest("echo")
	big.MaxInputBytes = 1 << 20
	testkit.Deploy(t, e, testkit.BundleDir(t, big, nil))
	const hogs, sent, echoBody = 8, 3000, 100 << 10
	budget := netguard.NewBudget(hogs*(3136+1) + echoBody + 1024)
	addr := strings.TrimPrefix(testkit.Serve(t, e, httpapi.Options{BodyBudget: budget, MaxBodyBytes: 256 << 20}), "http://")
	for range hogs {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST /v1/functions/small/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", sent, strings.Repeat("h", sent))
	}
	deadline := time.Now().Add(5 * time.Second)
	for budget.InUse() < hogs*sent { // the server has read what they sent
		if time.Now().After(deadline) {
			t.Fatalf("budget in use %d after 5 s, want the %d bytes the clients sent", budget.InUse(), hogs*sent)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if in := budget.InUse(); in > hogs*(3136+1) {
		t.Errorf("%d stalled bodies to a 3136-byte function hold %d bytes of the budget, over %d", hogs, in, hogs*(3136+1))
	}
	rs := rawExchangeWithin(t, addr, "POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: "+strconv.Itoa(echoBody)+"\r\n\r\n"+strings.Repeat("y", echoBody), 4*time.Second)
	if len(rs) == 0 || rs[0].StatusCode != 200 {
		t.Fatalf("a 100 KiB body for echo beside %d stalled bodies for small: %v (budget in use %d of %d)", hogs, statusOf(rs), budget.InUse(), budget.Max())
	}
}

// slowBudget has room for every window, but only after a wait: a body of
// many windows waited that long for each, up to the read timeout in all.
// Others hold it (InUse), so waiting bodies are never stuck (bodyroom.go).
type slowBudget struct{ wait time.Duration }

func (slowBudget) TryAcquire(int64) bool { return false }
func (b slowBudget) Acquire(ctx context.Context, _ int64) error {
	select {
	case <-time.After(b.wait):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
func (slowBudget) Release(int64)     {}
func (slowBudget) Max() int64        { return 0 }
func (slowBudget) InUse() int64      { return 1 << 40 }
func (slowBudget) TakePast(int64)    {}
func (slowBudget) ReleasePast(int64) {}

// dialSlowBudget serves echo (8 MiB in and out) with a slowBudget of wait
// and returns a connection to it.
func dialSlowBudget(t *testing.T, wait time.Duration) net.Conn {
	t.Helper()
	e := testkit.Engine(t, engine.Config{})
	m := testkit.Manifest("echo")
	m.MaxInputBytes, m.OutBytes = 8<<20, 8<<20
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	addr := strings.TrimPrefix(testkit.Serve(t, e, httpapi.Options{BodyBudget: slowBudget{wait}, MaxBodyBytes: 256 << 20}), "http://")
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// postWhileReading sends an echo invoke of n bytes on c, with header
// (lines ending in CRLF) among its headers, while it reads the answer: the
// server answers before it has read the body. It returns the status, the
// answer's body and how long it took.
func postWhileReading(t *testing.T, c net.Conn, header string, n int) (int, string, time.Duration) {
	t.Helper()
	start := time.Now()
	go io.WriteString(c, "POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\n"+header+"Content-Type: application/octet-stream\r\nContent-Length: "+strconv.Itoa(n)+"\r\n\r\n"+strings.Repeat("b", n))
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("after %v: %v", time.Since(start), err)
	}
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), time.Since(start).Round(time.Millisecond)
}

// A request waits for the body budget 5 s in all, however many windows its
// body takes: a 4 MiB body whose every window waited 0.7 s was answered
// after 7 s (and under contention, up to the read timeout); it is a 503 at 5 s.
func TestBudgetWaitIsPerRequest(t *testing.T) {
	st, body, took := postWhileReading(t, dialSlowBudget(t, 700*time.Millisecond), "", 4<<20)
	if st != 503 || !strings.Contains(body, "--max-body-memory") || took > 9*time.Second {
		t.Fatalf("%d after %v: %.200s; want 503 within about 5 s", st, took, body)
	}
}

// A request's deadline bounds its wait for the budget: one that asked
// for 200 ms is answered then, its deadline's 504 naming the budget, not
// the budget's 503 at 5 s.
func TestBudgetWaitEndsAtTheDeadline(t *testing.T) {
	st, body, took := postWhileReading(t, dialSlowBudget(t, time.Minute), "X-Plover-Timeout-Ms: 200\r\n", 1<<20)
	if st != 504 || !strings.Contains(body, "deadline") || !strings.Contains(body, "--max-body-memory") {
		t.Fatalf("%d after %v: %.300s; want 504 at the deadline, naming the budget", st, took, body)
	}
}

// What counts is the time spent waiting for the budget, not since the
// first wait: a client that pauses 6 s between two parts of its body, its
// windows waiting 10 ms each, is served.
func TestBudgetWaitCountsOnlyWaiting(t *testing.T) {
	c := dialSlowBudget(t, 10*time.Millisecond)
	const part = 100 << 10
	fmt.Fprintf(c, "POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n%s", 2*part, strings.Repeat("p", part))
	time.Sleep(6 * time.Second) // the client's pause, longer than the 5 s of waiting allowed
	io.WriteString(c, strings.Repeat("q", part))
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || len(b) < 2*part || string(b[part-1:part+1]) != "pq" {
		t.Fatalf("%d, %d bytes: %.200s; want the body echoed", resp.StatusCode, len(b), b)
	}
}

// firstResponse sends raw on a fresh connection and returns the first
// response's status and body (0 if none came within d).
func firstResponse(t *testing.T, addr, raw string, d time.Duration) (int, string) {
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
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// A client too slow to send its request, or one whose request line is
// over the read buffer, is told so in the status: 408 and 431, not 400.
func TestSlowAndOversizedRequests(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	addr := strings.TrimPrefix(testkit.Serve(t, e, httpapi.Options{ReadTimeout: 300 * time.Millisecond}), "http://")
	for _, tc := range []struct {
		name, raw string
		code      int
		want      string
	}{
		{"slow body", "POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: 60000\r\n\r\n" + strings.Repeat("s", 9000),
			408, "the request body did not arrive within the server's read timeout of 300ms"},
		{"slow chunked body", "POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nslow\r\n",
			408, "read timeout"},
		{"long request line", "GET /v1/functions/" + strings.Repeat("a", 5000) + " HTTP/1.1\r\nHost: localhost\r\n\r\n",
			431, "the request line and headers are over the server's limit of 4096 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := firstResponse(t, addr, tc.raw, 5*time.Second)
			if code != tc.code || !strings.Contains(body, tc.want) {
				t.Fatalf("%d %s; want %d saying %q", code, body, tc.code, tc.want)
			}
		})
	}
}

// The JSON bound holds what clients send: an FP16 written as the float64 it
// widens to takes 12 characters a byte (Python's .tolist() of a float16
// array), over the 8 of an earlier bound.
func TestJSONBoundTakesWideNumbers(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	const n = 16 << 10
	m := testkit.Manifest("half")
	m.MaxInputBytes, m.OutBytes = 2*n, 2*n
	m.Tensors = &abi.Tensors{Inputs: []abi.Tensor{{Name: "x", Datatype: "FP16", Shape: []int64{n}}}, Outputs: []abi.Tensor{{Name: "y", Datatype: "FP16", Shape: []int64{n}}}}
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	url := testkit.Serve(t, e, httpapi.Options{MaxBodyBytes: 256 << 20})
	var b bytes.Buffer
	b.WriteString(`{"inputs": [{"name": "x", "datatype": "FP16", "shape": [` + strconv.Itoa(n) + `], "data": [`)
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("0.00010001659393310547") // float(np.float16(1e-4))
	}
	b.WriteString(`]}]}`)
	resp, body := testkit.Post(t, "POST", url+"/v2/models/half/infer", "application/json", b.Bytes())
	if resp.StatusCode != 200 {
		t.Fatalf("%d bytes of JSON for %d bytes of FP16: %d %.200s", b.Len(), 2*n, resp.StatusCode, body)
	}
}

// A multipart body is not parsed before a handler runs (fasthttp would,
// for a streamed body, whatever its Content-Length: past the body limit,
// the budget, authentication and the I/O turns, parts beyond 16 MB to temp
// files): a 64 MiB multipart upload is refused from its headers, before
// its client sends it.
func TestMultipartIsNotReadAhead(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	addr := strings.TrimPrefix(testkit.Serve(t, e, httpapi.Options{MaxBodyBytes: 1 << 20}), "http://")
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: multipart/form-data; boundary=b\r\nContent-Length: %d\r\n\r\n--b\r\nContent-Disposition: form-data; name=\"f\"; filename=\"f\"\r\n\r\n%s", 64<<20, strings.Repeat("m", 16<<10)) // past the 8 KiB read with the headers
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a 64 MiB multipart upload while its body was not sent: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 413 && resp.StatusCode != 415 {
		t.Fatalf("%d: %.200s; want 413 or 415 from the headers", resp.StatusCode, body)
	}
}

// A JSON invoke's timeout_ms is the client's deadline when no header asked
// for one, in place of the server's timeout (longer or shorter), and only
// lowers a header's: each request queues behind a 600 ms run of the
// function's one instance, under a 300 ms server timeout.
func TestJSONTimeoutMs(t *testing.T) {
	e := testkit.Engine(t, engine.Config{Timeout: 300 * time.Millisecond})
	m := testkit.Slow("slow", 600)
	m.MaxInstances = 1
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	url := testkit.Serve(t, e, httpapi.Options{})
	invoke := func(header string, ms int) (int, string) {
		body := `{"input":"` + base64.StdEncoding.EncodeToString(make([]byte, 8)) + `"`
		if ms > 0 {
			body += `,"timeout_ms":` + strconv.Itoa(ms)
		}
		req, err := http.NewRequest("POST", url+"/v1/functions/slow/invoke", strings.NewReader(body+"}"))
		if err != nil {
			t.Error(err)
			return 0, ""
		}
		req.Header.Set("Content-Type", "application/json")
		if header != "" {
			req.Header.Set("X-Plover-Timeout-Ms", header)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return 0, ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, c := range []struct {
		name   string
		header string
		ms     int
		want   int
	}{
		{"the server's timeout", "", 0, 504},
		{"timeout_ms past the server's", "", 5000, 200},
		{"timeout_ms lowers a header's", "5000", 100, 504},
		{"a header past the server's", "5000", 0, 200},
		{"timeout_ms does not raise a header's", "100", 5000, 504},
	} {
		t.Run(c.name, func(t *testing.T) {
			blocked := make(chan int, 1)
			go func() { code, _ := invoke("5000", 0); blocked <- code }()
			testkit.WaitFor(t, e, "slow", "its instance busy", func(fi api.FunctionInfo) bool { return fi.Busy == 1 })
			if code, body := invoke(c.header, c.ms); code != c.want {
				t.Errorf("header %q, timeout_ms %d, queued behind a 600 ms run: %d %.200s; want %d", c.header, c.ms, code, body, c.want)
			}
			if code := <-blocked; code != 200 {
				t.Fatalf("the run ahead: %d", code)
			}
		})
	}
}

// A body still arriving when its request's deadline passes is answered
// then (504, naming the deadline), not at the read timeout (408), and its
// connection closed (its unread bytes are no request): a client that stops
// sending with a 300 ms deadline against a 4 s read timeout, wherever it
// stops. Right where fasthttp's 8 KiB pre-read ends, at once after 100
// Continue (no pre-read) and in a chunked body, the first read past the pre-read
// waited under the read timeout alone (408 at 4 s); over TLS, whose
// socket cannot be waited on, the deadline cut the read in the turn and
// was answered as the read timeout (408 at 300 ms).
func TestBodyLateForItsDeadline(t *testing.T) {
	const readTimeout = 4 * time.Second
	srv := bodyTimeouts(t, readTimeout, 300)
	head, sized := srv.head, srv.sized
	for _, c := range []struct {
		name   string
		tls    bool
		send   string // written at once
		expect bool   // send is written after a 100 Continue to headers that asked for it
	}{
		{name: "16 KiB of 1 MiB", send: sized(16 << 10)},
		{name: "stopped where the pre-read ends", send: sized(8 << 10)},
		{name: "chunked", send: head + "Transfer-Encoding: chunked\r\n\r\n" + fmt.Sprintf("%x\r\n%s\r\n", 16<<10, strings.Repeat("t", 16<<10))},
		{name: "nothing after 100 Continue", expect: true},
		{name: "over TLS", tls: true, send: sized(16 << 10)},
	} {
		t.Run(c.name, func(t *testing.T) {
			ec := srv.dial(t, c.tls)
			conn := ec.c
			start := time.Now()
			if c.expect {
				if resp, got := ec.ask("/v1/functions/echo/invoke", "X-Plover-Timeout-Ms: 300\r\n", 1<<20); resp.StatusCode != 100 {
					t.Fatalf("%d %s, want 100 Continue", resp.StatusCode, got)
				}
			}
			if _, err := io.WriteString(conn, c.send); err != nil {
				t.Fatal(err)
			}
			resp, body := ec.read()
			took := time.Since(start)
			t.Logf("%d after %v: %.200s", resp.StatusCode, took.Round(time.Millisecond), body)
			if resp.StatusCode != 504 || !strings.Contains(body, "deadline") || took > readTimeout/2 {
				t.Fatalf("%d after %v: %.200s; want 504 naming the 300 ms deadline, well before the %v read timeout",
					resp.StatusCode, took.Round(time.Millisecond), body, readTimeout)
			}
			if !ec.closed() {
				t.Fatal("the connection stays open after a body cut short: its unread bytes would be parsed as a request")
			}
		})
	}
}

// The request's deadline set on the connection for its body is not the
// next request's: fasthttp sets its own read deadline for each request on
// a kept-alive connection. A chunked body (bounded from its first byte) with
// a 300 ms deadline, answered, then a second request on the connection
// once that deadline has passed: answered too.
func TestBodyDeadlineIsNotTheNextRequests(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	ec := dialExpect(t, strings.TrimPrefix(testkit.Serve(t, e, httpapi.Options{ReadTimeout: 4 * time.Second}), "http://"))
	const head = "POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nX-Plover-Timeout-Ms: 300\r\nTransfer-Encoding: chunked\r\n\r\n"
	start := time.Now()
	for i := 0; i < 2; i++ {
		if _, err := io.WriteString(ec.c, head+"5\r\nhello\r\n0\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		if resp, body := ec.read(); resp.StatusCode != 200 || !strings.HasPrefix(body, "hello") || resp.Close {
			t.Fatalf("request %d: %d %.40q (close %v), want 200 echoing its body on a kept-alive connection", i, resp.StatusCode, body, resp.Close)
		}
		// Not synchronisation: the scenario is the first deadline past.
		time.Sleep(time.Until(start.Add(500 * time.Millisecond)))
	}
}

// The read timeout runs from where fasthttp sets it, before a request's
// headers (the connection's start for its first request), not from the
// request's start after them: a client that spends 1.2 s of a 2 s read
// timeout before its headers, then stops in its body, with a 1.5 s
// deadline that ends after the read timeout, gets the read timeout's 408
// at about 2 s. The request's deadline pushed the read timeout back:
// 504 at 2.7 s, its client kept its connection and body budget 0.7 s more.
func TestSlowHeadersGetTheReadTimeoutNotALaterDeadline(t *testing.T) {
	const readTimeout = 2 * time.Second
	srv := bodyTimeouts(t, readTimeout, 1500)
	head, sized := srv.head, srv.sized
	for _, c := range []struct {
		name, send string
		tls        bool
	}{
		{name: "16 KiB of 1 MiB", send: sized(16 << 10)},
		{name: "stopped where the pre-read ends", send: sized(8 << 10)},
		{name: "chunked", send: head + "Transfer-Encoding: chunked\r\n\r\n" + fmt.Sprintf("%x\r\n%s\r\n", 16<<10, strings.Repeat("t", 16<<10))},
		{name: "over TLS", send: sized(16 << 10), tls: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ec := srv.dial(t, c.tls)
			conn := ec.c
			start := time.Now()
			// Not synchronisation: the scenario is headers late in the
			// read timeout, which fasthttp set as the connection came.
			time.Sleep(1200 * time.Millisecond)
			if _, err := io.WriteString(conn, c.send); err != nil {
				t.Fatal(err)
			}
			resp, body := ec.read()
			took := time.Since(start)
			t.Logf("%d after %v: %.200s", resp.StatusCode, took.Round(time.Millisecond), body)
			if resp.StatusCode != 408 || !strings.Contains(body, "read timeout") || took > readTimeout+600*time.Millisecond {
				t.Fatalf("%d after %v: %.200s; want 408 naming the %v read timeout, before the deadline (2.7 s from the dial)",
					resp.StatusCode, took.Round(time.Millisecond), body, readTimeout)
			}
		})
	}
}

// bodyTimeoutServer serves echo (max_input_bytes 1 MiB) over TCP and TLS,
// for requests whose bodies stop short of a read timeout or deadline.
type bodyTimeoutServer struct {
	plain, secure string
	head          string // a request's head up to its body headers, with its deadline
}

func bodyTimeouts(t *testing.T, readTimeout time.Duration, timeoutMs int) bodyTimeoutServer {
	e := testkit.Engine(t, engine.Config{})
	m := testkit.Manifest("echo")
	m.MaxInputBytes, m.OutBytes = 1<<20, 1<<20
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	opts := httpapi.Options{ReadTimeout: readTimeout}
	return bodyTimeoutServer{
		plain:  strings.TrimPrefix(testkit.Serve(t, e, opts), "http://"),
		secure: serveTLS(t, e, opts),
		head:   "POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nX-Plover-Timeout-Ms: " + strconv.Itoa(timeoutMs) + "\r\n",
	}
}

// sized is a request of 1 MiB announced, its first n bytes sent.
func (s bodyTimeoutServer) sized(n int) string {
	return s.head + "Content-Length: 1048576\r\n\r\n" + strings.Repeat("t", n)
}

func (s bodyTimeoutServer) dial(t *testing.T, overTLS bool) *expectConn {
	if !overTLS {
		return dialExpect(t, s.plain)
	}
	conn := dialTLS(t, s.secure)
	return &expectConn{t: t, c: conn, br: bufio.NewReader(conn)}
}
