package main_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	pb "github.com/plover-run/plover/grpcapi/inferencepb"
	"github.com/plover-run/plover/internal/testkit"
)

// otlpReceiver is an OTLP/HTTP trace endpoint on loopback that decodes
// what the exporter sends (protobuf, gzip or not) and keeps the spans.
type otlpReceiver struct {
	url   string
	mu    sync.Mutex
	spans []*tracepb.Span
	svc   map[string]bool // service.name values seen
}

func startReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	r := &otlpReceiver{svc: map[string]bool{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" {
			http.Error(w, "want POST /v1/traces application/x-protobuf", 400)
			return
		}
		var body io.Reader = req.Body
		if req.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(req.Body)
			if err != nil {
				http.Error(w, err.Error(), 400)
				return
			}
			body = zr
		}
		b, _ := io.ReadAll(body)
		var ex collectorpb.ExportTraceServiceRequest
		if err := proto.Unmarshal(b, &ex); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		r.mu.Lock()
		for _, rs := range ex.GetResourceSpans() {
			for _, a := range rs.GetResource().GetAttributes() {
				if a.GetKey() == "service.name" {
					r.svc[a.GetValue().GetStringValue()] = true
				}
			}
			for _, ss := range rs.GetScopeSpans() {
				r.spans = append(r.spans, ss.GetSpans()...)
			}
		}
		r.mu.Unlock()
		out, _ := proto.Marshal(&collectorpb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	r.url = "http://" + ln.Addr().String()
	return r
}

// trace is the spans of one trace id received so far.
func (r *otlpReceiver) trace(id string) []*tracepb.Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range r.spans {
		if hex.EncodeToString(s.GetTraceId()) == id {
			out = append(out, s)
		}
	}
	return out
}

