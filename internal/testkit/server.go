package testkit

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/gate"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/netguard"
	"github.com/plover-run/plover/objectstore"
	"github.com/plover-run/plover/pipeline"
	"github.com/plover-run/plover/reqmetrics"
)

// Engine returns an engine over a fresh filesystem store and cache with one
// host device. cfg's Store, Cache and Devices are filled in when empty.
func Engine(t testing.TB, cfg engine.Config) *engine.Engine {
	t.Helper()
	dir := t.TempDir()
	if cfg.Store == nil {
		s, err := objectstore.NewFS(filepath.Join(dir, "store"))
		if err != nil {
			t.Fatal(err)
		}
		cfg.Store = s
	}
	if cfg.Cache == nil {
		c, err := bundle.NewCache(filepath.Join(dir, "cache"), 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Cache = c
	}
	if len(cfg.Devices) == 0 {
		cfg.Devices = []device.Device{device.NewHost(0)}
	}
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

// Serve runs the HTTP API for e on a free loopback port until the test
// ends and returns its base URL.
func Serve(t testing.TB, e *engine.Engine, opts httpapi.Options) string {
	t.Helper()
	return ServeTokens(t, e, nil, opts)
}

// ServeTokens is Serve with tokens authenticating every request but the
// probes (nil: none); the door's request metrics are on opts.Registry (nil:
// a registry of the server's own), where /metrics serves them.
func ServeTokens(t testing.TB, e *engine.Engine, tokens gate.Tokens, opts httpapi.Options) string {
	t.Helper()
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	return ServeWith(t, httpapi.New(Door(e, tokens, opts.Registry), e.Control(), opts))
}

// Door is a front door over e as plover serve builds one: e's functions
// and pipelines, its request timeout, tokens (nil: no authentication) and
// the request and pipeline step metrics on reg (nil: a registry of the
// door's own), whose series of a function deleted go.
func Door(e *engine.Engine, tokens gate.Tokens, reg *prometheus.Registry) *frontdoor.Door {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	run, met := pipeline.New(e, reg), reqmetrics.New(reg)
	e.Forgets(run, met)
	return frontdoor.New(frontdoor.Config{Runner: run, Gate: gate.New(tokens, reg), Metrics: met})
}

// ServeWith serves an already built server on a free loopback port,
// behind a netguard.Listener as plover serve's: a refusal sent before a
// body was read closes with a linger, so a client still sending reads the
// answer rather than a reset.
func ServeWith(t testing.TB, srv *httpapi.Server) string {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := netguard.NewListener(inner, 0)
	go srv.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return "http://" + ln.Addr().String()
}

// Deploy packs dir and deploys it through e under its manifest name.
func Deploy(t testing.TB, e *engine.Engine, dir string) api.FunctionInfo {
	t.Helper()
	return deploy(t, e, dir, false)
}

// ForceDeploy is Deploy with force: a new version even of the same bytes,
// and even where pipelines running it would pass their limits.
func ForceDeploy(t testing.TB, e *engine.Engine, dir string) api.FunctionInfo {
	t.Helper()
	return deploy(t, e, dir, true)
}

func deploy(t testing.TB, e *engine.Engine, dir string, force bool) api.FunctionInfo {
	t.Helper()
	b, _, m, err := bundle.PackBytes(dir)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := e.Control().Deploy(context.Background(), m.Name, bytes.NewReader(b), force)
	if err != nil {
		t.Fatalf("deploy %s: %v", m.Name, err)
	}
	return fi
}

// Post sends body to url with the content type and returns the response
// and its body.
func Post(t testing.TB, method, url, contentType string, body []byte) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	return resp, buf.Bytes()
}

// WaitFor polls function name on e until cond holds (busy instances, queue
// depth, ...), so tests order concurrent requests by observed state rather
// than by sleeping. It fails the test after 10 s.
func WaitFor(t testing.TB, e *engine.Engine, name string, what string, cond func(api.FunctionInfo) bool) {
	t.Helper()
	Until(t, "function "+name+": "+what, func() bool {
		fi, err := e.Control().Function(context.Background(), name)
		return err == nil && cond(fi)
	})
}

// Until polls cond until it holds, as WaitFor does a function's state:
// goroutines waiting (Goroutines), a count the engine keeps. It fails the
// test after 10 s.
func Until(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s never happened", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Busy is a WaitFor condition: n busy instances and q queued requests.
func Busy(n, q int) func(api.FunctionInfo) bool {
	return func(fi api.FunctionInfo) bool { return fi.Busy == n && fi.Queue == q }
}

// WithdrawnStep deploys functions secret and public and the pipeline p
// twice, [secret] then [public] (a step withdrawn by a redeploy), and
// returns the two versions' ids.
func WithdrawnStep(t testing.TB, e *engine.Engine) (old, cur string) {
	t.Helper()
	Deploy(t, e, BundleDir(t, Manifest("secret"), nil))
	Deploy(t, e, BundleDir(t, Manifest("public"), nil))
	old = Deploy(t, e, PipelineDir(t, "p", "secret")).Version
	cur = Deploy(t, e, PipelineDir(t, "p", "public")).Version
	return old, cur
}
