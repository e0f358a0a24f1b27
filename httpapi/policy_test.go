package httpapi_test

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

func TestBackpressureDeadlinesMetrics(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	m := testkit.Slow("slow", 600)
	m.MaxInstances, m.MaxQueue = 1, 1
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	reg := prometheus.NewRegistry()
	reg.MustRegister(e.Collector())
	srv := httpapi.New(testkit.Door(e, nil, reg), e.Control(), httpapi.Options{Registry: reg})
	base := testkit.ServeWith(t, srv)
	url := base + "/v1/functions/slow/invoke"

	// post may run on other goroutines: a transport error shows as status 0.
	post := func(hdr map[string]string) *http.Response {
		req, _ := http.NewRequest("POST", url, strings.NewReader("x"))
		req.Header.Set("Content-Type", "application/octet-stream")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return &http.Response{StatusCode: 0, Header: http.Header{}}
		}
		resp.Body.Close()
		return resp
	}
	var wg sync.WaitGroup
	codes := make([]int, 2)
	for i := range codes { // one runs, one queues
		wg.Add(1)
		go func() { defer wg.Done(); codes[i] = post(nil).StatusCode }()
		testkit.WaitFor(t, e, "slow", "request running or queued", testkit.Busy(1, i))
	}
	full := post(nil)
	if full.StatusCode != 429 || full.Header.Get("Retry-After") == "" {
		t.Fatalf("full queue: %d Retry-After=%q", full.StatusCode, full.Header.Get("Retry-After"))
	}
	wg.Wait()
	if codes[0] != 200 || codes[1] != 200 {
		t.Fatalf("running and queued requests: %v", codes)
	}
	go post(nil) // occupy the instance again
	testkit.WaitFor(t, e, "slow", "the instance busy again", testkit.Busy(1, 0))
	if r := post(map[string]string{"X-Plover-Timeout-Ms": "50"}); r.StatusCode != 504 {
		t.Fatalf("deadline shorter than the wait: %d, want 504", r.StatusCode)
	}
	if r := post(map[string]string{"X-Plover-Timeout-Ms": "soon"}); r.StatusCode != 400 {
		t.Fatalf("bad timeout header: %d", r.StatusCode)
	}

	resp, body := testkit.Post(t, "GET", base+"/metrics", "", nil)
	text := string(body)
	for _, want := range []string{
		`plover_requests_total{code="200",function="slow"} 2`,
		`plover_requests_total{code="429",function="slow"} 1`,
		`plover_requests_total{code="504",function="slow"} 1`,
		`plover_request_duration_seconds_count{function="slow",phase="kernels"}`,
		`plover_starts_total{function="slow",kind="cold"} 1`,
		`plover_instances{function="slow",state=`,
		`plover_device_memory_bytes{device=`,
		`plover_queue_depth{function="slow"}`,
	} {
		if resp.StatusCode != 200 || !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if r, _ := testkit.Post(t, "GET", base+"/readyz", "", nil); r.StatusCode != 200 {
		t.Fatalf("readyz %d", r.StatusCode)
	}
	srv.SetReady(false)
	if r, _ := testkit.Post(t, "GET", base+"/readyz", "", nil); r.StatusCode != 503 {
		t.Fatalf("readyz when draining: %d", r.StatusCode)
	}
}

// A client that leaves while its request is queued frees the queue slot at
// once, and the request never runs, whichever route it came by (/v1 raw or
// JSON, /v2 JSON or binary).
func TestClientDisconnectFreesQueueSlot(t *testing.T) {
	for _, tc := range []struct{ name, request string }{
		{"v1 raw", "POST /v1/functions/slow/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: 0\r\n\r\n"},
		{"v1 json", "POST /v1/functions/slow/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n{\"input\":\"\"}"},
		{"v2 json", "POST /v2/models/slow/infer HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 72\r\n\r\n" +
			`{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[1],"data":[1]}]}`},
		{"v2 binary", "POST /v2/models/slow/infer HTTP/1.1\r\nHost: localhost\r\nInference-Header-Content-Length: 97\r\nContent-Length: 98\r\n\r\n" +
			`{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[1],"parameters":{"binary_data_size":1}}]}` + "\x01"},
	} {
		t.Run(tc.name, func(t *testing.T) { clientLeavesQueue(t, tc.request) })
	}
}

func clientLeavesQueue(t *testing.T, request string) {
	e := testkit.Engine(t, engine.Config{})
	m := testkit.Manifest("slow")
	m.MaxInstances, m.MaxQueue = 1, 1
	m.Chain = []abi.Launch{{Kernel: "sleep_ms", Grid: 1500, Block: 1}, {Kernel: "count", Grid: 1, Block: 1}}
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	base := testkit.Serve(t, e, httpapi.Options{})
	addr := strings.TrimPrefix(base, "http://")
	send := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "POST /v1/functions/slow/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: 0\r\n\r\n")
		return c
	}
	running := send() // holds the only instance for 1.5 s
	defer running.Close()
	waitQueue := func(want int) time.Duration {
		t.Helper()
		start := time.Now()
		for time.Since(start) < time.Second {
			if fi, err := e.Control().Function(t.Context(), "slow"); err == nil && fi.Queue == want && fi.Busy == 1 {
				return time.Since(start)
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Fatalf("queue depth never reached %d", want)
		return 0
	}
	waitQueue(0) // the first request is running
	queued, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(queued, request)
	waitQueue(1)
	queued.Close() // the client gives up
	freed := waitQueue(0)
	t.Logf("queue slot freed %v after the client closed", freed)
	// The slot is usable again, long before the running request ends...
	third := send()
	defer third.Close()
	waitQueue(1)
	// ...and the abandoned request never ran: the counter shows two runs.
	resp, err := http.ReadResponse(bufio.NewReader(running), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("running request: %v %v", resp, err)
	}
	resp, err = http.ReadResponse(bufio.NewReader(third), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("third request: %v %v", resp, err)
	}
	out := make([]byte, 8)
	if _, err := io.ReadFull(resp.Body, out); err != nil || binary.LittleEndian.Uint64(out) != 2 {
		t.Fatalf("third request saw count %v (%v), want 2: the abandoned request ran", out, err)
	}
}
