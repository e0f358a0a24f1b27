package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/plover-run/plover/internal/racebuild"
)

// fakeServer answers invokes like a Plover server: a fixed body, the
// Server-Timing and X-Plover-Start headers, after delay; the first
// request is cold. Function "missing" gets a 404 JSON error.
type fakeServer struct {
	url   string
	delay time.Duration
	body  []byte
	hits  atomic.Int64
	inUse atomic.Int64
	peak  atomic.Int64
}

func startFake(t testing.TB, delay time.Duration, bodyLen int) *fakeServer {
	t.Helper()
	f := &fakeServer{delay: delay, body: make([]byte, bodyLen)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: f.handle}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown() })
	f.url = "http://" + ln.Addr().String()
	return f
}

func (f *fakeServer) handle(ctx *fasthttp.RequestCtx) {
	n := f.inUse.Add(1)
	defer f.inUse.Add(-1)
	atomicMax(&f.peak, n)
	if strings.Contains(string(ctx.Path()), "/missing/") {
		ctx.SetStatusCode(404)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":{"code":"not_found","message":"function \"missing\" not found"}}`)
		return
	}
	if f.delay > 0 {
		time.Sleep(f.delay)
	}
	start := "hot"
	if f.hits.Add(1) == 1 {
		start = "cold"
	}
	ctx.Response.Header.Set("X-Plover-Start", start)
	ctx.Response.Header.Set("Server-Timing", "queue;dur=0.001, load;dur=0.000, copyin;dur=0.010, kernels;dur=0.020, copyout;dur=0.030, total;dur=0.070")
	ctx.Response.SetBodyRaw(f.body) // no copy: allocations measured in this process are the client's
}

func TestClosedLoopRequestLimit(t *testing.T) {
	f := startFake(t, 0, 64)
	res, err := Run(context.Background(), Config{Server: f.url, Function: "echo", Input: []byte("hello"),
		Concurrency: 3, Requests: 500, Duration: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 500 || res.OK != 500 || f.hits.Load() != 500 || res.Stopped != "requests" {
		t.Fatalf("requests %d ok %d server saw %d stopped %q", res.Requests, res.OK, f.hits.Load(), res.Stopped)
	}
	if res.Starts != (Starts{Cold: 1, Hot: 499}) {
		t.Fatalf("starts %+v", res.Starts)
	}
	if res.Timing.Responses != 500 || res.Timing.Total.P50 != 0.07 || res.Timing.CopyOut.Mean != 0.03 {
		t.Fatalf("server breakdown %+v", res.Timing)
	}
	if res.Latency.N != 500 || res.Latency.P50 <= 0 || res.Latency.Max < res.Latency.P99 || res.Throughput <= 0 {
		t.Fatalf("latency %+v throughput %v", res.Latency, res.Throughput)
	}
	if f.peak.Load() > 3 {
		t.Fatalf("%d requests in flight with 3 workers", f.peak.Load())
	}
}

func TestClosedLoopDuration(t *testing.T) {
	f := startFake(t, 2*time.Millisecond, 8)
	t0 := time.Now()
	res, err := Run(context.Background(), Config{Server: f.url, Function: "echo", Concurrency: 2, Duration: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if el := time.Since(t0); el > 2*time.Second || res.Stopped != "duration" {
		t.Fatalf("took %v, stopped by %q", el, res.Stopped)
	}
	// 2 workers × 300ms / ≥2ms: at most 300 requests.
	if res.OK < 20 || res.OK > 310 {
		t.Fatalf("%d requests", res.OK)
	}
}

// At a rate the server keeps up with, the open loop sends on schedule: the
// number sent is rate × duration and almost none are late.
func TestOpenLoopOnSchedule(t *testing.T) {
	f := startFake(t, 0, 8)
	res, err := Run(context.Background(), Config{Server: f.url, Function: "echo", Rate: 200, Duration: time.Second, Concurrency: 8})
	if err != nil {
		t.Fatal(err)
	}
	o := res.Open
	if o == nil || res.Mode != "open" {
		t.Fatal("no open-loop report")
	}
	// This machine may be shared with other work: allow the odd request
	// that a descheduled worker could not start before the end.
	if o.Scheduled != 200 || o.Sent < 198 || o.Sent+o.Unsent != 200 || res.OK != o.Sent {
		t.Fatalf("scheduled %d sent %d unsent %d ok %d", o.Scheduled, o.Sent, o.Unsent, res.OK)
	}
	// Timer and scheduler jitter on a busy 2-core VM make some late; an
	// open loop that did not keep its schedule would make nearly all late.
	if o.Late > 100 {
		t.Fatalf("%d of 200 late at 200/s against an idle server (max lag %.2fms)", o.Late, o.MaxLagMs)
	}
	t.Logf("late %d, max lag %.3fms, wake lag mean %.3fms max %.3fms, p50 %.3fms", o.Late, o.MaxLagMs, o.WakeLagMeanMs, o.WakeLagMaxMs, res.Latency.P50)
	if el := res.Elapsed; el < 0.98 || el > 1.5 {
		t.Fatalf("elapsed %.3fs for 1s of schedule", el)
	}
}

// When the server is slower than the schedule, requests wait for a
// connection: they are counted late and their latency includes the wait
// (measured from the scheduled time), which is what the closed loop would
// hide. One connection, 20ms per request, 200 req/s for 0.5s: request k
// is due at 5k ms but cannot start before 20k ms, so the last of ~25
// sent waits ~0.4s and the p99 is far above the 20ms service time.
func TestOpenLoopCoordinatedOmission(t *testing.T) {
	f := startFake(t, 20*time.Millisecond, 8)
	res, err := Run(context.Background(), Config{Server: f.url, Function: "echo", Rate: 200, Duration: 500 * time.Millisecond, Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	o := res.Open
	if o.Scheduled != 100 {
		t.Fatalf("scheduled %d, want 100", o.Scheduled)
	}
	if o.Sent > 30 || o.Unsent < 70 || o.Sent+o.Unsent != o.Scheduled {
		t.Fatalf("sent %d unsent %d", o.Sent, o.Unsent)
	}
	if o.Late < o.Sent-2 {
		t.Fatalf("only %d of %d late", o.Late, o.Sent)
	}
	if res.Latency.Max < 300 || res.Latency.P50 < 100 {
		t.Fatalf("latency %+v: the queueing delay is missing", res.Latency)
	}
	if res.Timing.Total.Max > 1 {
		t.Fatalf("server total %v", res.Timing.Total)
	}
}

func TestErrorsCountedByStatus(t *testing.T) {
	f := startFake(t, 0, 8)
	res, err := Run(context.Background(), Config{Server: f.url, Function: "missing", Requests: 10})
	if err != nil {
		t.Fatal(err)
	}
	if res.OK != 0 || len(res.Errors) != 1 || res.Errors[0].Status != 404 || res.Errors[0].Count != 10 ||
		!strings.Contains(res.Errors[0].Message, "not_found") {
		t.Fatalf("errors %+v", res.Errors)
	}
	b, _ := json.Marshal(res)
	if !strings.Contains(string(b), `"status":404`) {
		t.Fatalf("json %s", b)
	}
}

func TestNoServerFailsFast(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens here now
	t0 := time.Now()
	res, err := Run(context.Background(), Config{Server: "http://" + addr, Function: "echo", Requests: 100000, Duration: 30 * time.Second})
	if err == nil || res == nil || res.Stopped != "errors" {
		t.Fatalf("err %v stopped %v", err, res)
	}
	if time.Since(t0) > 5*time.Second {
		t.Fatalf("took %v to give up", time.Since(t0))
	}
}

func TestRunInterrupted(t *testing.T) {
	f := startFake(t, time.Millisecond, 8)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	res, err := Run(ctx, Config{Server: f.url, Function: "echo", Rate: 50, Duration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if res.Stopped != "interrupted" || res.Open.Scheduled > 15 || res.Open.Unsent > 1 {
		t.Fatalf("stopped %q open %+v", res.Stopped, res.Open)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, c := range []Config{
		{Server: "http://127.0.0.1:1"},
		{Server: "127.0.0.1:1", Function: "f"},
		{Server: "ftp://x", Function: "f"},
		{Server: "http://127.0.0.1:1", Function: "f", Rate: -1},
		{Server: "http://127.0.0.1:1", Function: "f", Concurrency: -2},
		{Server: "http://127.0.0.1:1", Function: "f", Warmup: -1},
	} {
		if _, err := Run(context.Background(), c); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
}

// hotPath is one request as a worker sends and records it.
func hotPath(t testing.TB, bodyLen int) (func(), *run) {
	f := startFake(t, 0, bodyLen)
	cfg := Config{Server: f.url, Function: "echo", Input: make([]byte, 64)}
	if err := cfg.fill(); err != nil {
		t.Fatal(err)
	}
	r := &run{cfg: cfg, uri: f.url + "/v1/functions/echo/invoke", errBody: map[int]string{}, start: time.Now(),
		client: &fasthttp.HostClient{Addr: f.url[len("http://"):], MaxConns: 1, MaxIdemponentCallAttempts: 1}}
	snd := r.newHTTPSender()
	t.Cleanup(snd.close)
	var st Sample
	return func() {
		t0 := time.Now()
		rep, err := snd.send(context.Background())
		r.record(err, rep, time.Since(t0), &st)
		if err != nil || rep.code != 200 {
			t.Fatalf("%v %v", err, rep)
		}
	}, r
}

// The client side of a request allocates nothing once its connection is up,
// for small and for vecadd-sized (4 MiB) responses.
//
// Large sizes go first: fasthttp's response-body pool stops keeping
// buffers much larger than the sizes it has mostly seen (it calibrates
// after ~42,000 bodies), so a process that first read tens of thousands of
// small bodies reallocates large ones. A bench run reads one size.
func TestHotPathAllocs(t *testing.T) {
	if racebuild.Enabled {
		t.Skip("the race detector allocates")
	}
	for _, size := range []int{4 << 20, 256} {
		one, r := hotPath(t, size)
		for range 10 {
			one()
		}
		if n := testing.AllocsPerRun(200, one); n != 0 {
			t.Errorf("%d-byte responses: %v allocations per request on the client hot path", size, n)
		}
		if r.timed.Load() == 0 {
			t.Fatal("Server-Timing not parsed")
		}
	}
}

func BenchmarkClientRequest(b *testing.B) {
	for _, size := range []int{4 << 20, 256} { // large first: see TestHotPathAllocs
		b.Run(byteSize(size), func(b *testing.B) {
			one, _ := hotPath(b, size)
			one()
			b.ReportAllocs()
			for b.Loop() {
				one()
			}
		})
	}
}

func byteSize(n int) string {
	if n >= 1<<20 {
		return "out=" + itoa(n>>20) + "MiB"
	}
	return "out=" + itoa(n) + "B"
}

func itoa(n int) string {
	b := []byte{}
	for {
		b = append([]byte{byte('0' + n%10)}, b...)
		if n /= 10; n == 0 {
			return string(b)
		}
	}
}

func TestObserve(t *testing.T) {
	f := startFake(t, 0, 32)
	var n, cold int
	var bodyLen int
	res, err := Run(context.Background(), Config{Server: f.url, Function: "echo", Requests: 20,
		Observe: func(s *Sample) {
			n++
			if s.Start == Cold {
				cold++
			}
			bodyLen = len(s.Body)
			if !s.Timing.Complete() || s.Timing.Dur[Total] != 70*time.Microsecond || s.Latency <= 0 {
				t.Errorf("sample %+v", s)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	if n != 20 || cold != 1 || bodyLen != 32 || res.OK != 20 {
		t.Fatalf("observed %d (cold %d, body %d)", n, cold, bodyLen)
	}
}

// A server older than the scheduler sends no sched, resolve or dispatch
// (and one behind a proxy may send them on some responses only): a metric
// a response did not carry is not recorded as a zero, nor as the value an
// earlier response on the same connection carried, so the breakdown's n
// says how many responses reported it and an absent one reads n/a.
func TestServerTimingAbsentMetricsNotRecorded(t *testing.T) {
	const full = "queue;dur=0.001, sched;dur=0.5, load;dur=0, copyin;dur=0.01, kernels;dur=0.02, copyout;dur=0.03, resolve;dur=0.004, dispatch;dur=0.006, total;dur=0.6"
	const old = "queue;dur=0.001, load;dur=0, copyin;dur=0.01, kernels;dur=0.02, copyout;dur=0.03, total;dur=0.07"
	var hits atomic.Int64
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		h := old
		if hits.Add(1)%2 == 1 { // the 1st, 3rd, ...: a newer server's header
			h = full
		}
		ctx.Response.Header.Set("X-Plover-Start", "hot")
		ctx.Response.Header.Set("Server-Timing", h)
	}}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown() })
	var mu sync.Mutex
	var stale []string
	res, err := Run(context.Background(), Config{Server: "http://" + ln.Addr().String(), Function: "echo", Requests: 10,
		Observe: func(s *Sample) {
			if s.Timing.Has&(1<<Sched) == 0 && (s.Timing.Dur[Sched] != 0 || s.Timing.Dur[Dispatch] != 0) {
				mu.Lock()
				stale = append(stale, fmt.Sprintf("sched %v dispatch %v", s.Timing.Dur[Sched], s.Timing.Dur[Dispatch]))
				mu.Unlock()
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Timing.Responses != 10 || res.Timing.Total.N != 10 {
		t.Fatalf("%d responses timed, total n %d; want 10 and 10", res.Timing.Responses, res.Timing.Total.N)
	}
	for _, m := range []int{Sched, Resolve, Dispatch} {
		if s := res.Timing.Metric(m); s.N != 5 || s.P50 == 0 {
			t.Errorf("%s: n %d p50 %v: want the 5 responses that carried it (none of them 0)", MetricNames[m], s.N, s.P50)
		}
	}
	if len(stale) > 0 {
		t.Errorf("Observe saw an earlier response's values for metrics this one did not carry: %v", stale)
	}

	// A server that sends none of them: n 0, and the report says so
	// rather than print a zero wait.
	f := startFake(t, 0, 8)
	res, err = Run(context.Background(), Config{Server: f.url, Function: "echo", Requests: 5})
	if err != nil {
		t.Fatal(err)
	}
	if res.Timing.Sched.N != 0 || res.Timing.Total.N != 5 {
		t.Fatalf("sched n %d, total n %d: want 0 and 5", res.Timing.Sched.N, res.Timing.Total.N)
	}
	var b strings.Builder
	res.WriteText(&b)
	if !regexp.MustCompile(`(?m)^  sched +- +- +- +-$`).MatchString(b.String()) {
		t.Errorf("the report's sched row is not n/a:\n%s", b.String())
	}
	// Dispatch's parts, under it.
	if !regexp.MustCompile(`(?m)^  dispatch +- +- +- +-\n    handoff +- +- +- +-\n    handback +- +- +- +-$`).MatchString(b.String()) {
		t.Errorf("the report's handoff and handback rows are not n/a under dispatch:\n%s", b.String())
	}
}

// An open loop offers rate × duration requests: at 1800/s the interval is
// 555,555.5̅ ns, and request k = rate × duration is due exactly at the
// end, not a nanosecond before it by rounding, so it is neither sent nor
// counted as due.
func TestOpenLoopOffersRateTimesDuration(t *testing.T) {
	f := startFake(t, 0, 8)
	for _, tt := range []struct {
		rate float64
		d    time.Duration
		want int64
	}{
		{1800, 100 * time.Millisecond, 180},
		{700, 100 * time.Millisecond, 70},
		{300, 200 * time.Millisecond, 60},
	} {
		res, err := Run(context.Background(), Config{Server: f.url, Function: "echo", Rate: tt.rate, Duration: tt.d, Concurrency: 8})
		if err != nil {
			t.Fatal(err)
		}
		if o := res.Open; o.Scheduled != tt.want || o.Sent+o.Unsent != tt.want {
			t.Errorf("%g/s for %v: scheduled %d, sent %d + unsent %d; want %d due", tt.rate, tt.d, o.Scheduled, o.Sent, o.Unsent, tt.want)
		}
	}
}

// A server that answers, if only with errors, is there: transport errors
// among its HTTP errors (an overloaded server that also drops
// connections) do not stop the run as "the server did not answer" nor
// fail it as "no response", which sends the user to start a server.
func TestHTTPErrorsWithTransportErrorsAreNotNoServer(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hits.Add(1)%2 == 0 {
			panic(http.ErrAbortHandler) // the connection closed, no response
		}
		http.Error(w, `{"error":{"code":"unavailable","message":"queue full"}}`, http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	res, err := Run(context.Background(), Config{Server: srv.URL, Function: "echo", Requests: 100})
	if err != nil {
		t.Errorf("Run: %v", err)
	}
	if res.Stopped != "requests" || res.Requests != 100 {
		t.Fatalf("stopped by %q after %d requests, want the request limit, 100: %+v", res.Stopped, res.Requests, res.Errors)
	}
	var n503, none int64
	for _, e := range res.Errors {
		switch e.Status {
		case 503:
			n503 = e.Count
		case 0:
			none = e.Count
		}
	}
	if n503 != 50 || none != 50 {
		t.Fatalf("errors %+v: want 50 × 503 and 50 without a response", res.Errors)
	}
}
