package httpapi_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/gate"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/racebuild"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/loader"
	"github.com/plover-run/plover/netguard"
	"github.com/plover-run/plover/pipeline"
	"github.com/plover-run/plover/reqmetrics"
	"github.com/plover-run/plover/samples/cnn/digits"
	"github.com/plover-run/plover/samples/cnn/model"
	"github.com/plover-run/plover/tracing"
)

// The same one-kernel chain (echo of a 64-byte input into a 256-byte out)
// measured four ways: the device call alone, the engine, the HTTP handler,
// and a real loopback round trip. Differences are Plover's overhead.
const benchInput = 64

func benchManifest() *abi.Manifest {
	m := testkit.Manifest("bench")
	m.Chain = []abi.Launch{{Kernel: "echo", Grid: 1, Block: 64}}
	return m
}

func BenchmarkHotInvoke(b *testing.B) {
	m := benchManifest()
	dir := testkit.BundleDir(b, m, nil)
	in := make([]byte, benchInput)

	b.Run("direct", func(b *testing.B) {
		lib, err := loader.Open(dir+"/"+m.Library, abi.TargetHost, []string{"echo"})
		if err != nil {
			b.Fatal(err)
		}
		ents := device.NewEntries(lib)
		echo, err := ents.Resolve("echo")
		if err != nil {
			b.Fatal(err)
		}
		inst, err := device.NewHost(0).NewInstance(device.InstanceConfig{MaxInput: m.MaxInputBytes, Tmp: m.TmpBytes, Out: m.OutBytes, Entries: ents})
		if err != nil {
			b.Fatal(err)
		}
		defer inst.Close()
		run := &device.Run{Input: in, Output: make([]byte, m.OutBytes), Chain: []device.Step{{Entry: echo, Grid: 1, Block: 64}}, TmpLen: m.TmpBytes}
		b.ReportAllocs()
		for b.Loop() {
			if err := inst.Run(run); err != nil {
				b.Fatal(err)
			}
		}
	})

	e := testkit.Engine(b, engine.Config{})
	testkit.Deploy(b, e, dir)
	b.Run("engine", func(b *testing.B) {
		req := &call.Request{Input: in}
		ctx := context.Background()
		e.Invoke(ctx, "bench", req) // cold start outside the loop
		b.ReportAllocs()
		for b.Loop() {
			if err := e.Invoke(ctx, "bench", req); err != nil {
				b.Fatal(err)
			}
		}
	})

	srv := httpapi.New(testkit.Door(e, nil, nil), e.Control(), httpapi.Options{})
	b.Run("handler", func(b *testing.B) { benchHandle(b, srv, invokeCtx(srv, in)) })

	// Tracing on: every request unsampled (what it costs a request that is
	// not traced), and every request sampled (its spans are exported to
	// a discarding exporter).
	for _, tc := range []struct {
		name    string
		sampler sdktrace.Sampler
	}{{"handler-traced-unsampled", sdktrace.NeverSample()}, {"handler-traced-sampled", sdktrace.AlwaysSample()}} {
		tr := tracing.New(discard{}, sdktrace.WithSampler(tc.sampler))
		defer tr.Shutdown(context.Background())
		door := frontdoor.New(frontdoor.Config{Runner: pipeline.New(e, nil), Metrics: reqmetrics.New(prometheus.NewRegistry()), Tracer: tr})
		ts := httpapi.New(door, e.Control(), httpapi.Options{})
		b.Run(tc.name, func(b *testing.B) { benchHandle(b, ts, invokeCtx(ts, in)) })
	}

	// The Open Inference Protocol with the binary extension: the same
	// bytes as one UINT8 tensor, a JSON header each way.
	b.Run("handler-v2-binary", func(b *testing.B) { benchHandle(b, srv, v2Ctx(srv, in)) })
	b.Run("loopback-v2-binary", func(b *testing.B) {
		url := testkit.Serve(b, e, httpapi.Options{})
		c := &fasthttp.HostClient{Addr: url[len("http://"):]}
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		header := v2BinaryHeader(len(in))
		req.Header.SetMethod("POST")
		req.SetRequestURI(url + "/v2/models/bench/infer")
		req.Header.SetContentType("application/octet-stream")
		req.Header.Set("Inference-Header-Content-Length", strconv.Itoa(len(header)))
		req.SetBody(append(header, in...))
		b.ReportAllocs()
		for b.Loop() {
			if err := c.Do(req, resp); err != nil || resp.StatusCode() != 200 {
				b.Fatalf("%v %d %s", err, resp.StatusCode(), resp.Body())
			}
		}
	})

	tab, tok := benchTokens(b)
	for _, lb := range []struct {
		name   string
		tokens gate.Tokens
		opts   httpapi.Options
		token  string
		expect bool // Expect: 100-continue, the body sent without waiting
	}{
		{"loopback", nil, httpapi.Options{}, "", false},
		{"loopback-auth", tab, httpapi.Options{BodyBudget: netguard.NewBudget(1 << 30)}, tok, false},
		{"loopback-auth-expect", tab, httpapi.Options{BodyBudget: netguard.NewBudget(1 << 30)}, tok, true},
	} {
		url := testkit.ServeTokens(b, e, lb.tokens, lb.opts)
		b.Run(lb.name, func(b *testing.B) {
			c := &fasthttp.HostClient{Addr: url[len("http://"):]}
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			req.Header.SetMethod("POST")
			req.SetRequestURI(url + "/v1/functions/bench/invoke")
			req.Header.SetContentType("application/octet-stream")
			if lb.token != "" {
				req.Header.Set("Authorization", "Bearer "+lb.token)
			}
			if lb.expect {
				req.Header.Set("Expect", "100-continue")
			}
			req.SetBody(in)
			b.ReportAllocs()
			for b.Loop() {
				if err := c.Do(req, resp); err != nil || resp.StatusCode() != 200 {
					b.Fatalf("%v %d", err, resp.StatusCode())
				}
			}
		})
	}
}