// waitSpans waits until the trace has spans of every name in want and
// returns them by name (the last of each).
func (r *otlpReceiver) waitSpans(t *testing.T, id string, want ...string) map[string]*tracepb.Span {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		got := map[string]*tracepb.Span{}
		for _, s := range r.trace(id) {
			got[s.GetName()] = s
		}
		missing := []string{}
		for _, w := range want {
			if got[w] == nil {
				missing = append(missing, w)
			}
		}
		if len(missing) == 0 {
			return got
		}
		if time.Now().After(deadline) {
			names := []string{}
			for n := range got {
				names = append(names, n)
			}
			t.Fatalf("trace %s: no spans %q after 15 s; have %q", id, missing, names)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func attr(s *tracepb.Span, key string) string {
	for _, a := range s.GetAttributes() {
		if a.GetKey() == key {
			if v := a.GetValue().GetStringValue(); v != "" {
				return v
			}
			if v, ok := a.GetValue().GetValue().(*commonpb.AnyValue_IntValue); ok {
				return strconv.FormatInt(v.IntValue, 10)
			}
		}
	}
	return ""
}

// TestTracing: a real plover serve exporting to a real OTLP/HTTP receiver.
// A request that arrives with a sampled traceparent (HTTP and gRPC) has
// its spans exported under that trace id and parent: the request with its
// function, version, device and start kind, its cold load (fetch, program,
// instance), its queue, its run (copy in, kernels, copy out), and a
// pipeline's steps; one that arrives unsampled exports nothing.
func TestTracing(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts a server")
	}
	rcv := startReceiver(t)
	bin := buildPlover(t)
	srv := startIsoServer(t, bin, t.TempDir(), []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + rcv.url, "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_SERVICE_NAME=plover-under-test", "OTEL_BSP_SCHEDULE_DELAY=50",
	}, "--grpc-listen", "127.0.0.1:0")
	if !strings.Contains(srv.log.String(), "tracing requests") {
		t.Fatalf("the server did not say it traces:\n%s", srv.log)
	}
	env := []string{"PLOVER_SERVER=" + srv.url}
	run(t, bin, env, "deploy", testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	slow := testkit.Slow("slow", 300)
	slow.MaxInstances = 1
	run(t, bin, env, "deploy", testkit.BundleDir(t, slow, nil))
	run(t, bin, env, "deploy", chainFn(t, "a"))
	run(t, bin, env, "deploy", chainFn(t, "b"))
	run(t, bin, env, "deploy", pipelineDir(t, "ab", "a", "b"))

	const parent = "00f067aa0ba902b7"
	tp := func(id, flags string) string { return "00-" + id + "-" + parent + "-" + flags }

	t.Run("HTTP, cold", func(t *testing.T) {
		id := "4bf92f3577b34da6a3ce929d0e0e4736"
		pipeInvoke(t, srv.url, "echo", []byte("x"), "traceparent", tp(id, "01")).ok(t, "echo")
		sp := rcv.waitSpans(t, id, "POST /v1/functions/{name}/invoke", "load", "fetch", "program", "run", "copy in", "kernels", "copy out", "dispatch", "handoff", "handback")
		req := sp["POST /v1/functions/{name}/invoke"]
		if hex.EncodeToString(req.GetParentSpanId()) != parent || req.GetKind() != tracepb.Span_SPAN_KIND_SERVER {
			t.Errorf("request span: parent %x kind %v", req.GetParentSpanId(), req.GetKind())
		}
		if attr(req, "plover.function") != "echo" || attr(req, "plover.start") != "cold" || !strings.HasPrefix(attr(req, "plover.device"), "host") ||
			attr(req, "plover.version") == "" || attr(req, "http.response.status_code") != "200" {
			t.Errorf("request span attributes: %v", req.GetAttributes())
		}
		for _, n := range []string{"load", "run"} {
			if !bytes.Equal(sp[n].GetParentSpanId(), req.GetSpanId()) {
				t.Errorf("%s is not under the request", n)
			}
		}
		if !bytes.Equal(sp["program"].GetParentSpanId(), sp["load"].GetSpanId()) || !bytes.Equal(sp["kernels"].GetParentSpanId(), sp["run"].GetSpanId()) {
			t.Error("program is not under load, or kernels under run")
		}
		for _, n := range []string{"handoff", "handback"} { // the run went through a worker process
			if !bytes.Equal(sp[n].GetParentSpanId(), sp["dispatch"].GetSpanId()) {
				t.Errorf("%s is not under dispatch", n)
			}
		}
		// The bundle is fetched before the request queues for an
		// instance, whose load (program, instance) comes after.
		if !bytes.Equal(sp["fetch"].GetParentSpanId(), req.GetSpanId()) || sp["fetch"].GetEndTimeUnixNano() > sp["load"].GetStartTimeUnixNano() {
			t.Error("fetch is not the request's, before the load")
		}
		if s, e := req.GetStartTimeUnixNano(), req.GetEndTimeUnixNano(); sp["run"].GetStartTimeUnixNano() < s || sp["run"].GetEndTimeUnixNano() > e {
			t.Errorf("run [%d, %d] outside the request [%d, %d]", sp["run"].GetStartTimeUnixNano(), sp["run"].GetEndTimeUnixNano(), s, e)
		}
	})

	t.Run("unsampled", func(t *testing.T) {
		id := "0af7651916cd43dd8448eb211c80319c"
		pipeInvoke(t, srv.url, "echo", []byte("x"), "traceparent", tp(id, "00")).ok(t, "echo")
		// A sampled request after it: once its spans arrive, the unsampled
		// one's would have too (one exporter, in order).
		after := "11111111111111111111111111111111"
		pipeInvoke(t, srv.url, "echo", []byte("x"), "traceparent", tp(after, "01")).ok(t, "echo")
		rcv.waitSpans(t, after, "POST /v1/functions/{name}/invoke")
		if n := len(rcv.trace(id)); n != 0 {
			t.Fatalf("an unsampled request exported %d spans", n)
		}
	})

	t.Run("queued", func(t *testing.T) {
		pipeInvoke(t, srv.url, "slow", []byte("x")).ok(t, "slow, warming it")
		done := make(chan pipeResp, 1)
		go func() { done <- pipeInvoke(t, srv.url, "slow", []byte("x")) }()
		waitFor(t, 10*time.Second, "slow busy", func() bool {
			r := secDo(t, &http.Client{Timeout: 5 * time.Second}, "GET", srv.url+"/v1/functions/slow", "", "", nil)
			return strings.Contains(r.body, `"instances_busy":1`)
		})
		id := "22222222222222222222222222222222"
		pipeInvoke(t, srv.url, "slow", []byte("x"), "traceparent", tp(id, "01")).ok(t, "slow, queued")
		<-done
		sp := rcv.waitSpans(t, id, "POST /v1/functions/{name}/invoke", "queue", "run")
		if q := sp["queue"]; q.GetEndTimeUnixNano()-q.GetStartTimeUnixNano() < uint64(50*time.Millisecond) {
			t.Errorf("queue span of %v for a request that waited for a 300 ms run", time.Duration(q.GetEndTimeUnixNano()-q.GetStartTimeUnixNano()))
		}
	})

	t.Run("pipeline", func(t *testing.T) {
		id := "33333333333333333333333333333333"
		pipeInvoke(t, srv.url, "ab", []byte("x"), "traceparent", tp(id, "01")).ok(t, "ab")
		sp := rcv.waitSpans(t, id, "POST /v1/functions/{name}/invoke", "step 0 a", "step 1 b")
		for _, n := range []string{"step 0 a", "step 1 b"} {
			if !bytes.Equal(sp[n].GetParentSpanId(), sp["POST /v1/functions/{name}/invoke"].GetSpanId()) || attr(sp[n], "plover.version") == "" {
				t.Errorf("%s: %v", n, sp[n])
			}
		}
		if sp["step 1 b"].GetStartTimeUnixNano() < sp["step 0 a"].GetEndTimeUnixNano() {
			t.Error("step 1 starts before step 0 ends")
		}
		var runs int
		for _, s := range rcv.trace(id) {
			if s.GetName() == "run" {
				runs++
			}
		}
		if runs != 2 {
			t.Errorf("%d run spans for two steps", runs)
		}
	})

	// A request refused before it reached a version (a name no function
	// has) carries nothing of the request the transport served before it
	// on the same pooled exchange: no version, start or device, and no
	// step spans of another caller's pipeline.
	t.Run("refused request carries nothing of the last", func(t *testing.T) {
		for i := range 8 {
			pipeInvoke(t, srv.url, "ab", []byte("x")).ok(t, "ab")
			id := fmt.Sprintf("7777777777777777777777777777777%x", i)
			if r := pipeInvoke(t, srv.url, "no-such-fn", []byte("x"), "traceparent", tp(id, "01")); r.code != 404 {
				t.Fatalf("invoke of no-such-fn: %d %s, want 404", r.code, r.body)
			}
			req := rcv.waitSpans(t, id, "POST /v1/functions/{name}/invoke")["POST /v1/functions/{name}/invoke"]
			if v, st, d := attr(req, "plover.version"), attr(req, "plover.start"), attr(req, "plover.device"); v != "" || st != "" || d != "" {
				t.Errorf("round %d: the 404's span has plover.version %q, plover.start %q, plover.device %q: the last request's", i, v, st, d)
			}
			for _, s := range rcv.trace(id) {
				if s.GetName() != "POST /v1/functions/{name}/invoke" {
					t.Errorf("round %d: the 404's trace has a span %q (function %q)", i, s.GetName(), attr(s, "plover.function"))
				}
			}
		}
	})

	// A name that is not UTF-8 (a client's %ff%fe) is exported with its
	// bad bytes replaced: as sent, it failed the encoding of its whole
	// batch, and a good request's spans beside it were lost.
	t.Run("name not UTF-8", func(t *testing.T) {
		bad, good := "55555555555555555555555555555555", "66666666666666666666666666666666"
		req, err := http.NewRequest("POST", srv.url+"/v1/functions/%ff%fe/invoke", strings.NewReader("x"))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("traceparent", tp(bad, "01"))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 404 {
			t.Fatalf("invoke of %%ff%%fe: %d, want 404", resp.StatusCode)
		}
		pipeInvoke(t, srv.url, "echo", []byte("x"), "traceparent", tp(good, "01")).ok(t, "echo")
		rcv.waitSpans(t, good, "POST /v1/functions/{name}/invoke")
		sp := rcv.waitSpans(t, bad, "POST /v1/functions/{name}/invoke")["POST /v1/functions/{name}/invoke"]
		if f := attr(sp, "plover.function"); f != "\uFFFD" || attr(sp, "http.response.status_code") != "404" {
			t.Errorf("plover.function %q, status %s", f, attr(sp, "http.response.status_code"))
		}
	})

	t.Run("gRPC", func(t *testing.T) {
		conn, err := grpc.NewClient(grpcAddr(t, srv), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		id := "44444444444444444444444444444444"
		ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", tp(id, "01"))
		ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		_, err = pb.NewGRPCInferenceServiceClient(conn).ModelInfer(ctx, &pb.ModelInferRequest{ModelName: "echo",
			Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{1}}}, RawInputContents: [][]byte{{7}}})
		if err != nil {
			t.Fatal(err)
		}
		sp := rcv.waitSpans(t, id, "inference.GRPCInferenceService/ModelInfer", "run")
		if req := sp["inference.GRPCInferenceService/ModelInfer"]; attr(req, "rpc.system") != "grpc" || attr(req, "plover.function") != "echo" ||
			hex.EncodeToString(req.GetParentSpanId()) != parent {
			t.Errorf("gRPC request span: %v", req)
		}
	})

	rcv.mu.Lock()
	if !rcv.svc["plover-under-test"] {
		t.Errorf("service names seen: %v", rcv.svc)
	}
	rcv.mu.Unlock()
}

