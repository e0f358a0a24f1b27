package httpapi_test

import (
	"strconv"
	"strings"

	"context"
	"net"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/cuda"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/loader"
	"github.com/plover-run/plover/netguard"
	"github.com/plover-run/plover/runtime"
	"github.com/plover-run/plover/runtime/httpapi"
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
		ents := cuda.NewEntries(lib)
		echo, err := ents.Resolve("echo")
		if err != nil {
			b.Fatal(err)
		}
		inst, err := cuda.NewHost(0).NewInstance(cuda.InstanceConfig{MaxInput: m.MaxInputBytes, Tmp: m.TmpBytes, Out: m.OutBytes, Entries: ents})
		if err != nil {
			b.Fatal(err)
		}
		defer inst.Close()
		run := &cuda.Run{Input: in, Output: make([]byte, m.OutBytes), Chain: []cuda.Step{{Entry: echo, Grid: 1, Block: 64}}, TmpLen: m.TmpBytes}
		b.ReportAllocs()
		for b.Loop() {
			if err := inst.Run(run); err != nil {
				b.Fatal(err)
			}
		}
	})

	e := testkit.Engine(b, runtime.Config{})
	testkit.Deploy(b, e, dir)
	b.Run("engine", func(b *testing.B) {
		req := &runtime.Request{Input: in}
		ctx := context.Background()
		e.Invoke(ctx, "bench", req) // cold start outside the loop
		b.ReportAllocs()
		for b.Loop() {
			if err := e.Invoke(ctx, "bench", req); err != nil {
				b.Fatal(err)
			}
		}
	})

	srv := httpapi.New(e, e.Control(), httpapi.Options{})
	b.Run("handler", func(b *testing.B) {
		ctx := invokeCtx(srv, in)
		b.ReportAllocs()
		for b.Loop() {
			ctx.Response.Reset()
			srv.Handle(ctx)
			if ctx.Response.StatusCode() != 200 {
				b.Fatalf("status %d: %s", ctx.Response.StatusCode(), ctx.Response.Body())
			}
		}
	})

	// The Open Inference Protocol with the binary extension: the same
	// bytes as one UINT8 tensor, a JSON header each way.
	b.Run("loopback-v2-binary", func(b *testing.B) {
		url := testkit.Serve(b, e, httpapi.Options{})
		c := &fasthttp.HostClient{Addr: url[len("http://"):]}
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		header := []byte(`{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[` + strconv.Itoa(len(in)) +
			`],"parameters":{"binary_data_size":` + strconv.Itoa(len(in)) + `}}],"parameters":{"binary_data_output":true}}`)
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
		name  string
		opts  httpapi.Options
		token string
	}{
		{"loopback", httpapi.Options{}, ""},
		{"loopback-auth", httpapi.Options{Tokens: tab, BodyBudget: netguard.NewBudget(1 << 30)}, tok},
	} {
		url := testkit.Serve(b, e, lb.opts)
		b.Run(lb.name, func(b *testing.B) {
			c := &fasthttp.HostClient{Addr: url[len("http://"):]}
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			req.Header.SetMethod("POST")
			req.SetRequestURI(url + "/v1/functions/bench/invoke")
			req.Header.SetContentType("application/octet-stream")
			if lb.token != "" {
				req.Header.Set("Authorization", "Bearer "+lb.token)
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
	tab, err := auth.Parse(strings.NewReader(auth.Line("app", auth.Invoke, auth.Hash(tok), []string{"bench"})+"\n"), "tokens")
	if err != nil {
		t.Fatal(err)
	}
	return tab, tok
}

// The hot request path allocates nothing, from the HTTP handler down to the
// device call, with and without tokens and a body budget. A count, not a
// timing: it holds on any machine.
func TestHotInvokeAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("under -race sync.Pool drops items on purpose: allocation counts do not hold")
	}
	e := testkit.Engine(t, runtime.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, benchManifest(), nil))
	tab, tok := benchTokens(t)
	for _, tt := range []struct {
		name string
		opts httpapi.Options
	}{
		{"open", httpapi.Options{}},
		{"tokens and a body budget", httpapi.Options{Tokens: tab, BodyBudget: netguard.NewBudget(1 << 20)}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := httpapi.New(e, e.Control(), tt.opts)
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
