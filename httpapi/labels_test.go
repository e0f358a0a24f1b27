package httpapi_test

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/valyala/fasthttp"

	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/gate"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/pipeline"
	"github.com/plover-run/plover/reqmetrics"
)

// labelServer is an engine with echo and the pipelines named, a server
// with one admin token over them, and the registry both count on.
func labelServer(t *testing.T, pipes ...string) (*engine.Engine, *httpapi.Server, *prometheus.Registry, string) {
	t.Helper()
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	for _, p := range pipes {
		dir := testkit.PipelineDir(t, p, "echo", "echo")
		testkit.Deploy(t, e, dir)
	}
	tok, err := auth.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	tab, err := auth.Parse(strings.NewReader(auth.Line("ops", auth.Admin, auth.Hash(tok), []string{"*"}, auth.Limits{})+"\n"), "tokens")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(e.Collector())
	door := frontdoor.New(frontdoor.Config{Runner: pipeline.New(e, reg), Gate: gate.New(tab, reg), Metrics: reqmetrics.New(reg)})
	srv := httpapi.New(door, e.Control(), httpapi.Options{Registry: reg})
	return e, srv, reg, tok
}

// checkLabels gathers reg (which fails on a label that is not UTF-8, or on
// two series that became one) and checks every function and pipeline
// label is one of want.
func checkLabels(t *testing.T, reg *prometheus.Registry, want ...string) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	ok := map[string]bool{"_unknown": true}
	for _, w := range want {
		ok[w] = true
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			checkPairs(t, mf, m, ok)
		}
	}
}

func checkPairs(t *testing.T, mf *dto.MetricFamily, m *dto.Metric, ok map[string]bool) {
	t.Helper()
	for _, lp := range m.GetLabel() {
		if n := lp.GetName(); (n == "function" || n == "pipeline") && !ok[lp.GetValue()] {
			t.Errorf("%s has %s=%q", mf.GetName(), n, lp.GetValue())
		}
		if !utf8.ValidString(lp.GetValue()) {
			t.Errorf("%s has a label that is not UTF-8: %q", mf.GetName(), lp.GetValue())
		}
	}
}

// A pipeline's name, borrowed from the request buffer, must not become a
// metric label: the next request on the connection overwrites the bytes
// under it (an unauthenticated one with bytes that are not UTF-8 broke
// /metrics for everyone until a restart).
func TestPipelineLabelsOutliveTheRequestBuffer(t *testing.T) {
	_, srv, reg, tok := labelServer(t, "pipe")
	var ctx fasthttp.RequestCtx // reused, as on a keep-alive connection
	ctx.Init(&fasthttp.Request{}, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}, nil)
	do := func(uri, token string) int {
		ctx.Request.Reset()
		ctx.Response.Reset()
		ctx.Request.Header.SetMethod("POST")
		ctx.Request.SetRequestURI(uri)
		ctx.Request.Header.SetContentType("application/octet-stream")
		if token != "" {
			ctx.Request.Header.Set("Authorization", "Bearer "+token)
		}
		ctx.Request.SetBody([]byte("hi"))
		srv.Handle(&ctx)
		return ctx.Response.StatusCode()
	}
	if c := do("/v1/functions/pipe/invoke", tok); c != 200 {
		t.Fatalf("pipe: %d", c)
	}
	for _, uri := range []string{"/v1/functions/%ff%fe%fd%fc/invoke", "/v2/models/%ff%fe%fd%fc/infer"} {
		if c := do(uri, ""); c != 401 {
			t.Fatalf("%s without a token: %d, want 401", uri, c)
		}
	}
	if c := do("/v1/functions/pipf/invoke", tok); c != 404 { // one byte apart from pipe
		t.Fatalf("pipf: %d, want 404", c)
	}
	checkLabels(t, reg, "echo", "pipe")
}

// The same under concurrent keep-alive clients of a real server, some
// refused, with /metrics scraped while they run and after.
func TestLabelsUnderConcurrentKeepAliveTraffic(t *testing.T) {
	pipes := []string{"pipe-a", "pipe-bb", "pipe-ccc"}
	_, srv, reg, tok := labelServer(t, pipes...)
	base := testkit.ServeWith(t, srv)
	const clients, rounds = 4, 40
	var wg sync.WaitGroup
	errs := make(chan error, clients+1)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			hc := &fasthttp.HostClient{Addr: strings.TrimPrefix(base, "http://"), MaxConns: 1} // one keep-alive connection
			for i := range rounds {
				p := pipes[(c+i)%len(pipes)]
				if code := post(hc, base+"/v1/functions/"+p+"/invoke", tok); code != 200 {
					errs <- fmt.Errorf("client %d: %s: %d", c, p, code)
					return
				}
				if code := post(hc, base+"/v1/functions/%ff%fe%fd%fc%fb"+strings.Repeat("%80", i%7)+"/invoke", ""); code != 401 {
					errs <- fmt.Errorf("client %d: a name that is not UTF-8 without a token: %d, want 401", c, code)
					return
				}
			}
		}()
	}
	wg.Add(1)
	go func() { // scrapes through the same API while the clients run
		defer wg.Done()
		hc := &fasthttp.HostClient{Addr: strings.TrimPrefix(base, "http://")}
		for range rounds {
			if code := get(hc, base+"/metrics", tok); code != 200 {
				errs <- fmt.Errorf("/metrics during the traffic: %d", code)
				return
			}
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	checkLabels(t, reg, append(pipes, "echo")...)
}

func post(hc *fasthttp.HostClient, url, token string) int {
	return exchange(hc, "POST", url, token, []byte("hi"))
}

func get(hc *fasthttp.HostClient, url, token string) int {
	return exchange(hc, "GET", url, token, nil)
}

func exchange(hc *fasthttp.HostClient, method, url, token string, body []byte) int {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(method)
	req.SetRequestURI(url)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.Header.SetContentType("application/octet-stream")
		req.SetBody(body)
	}
	if err := hc.Do(req, resp); err != nil {
		return -1
	}
	return resp.StatusCode()
}
