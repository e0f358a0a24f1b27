package httpapi_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/netguard"
	"github.com/plover-run/plover/objectstore"
)

// The function name in the URL is borrowed from fasthttp's request buffer,
// which the next request on the connection overwrites. Nothing may keep it.
func TestNameIsNotKeptFromTheRequestBuffer(t *testing.T) {
	store, err := objectstore.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	testkit.Deploy(t, testkit.Engine(t, engine.Config{Store: store}), testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	node := testkit.Engine(t, engine.Config{Store: store}) // resolves "echo" on its first request
	reg := prometheus.NewRegistry()
	reg.MustRegister(node.Collector())
	srv := httpapi.New(testkit.Door(node, nil, reg), node.Control(), httpapi.Options{Registry: reg})

	var ctx fasthttp.RequestCtx // reused, as on a keep-alive connection
	ctx.Init(&fasthttp.Request{}, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}, nil)
	do := func(uri string) int {
		ctx.Response.Reset()
		ctx.Request.Header.SetMethod("POST")
		ctx.Request.SetRequestURI(uri)
		ctx.Request.Header.SetContentType("application/octet-stream")
		ctx.Request.SetBody([]byte("hi"))
		srv.Handle(&ctx)
		return ctx.Response.StatusCode()
	}
	if c := do("/v1/functions/echo/invoke"); c != 200 {
		t.Fatalf("echo: %d", c)
	}
	if c := do("/v1/functions/zzzz/invoke"); c != 404 {
		t.Fatalf("zzzz: %d", c)
	}
	req := &call.Request{Input: []byte("x")}
	if err := node.Invoke(context.Background(), "echo", req); err != nil || req.Start != call.Hot {
		t.Fatalf("echo after the buffer was reused: %v, start %v (want hot: same function entry)", err, req.Start)
	}
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "function" && lp.GetValue() != "echo" && lp.GetValue() != "_unknown" {
					t.Errorf("%s has function=%q", mf.GetName(), lp.GetValue())
				}
			}
		}
	}
}

// A graceful shutdown drains queued requests; they must not fail because
// the server stopped accepting.
func TestShutdownDrainsQueuedRequests(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	m := testkit.Slow("slow", 400)
	m.MaxInstances = 1
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	srv := httpapi.New(testkit.Door(e, nil, nil), e.Control(), httpapi.Options{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	url := "http://" + ln.Addr().String() + "/v1/functions/slow/invoke"
	var wg sync.WaitGroup
	codes := make([]int, 2)
	for i := range codes { // one runs, one queues behind it
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, _ := testkitPost(url)
			codes[i] = resp
		}()
		testkit.WaitFor(t, e, "slow", "request running or queued", testkit.Busy(1, i))
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if codes[0] != 200 || codes[1] != 200 {
		t.Fatalf("running and queued requests during shutdown: %v, want 200 200", codes)
	}
}

func testkitPost(url string) (int, error) {
	c := &fasthttp.Client{}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod("POST")
	req.SetRequestURI(url)
	req.Header.SetContentType("application/octet-stream")
	req.SetBody([]byte("q"))
	if err := c.Do(req, resp); err != nil {
		return 0, err
	}
	if !strings.HasPrefix(string(resp.Body()), "q") {
		return -1, nil
	}
	return resp.StatusCode(), nil
}

// A client still sending a large body when the server answers without
// reading it (404: no such function; 413: over the function's input
// bound) reads the answer, not a connection reset: the server's close
// lingers. Without it this failed now and then (the e2e "invoke after rm").
func TestEarlyAnswerReachesSendingClient(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	m := testkit.Manifest("small")
	m.MaxInputBytes = 1024
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	srv := httpapi.New(testkit.Door(e, nil, nil), e.Control(), httpapi.Options{})
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := netguard.NewListener(inner, 0)
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	body := bytes.Repeat([]byte{7}, 8<<20)
	for _, tc := range []struct {
		fn   string
		want int
	}{{"gone", 404}, {"small", 413}} {
		for i := range 10 {
			// A fresh connection each time: the answer closes it.
			c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
			resp, err := c.Post("http://"+ln.Addr().String()+"/v1/functions/"+tc.fn+"/invoke",
				"application/octet-stream", bytes.NewReader(body))
			if err != nil {
				t.Fatalf("%s, try %d: %v", tc.fn, i, err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("%s, try %d: status %d, want %d", tc.fn, i, resp.StatusCode, tc.want)
			}
		}
	}
}