// A collector that is down costs the requests nothing and is said once in
// the log, naming the exporter.
func TestTracingCollectorDown(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts a server")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there now
	bin := buildPlover(t)
	srv := startIsoServer(t, bin, t.TempDir(), []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + down, "OTEL_BSP_SCHEDULE_DELAY=50",
		"OTEL_EXPORTER_OTLP_TIMEOUT=500"})
	run(t, bin, []string{"PLOVER_SERVER=" + srv.url}, "deploy", testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	for range 3 {
		pipeInvoke(t, srv.url, "echo", []byte("x"), "traceparent", "00-55555555555555555555555555555555-00f067aa0ba902b7-01").ok(t, "echo")
	}
	waitFor(t, 15*time.Second, "the export failure in the log", func() bool {
		return strings.Contains(srv.log.String(), "spans could not be exported")
	})
	if n := strings.Count(srv.log.String(), "spans could not be exported"); n != 1 {
		t.Errorf("the failure was logged %d times, want once a minute", n)
	}
}

// A tracing variable plover serve cannot honour stops it at start, naming
// the variable, rather than start tracing otherwise than asked: the SDK
// traced every request on a sampler it could not read, with one line on
// stderr.
func TestServeRefusesTracingItCannotHonour(t *testing.T) {
	bin := buildPlover(t)
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{[]string{"OTEL_TRACES_SAMPLER=traceidratio", "OTEL_TRACES_SAMPLER_ARG=5%"}, "OTEL_TRACES_SAMPLER_ARG"},
		{[]string{"OTEL_TRACES_SAMPLER=parentbased_ratio"}, "OTEL_TRACES_SAMPLER"},
		{[]string{"OTEL_PROPAGATORS=b3"}, "OTEL_PROPAGATORS"},
	} {
		t.Run(strings.Join(tc.env, " "), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, "serve", "--listen", "127.0.0.1:0", "--data", t.TempDir(), "--device", "host", "--insecure-no-auth")
			cmd.Env = append(os.Environ(), append([]string{"OTEL_TRACES_EXPORTER=otlp", "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:1"}, tc.env...)...)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), "tracing: "+tc.want) {
				t.Fatalf("plover serve with %s: %v (want exit 1 naming %s)\n%s", tc.env, err, tc.want, out)
			}
		})
	}
}