// invokeCtx prepares an octet-stream invoke of "bench" and runs it once
// (the cold start), for reuse as a keep-alive connection would.
func invokeCtx(srv *httpapi.Server, in []byte) *fasthttp.RequestCtx {
	var ctx fasthttp.RequestCtx
	ctx.Init(&fasthttp.Request{}, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}, nil)
	ctx.Request.Header.SetMethod("POST")
	ctx.Request.SetRequestURI("/v1/functions/bench/invoke")
	ctx.Request.Header.SetContentType("application/octet-stream")
	ctx.Request.SetBody(in)
	srv.Handle(&ctx)
	return &ctx
}

// benchTokens is a table of one invoke token for "bench", and the token.
func benchTokens(t testing.TB) (*auth.Table, string) {
	tok, err := auth.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	tab, err := auth.Parse(strings.NewReader(auth.Line("app", auth.Invoke, auth.Hash(tok), []string{"bench"}, auth.Limits{})+"\n"), "tokens")
	if err != nil {
		t.Fatal(err)
	}
	return tab, tok
}

// The hot request path allocates nothing, from the HTTP handler down to the
// device call, with and without tokens and a body budget. A count, not a
// timing: it holds on any machine.
func TestHotInvokeAllocatesNothing(t *testing.T) {
	if racebuild.Enabled {
		t.Skip("under -race sync.Pool drops items on purpose: allocation counts do not hold")
	}
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, benchManifest(), nil))
	tab, tok := benchTokens(t)
	for _, tt := range []struct {
		name   string
		tokens gate.Tokens
		opts   httpapi.Options
	}{
		{"open", nil, httpapi.Options{}},
		{"tokens and a body budget", tab, httpapi.Options{BodyBudget: netguard.NewBudget(1 << 20)}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := httpapi.New(testkit.Door(e, tt.tokens, nil), e.Control(), tt.opts)
			ctx := invokeCtx(srv, make([]byte, benchInput))
			ctx.Request.Header.Set("Authorization", "Bearer "+tok)
			srv.Handle(ctx) // warm the pools past their first use
			allocs := testing.AllocsPerRun(200, func() {
				ctx.Response.Reset()
				srv.Handle(ctx)
			})
			if ctx.Response.StatusCode() != 200 {
				t.Fatalf("status %d: %s", ctx.Response.StatusCode(), ctx.Response.Body())
			}
			if allocs != 0 {
				t.Fatalf("hot invoke allocates %.1f times per request, want 0", allocs)
			}
		})
	}
}

// v2Ctx prepares a binary-extension inference of "bench" with one UINT8
// input of in's bytes and binary outputs, and runs it once (the cold start).
func v2Ctx(srv *httpapi.Server, in []byte) *fasthttp.RequestCtx {
	var ctx fasthttp.RequestCtx
	ctx.Init(&fasthttp.Request{}, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}, nil)
	header := v2BinaryHeader(len(in))
	ctx.Request.Header.SetMethod("POST")
	ctx.Request.SetRequestURI("/v2/models/bench/infer")
	ctx.Request.Header.SetContentType("application/octet-stream")
	ctx.Request.Header.Set("Inference-Header-Content-Length", strconv.Itoa(len(header)))
	ctx.Request.SetBody(append(header, in...))
	srv.Handle(&ctx)
	return &ctx
}

// v2BinaryHeader is the JSON header of a request with one UINT8 input of n
// bytes in the binary extension, asking for binary outputs.
func v2BinaryHeader(n int) []byte {
	return []byte(`{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[` + strconv.Itoa(n) +
		`],"parameters":{"binary_data_size":` + strconv.Itoa(n) + `}}],"parameters":{"binary_data_output":true}}`)
}

