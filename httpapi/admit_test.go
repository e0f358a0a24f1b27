package httpapi_test

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// A function whose queue is full refuses a request before reading its
// body: a client that announces 32 KiB and sends only the first 8 KiB (what
// fasthttp reads before any handler runs) gets 429 with Retry-After at
// once, on /v1 and on /v2; both are counted in fn's client errors (plover
// ls), as /metrics counts them, though the engine never saw them.
func TestFullQueueRefusedBeforeTheBody(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	url := testkit.Serve(t, e, httpapi.Options{})
	host := strings.TrimPrefix(url, "http://")
	fillFn(t, e, url)
	p, err := e.Pin(context.Background(), "fn", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Full(); err == nil {
		t.Fatal("Full: nil with one running and one queued")
	}
	p.Release()
	for _, path := range []string{"/v1/functions/fn/invoke", "/v2/models/fn/infer"} {
		c, err := net.DialTimeout("tcp", host, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second)) // the server's own read timeout is 60 s
		// 32 KiB: within fn's max_input_bytes (64 KiB), or that would be
		// the answer.
		head := "POST " + path + " HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: 32768\r\n\r\n"
		if _, err := c.Write(append([]byte(head), make([]byte, 8<<10)...)); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%s: no answer before the body was sent: %v", path, err)
		}
		resp.Body.Close()
		c.Close()
		if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("%s: %d, Retry-After %q; want 429", path, resp.StatusCode, resp.Header.Get("Retry-After"))
		}
	}
	if fi, err := e.Control().Function(t.Context(), "fn"); err != nil || fi.ClientErrors != 2 || fi.Errors != 0 {
		t.Fatalf("fn: %d client errors, %d errors (%v); want the two 429s as client errors", fi.ClientErrors, fi.Errors, err)
	}
}

// fillFn deploys fn (1 s runs, one instance, a queue of one) and fills its
// queue through url: one request running, one queued, until the test ends.
func fillFn(t *testing.T, e *engine.Engine, url string) {
	t.Helper()
	m := testkit.Slow("fn", 1000)
	m.MaxInstances, m.MaxQueue = 1, 1
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	post := func() {
		resp, err := http.Post(url+"/v1/functions/fn/invoke", "application/octet-stream", strings.NewReader("x"))
		if err == nil {
			resp.Body.Close()
		}
	}
	post() // loaded
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); post() }()
		testkit.WaitFor(t, e, "fn", "running and queued", testkit.Busy(1, i))
	}
}