// A binary-extension inference allocates nothing in the handler either,
// once its pools are warm: the header is parsed without encoding/json, the
// input read where it arrived and the response written by hand.
func TestV2BinaryInferAllocatesNothing(t *testing.T) {
	if racebuild.Enabled {
		t.Skip("under -race sync.Pool drops items on purpose: allocation counts do not hold")
	}
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, benchManifest(), nil))
	srv := httpapi.New(testkit.Door(e, nil, nil), e.Control(), httpapi.Options{})
	ctx := v2Ctx(srv, make([]byte, benchInput))
	srv.Handle(ctx)
	allocs := testing.AllocsPerRun(200, func() {
		ctx.Response.Reset()
		srv.Handle(ctx)
	})
	if ctx.Response.StatusCode() != 200 {
		t.Fatalf("status %d: %s", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	if allocs != 0 {
		t.Fatalf("a binary v2 inference allocates %.1f times per request, want 0", allocs)
	}
}

// BenchmarkCNN is HotInvoke's loopback comparison on real work: the MNIST
// CNN sample (samples/cnn, its plover.json and weights) classifying the
// first held-out digit, 784 float32 in and 10 out, through the native
// octet-stream route and through v2 with the binary extension. The sample
// declares no tensors, so v2 sends the input as INPUT0, UINT8 [3136].
func BenchmarkCNN(b *testing.B) {
	src := filepath.Join(testkit.Root(), "samples", "cnn")
	dir := b.TempDir()
	testkit.BuildLib(b, filepath.Join(src, "cnn.cu"), dir, "cnn.so")
	for _, f := range []string{abi.ManifestFile, "weights.bin"} {
		data, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	ds, err := digits.ReadFile(filepath.Join(src, "testdata", "heldout.bin"))
	if err != nil {
		b.Fatal(err)
	}
	in, label := ds[0].Input(), int(ds[0].Label)
	e := testkit.Engine(b, engine.Config{})
	testkit.Deploy(b, e, dir)
	url := testkit.Serve(b, e, httpapi.Options{})
	c := &fasthttp.HostClient{Addr: url[len("http://"):]}
	// The CNN declares its tensors: one FP32 digit of 784 pixels in.
	cnnHeader := []byte(`{"inputs":[{"name":"digit","datatype":"FP32","shape":[1,784],"parameters":{"binary_data_size":3136}}],"parameters":{"binary_data_output":true}}`)

	for _, route := range []struct {
		name string
		prep func(*fasthttp.Request)
		// scores cuts the 10 scores from a response body.
		scores func(*fasthttp.Response) []byte
	}{
		{"loopback", func(r *fasthttp.Request) {
			r.SetRequestURI(url + "/v1/functions/cnn/invoke")
			r.SetBody(in)
		}, func(r *fasthttp.Response) []byte { return r.Body() }},
		{"loopback-v2-binary", func(r *fasthttp.Request) {
			r.SetRequestURI(url + "/v2/models/cnn/infer")
			r.Header.Set("Inference-Header-Content-Length", strconv.Itoa(len(cnnHeader)))
			r.SetBody(append(append([]byte(nil), cnnHeader...), in...))
		}, func(r *fasthttp.Response) []byte {
			n, _ := strconv.Atoi(string(r.Header.Peek("Inference-Header-Content-Length")))
			return r.Body()[min(n, len(r.Body())):]
		}},
	} {
		b.Run(route.name, func(b *testing.B) {
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			req.Header.SetMethod("POST")
			req.Header.SetContentType("application/octet-stream")
			route.prep(req)
			// Once outside the loop: the cold start, and the answer checked.
			if err := c.Do(req, resp); err != nil || resp.StatusCode() != 200 {
				b.Fatalf("%v %d %s", err, resp.StatusCode(), resp.Body())
			}
			scores, err := model.DecodeScores(route.scores(resp))
			if err != nil || model.Argmax(scores) != label {
				b.Fatalf("scores %v (%v), want the digit's label %d", scores, err, label)
			}
			b.ReportAllocs()
			for b.Loop() {
				if err := c.Do(req, resp); err != nil || resp.StatusCode() != 200 {
					b.Fatalf("%v %d %s", err, resp.StatusCode(), resp.Body())
				}
			}
		})
	}
}

// benchHandle serves ctx's request over and over, in process.
func benchHandle(b *testing.B, srv *httpapi.Server, ctx *fasthttp.RequestCtx) {
	b.ReportAllocs()
	for b.Loop() {
		ctx.Response.Reset()
		srv.Handle(ctx)
		if ctx.Response.StatusCode() != 200 {
			b.Fatalf("status %d: %s", ctx.Response.StatusCode(), ctx.Response.Body())
		}
	}
}

// discard is a span exporter that drops what it is given.
type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }
