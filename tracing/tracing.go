// Package tracing joins Plover's requests to the operator's distributed
// traces (OpenTelemetry). It is off unless the standard environment asks
// for an exporter; when on, a request's spans are made after it ends,
// from the timings the engine records anyway (Server-Timing's), so the
// engine and the hot path carry no tracing code and nothing is allocated
// for a request that is not traced.
//
// Configuration is OpenTelemetry's own environment: OTEL_EXPORTER_OTLP_ENDPOINT
// (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) turns tracing on;
// OTEL_EXPORTER_OTLP_PROTOCOL picks http/protobuf (the default) or grpc;
// OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, _INSECURE, _CERTIFICATE, ... are
// read by the exporter; OTEL_TRACES_SAMPLER and _ARG choose the sampler
// (default parentbased_always_on: a request that arrives with a sampled
// traceparent is traced, one with an unsampled one is not, one with none
// starts a trace); OTEL_PROPAGATORS the context read from a request
// (tracecontext, the default, or none: every request starts its own trace;
// baggage is taken and not read);
// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES name the service (default
// service.name "plover"); OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none
// turn it off; OTEL_BSP_* tune the batching. A value of the exporter,
// protocol, sampler or propagator variables that Plover does not take is
// an error naming the variable, not the SDK's silent default.
package tracing

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/errdefs"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
	grpccodes "google.golang.org/grpc/codes"
)

// Tracer records requests as spans. A nil *Tracer records nothing: the
// transports check for nil before they read a clock or a header.
type Tracer struct {
	tp    *sdktrace.TracerProvider
	t     trace.Tracer
	prop  propagation.TextMapPropagator
	Where string // the exporter's protocol and endpoint, for the log

	// building counts the goroutines making sampled requests' spans, for
	// Shutdown to wait for; closing (under mu) stops new ones once it
	// waits, as a WaitGroup must not grow from zero during its Wait.
	mu       sync.RWMutex
	closing  bool
	building sync.WaitGroup
}

// FromEnv returns a Tracer configured by the environment, or nil when the
// environment asks for no tracing (no OTLP endpoint, the SDK disabled).
// OpenTelemetry's errors go to log, once a minute at most: export
// failures (the collector down or refusing).
func FromEnv(ctx context.Context, version string, log *slog.Logger) (*Tracer, error) {
	t, err := fromEnv(ctx, version, os.Getenv)
	if t != nil && log != nil {
		var last atomic.Int64
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
			now := time.Now().UnixNano()
			if prev := last.Load(); now-prev >= int64(time.Minute) && last.CompareAndSwap(prev, now) {
				log.Warn("OpenTelemetry failed (most often: spans could not be exported); later failures within a minute are not logged", "exporter", t.Where, "error", err)
			}
		}))
	}
	return t, err
}

func fromEnv(ctx context.Context, version string, getenv func(string) string) (*Tracer, error) {
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") {
		return nil, nil
	}
	switch exp := strings.ToLower(strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER"))); exp {
	case "none":
		return nil, nil
	case "", "otlp":
	default:
		return nil, fmt.Errorf("OTEL_TRACES_EXPORTER %q: Plover exports traces with otlp (or none)", exp)
	}
	endpoint := getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	if endpoint == "" {
		endpoint = getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	}
	if endpoint == "" {
		return nil, nil
	}
	protoVar := "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	proto := getenv(protoVar)
	if proto == "" {
		protoVar = "OTEL_EXPORTER_OTLP_PROTOCOL"
		proto = getenv(protoVar)
	}
	// Every setting is read before the exporter is made: one refused
	// after it left its connection behind.
	sampler, err := samplerFromEnv(getenv)
	if err != nil {
		return nil, err
	}
	prop, err := propagatorFromEnv(getenv)
	if err != nil {
		return nil, err
	}
	res, err := resource.Merge(resource.NewSchemaless(semconv.ServiceName("plover"), semconv.ServiceVersion(version)),
		resource.Environment()) // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win
	if err != nil {
		return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	var exp *otlptrace.Exporter
	switch proto {
	case "", "http/protobuf":
		proto = "http/protobuf"
		exp, err = otlptracehttp.New(ctx) // endpoint, headers, TLS and timeout from the environment
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	default:
		return nil, fmt.Errorf("%s %q: want http/protobuf or grpc", protoVar, proto)
	}
	if err != nil {
		return nil, fmt.Errorf("the OTLP trace exporter (%s %s): %w", proto, endpoint, err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res), sdktrace.WithSampler(sampler))
	return &Tracer{tp: tp, t: tp.Tracer("github.com/plover-run/plover"), prop: prop, Where: proto + " " + endpoint}, nil
}

// samplerFromEnv is OTEL_TRACES_SAMPLER's sampler (the values the SDK
// knows; default parentbased_always_on), with OTEL_TRACES_SAMPLER_ARG for
// the ratio ones (default 1). Plover reads them itself: the SDK takes a
// value it cannot parse (5%, 0,05, a misspelt name) for 1, so for every
// request, with a line on stderr outside the server's log. An argument
// the sampler does not read is refused too: OTEL_TRACES_SAMPLER_ARG=0.05
// alone would trace every request under the default.
func samplerFromEnv(getenv func(string) string) (sdktrace.Sampler, error) {
	name := strings.ToLower(strings.TrimSpace(getenv("OTEL_TRACES_SAMPLER")))
	arg := strings.TrimSpace(getenv("OTEL_TRACES_SAMPLER_ARG"))
	var s sdktrace.Sampler
	switch name {
	case "always_on":
		s = sdktrace.AlwaysSample()
	case "always_off":
		s = sdktrace.NeverSample()
	case "", "parentbased_always_on":
		s = sdktrace.ParentBased(sdktrace.AlwaysSample())
	case "parentbased_always_off":
		s = sdktrace.ParentBased(sdktrace.NeverSample())
	case "traceidratio", "parentbased_traceidratio":
		ratio := 1.0
		if arg != "" {
			v, err := strconv.ParseFloat(arg, 64)
			if err != nil || !(v >= 0 && v <= 1) { // NaN too
				return nil, fmt.Errorf("OTEL_TRACES_SAMPLER_ARG %q: %s takes the fraction of traces to keep, a number from 0 to 1 (0.05 keeps 5%%)", arg, name)
			}
			ratio, arg = v, ""
		}
		if s = sdktrace.TraceIDRatioBased(ratio); name == "parentbased_traceidratio" {
			s = sdktrace.ParentBased(s)
		}
	default:
		return nil, fmt.Errorf("OTEL_TRACES_SAMPLER %q: want always_on, always_off, traceidratio, parentbased_always_on (the default), parentbased_always_off or parentbased_traceidratio", name)
	}
	if arg != "" {
		set := "unset (parentbased_always_on)"
		if name != "" {
			set = strconv.Quote(name)
		}
		return nil, fmt.Errorf("OTEL_TRACES_SAMPLER_ARG %q: only OTEL_TRACES_SAMPLER traceidratio and parentbased_traceidratio read it; OTEL_TRACES_SAMPLER is %s", arg, set)
	}
	return s, nil
}

// propagatorFromEnv reads a request's context as OTEL_PROPAGATORS says: a
// comma-separated list of tracecontext (W3C traceparent and tracestate,
// the default) and baggage; none reads nothing, so that every request
// starts its own trace, sampled by the sampler's root rule, whatever its
// client sent. baggage is taken, as OpenTelemetry's own default names it
// (an environment set for every service), but not read: Plover puts no
// baggage in its spans and passes no context on, so parsing a client's
// header on every request bought nothing.
func propagatorFromEnv(getenv func(string) string) (propagation.TextMapPropagator, error) {
	v := strings.ToLower(strings.TrimSpace(getenv("OTEL_PROPAGATORS")))
	if v == "" {
		v = "tracecontext"
	}
	tc, none, named := false, false, 0
	for _, p := range strings.Split(v, ",") {
		switch p = strings.TrimSpace(p); p {
		case "tracecontext":
			tc = true
		case "baggage":
		case "none":
			none = true
		default:
			return nil, fmt.Errorf("OTEL_PROPAGATORS %q: Plover takes tracecontext, baggage (not read) or none, not %q", v, p)
		}
		named++
	}
	if none && named > 1 {
		return nil, fmt.Errorf("OTEL_PROPAGATORS %q: none reads no context, so it goes alone", v)
	}
	if !tc {
		return propagation.NewCompositeTextMapPropagator(), nil // reads nothing
	}
	return propagation.TraceContext{}, nil
}

// New returns a Tracer exporting with exp under the given provider options
// (a sampler, a resource): for tests and benchmarks; servers use FromEnv.
func New(exp sdktrace.SpanExporter, opts ...sdktrace.TracerProviderOption) *Tracer {
	tp := sdktrace.NewTracerProvider(append([]sdktrace.TracerProviderOption{sdktrace.WithBatcher(exp)}, opts...)...)
	return &Tracer{tp: tp, t: tp.Tracer("github.com/plover-run/plover"), prop: propagation.TraceContext{}, Where: "in process"}
}

// Shutdown waits for the spans of requests already recorded to be made,
// then exports what is buffered, all within ctx. A request recorded after
// Shutdown has begun is not traced.
func (t *Tracer) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	t.closing = true
	t.mu.Unlock()
	built := make(chan struct{})
	go func() {
		t.building.Wait()
		close(built)
	}()
	select {
	case <-built:
	case <-ctx.Done():
	}
	return t.tp.Shutdown(ctx) // ctx's error when it ended first
}

// Call is one finished request as a transport saw it.
type Call struct {
	Transport string    // "http" or "grpc"
	Route     string    // the span's name: "POST /v1/functions/{name}/invoke", "inference.GRPCInferenceService/ModelInfer"
	Function  call.Name // as the client sent it: Record keeps a copy
	End       time.Time // when its answer was ready; its start is Req.Began
	Status    int       // the HTTP status of its class (apierr), 200 for success
	GRPCCode  int       // gRPC: the status code; -1 for HTTP
	Err       error     // its failure, if any (its message goes in the span)
	Req       *call.Request
}

// Record makes the request's spans under the parent carried by h
// (traceparent, tracestate), if the sampler keeps it: the request (server
// kind) with the function, version, device and start kind; below it the
// engine's parts laid out from its timings: fetch (the version's bundle,
// before the queue), queue (and batch wait), load (program, instance),
// sched, run (copy in, kernels, copy out); a
// pipeline has a span per step with those parts below each.
func (t *Tracer) Record(h propagation.TextMapCarrier, c *Call) {
	ctx := t.prop.Extract(context.Background(), h)
	ctx, span := t.t.Start(ctx, c.Route, trace.WithTimestamp(c.Req.Began), trace.WithSpanKind(trace.SpanKindServer))
	if !span.IsRecording() {
		return // not sampled: nothing more to make
	}
	// The rest off the request's path: its answer is not held for its
	// spans. The request (pooled by the transport) is copied first, and
	// the function's name, whatever the client sent, bounded
	// (errdefs.KeptName): a string attribute that is not UTF-8 fails the
	// exporter's encoding of the whole batch it is in.
	cc, r := *c, *c.Req
	fn := strings.ToValidUTF8(errdefs.KeptName(c.Function.Borrow()), "\uFFFD")
	cc.Function = call.Name{}
	r.Input, r.Output, r.Gone, r.Steps = nil, nil, nil, slices.Clone(r.Steps)
	cc.Req = &r
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.closing {
		return
	}
	t.building.Add(1)
	go t.spans(ctx, span, &cc, fn)
}

// spans completes a sampled request's span, of function fn, and makes its
// parts.
func (t *Tracer) spans(ctx context.Context, span trace.Span, c *Call, fn string) {
	defer t.building.Done()
	r := c.Req
	span.SetAttributes(attribute.String("plover.function", fn), attribute.String("plover.transport", c.Transport))
	if r.Version != "" {
		span.SetAttributes(attribute.String("plover.version", r.Version), attribute.String("plover.start", r.Start.String()))
	}
	if r.Device != "" {
		span.SetAttributes(attribute.String("plover.device", r.Device))
	}
	if c.GRPCCode >= 0 {
		span.SetAttributes(attribute.String("rpc.system", "grpc"), attribute.Int("rpc.grpc.status_code", c.GRPCCode))
	} else {
		span.SetAttributes(attribute.Int("http.response.status_code", c.Status))
	}
	if c.Err != nil {
		msg := strings.ToValidUTF8(keptMessage(c.Err.Error()), "\uFFFD")
		span.SetAttributes(attribute.String("error.type", c.errorType()), attribute.String("error.message", msg))
		if c.serverFault() {
			span.SetStatus(codes.Error, msg)
		}
	}
	t.laid(ctx, r)
	span.End(trace.WithTimestamp(c.End))
}

// laid makes the spans of r's parts under ctx, from when the engine (a
// pipeline's runner) reached it, where they went: a function's parts, or a
// pipeline's steps with theirs. None for a request refused before a
// version was resolved, which nothing timed.
func (t *Tracer) laid(ctx context.Context, r *call.Request) {
	if r.Reached.IsZero() || r.Version == "" {
		return
	}
	if len(r.Steps) == 0 {
		if r.Timing.Total > 0 {
			t.parts(ctx, r.Reached, &r.Timing)
		}
		return
	}
	for i := range r.Steps {
		st := &r.Steps[i]
		b := r.Reached.Add(st.Begin)
		sctx, s := t.t.Start(ctx, fmt.Sprintf("step %d %s", st.Index, st.Step), trace.WithTimestamp(b), trace.WithAttributes(
			attribute.String("plover.function", st.Step), attribute.Int("plover.step", st.Index), attribute.String("plover.version", st.Version),
			attribute.String("plover.start", st.Start.String()), attribute.String("plover.device", st.Device)))
		t.parts(sctx, b, &st.Timing)
		s.End(trace.WithTimestamp(b.Add(st.Timing.Total)))
	}
}

// serverFault reports whether failed c is the server's failure, which
// alone makes its span an error in OpenTelemetry's conventions for server
// spans: over HTTP a 5xx (a 4xx is the client's: its status stays unset);
// over gRPC Unknown, DeadlineExceeded, Unimplemented, Internal,
// Unavailable or DataLoss. Each transport's own code decides: a 507 is an
// error over HTTP, its gRPC ResourceExhausted is not.
func (c *Call) serverFault() bool {
	if c.GRPCCode < 0 {
		return c.Status >= 500
	}
	switch grpccodes.Code(c.GRPCCode) {
	case grpccodes.Unknown, grpccodes.DeadlineExceeded, grpccodes.Unimplemented, grpccodes.Internal, grpccodes.Unavailable, grpccodes.DataLoss:
		return true
	}
	return false
}

// grpcCodeNames are gRPC's canonical names of its status codes.
var grpcCodeNames = [...]string{"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
	"PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
	"UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"}

// errorType is failed c's error.type: its status code, as the conventions
// say, the HTTP status's number or the gRPC code's name.
func (c *Call) errorType() string {
	if c.GRPCCode < 0 {
		return strconv.Itoa(c.Status)
	}
	if c.GRPCCode < len(grpcCodeNames) {
		return grpcCodeNames[c.GRPCCode]
	}
	return strconv.Itoa(c.GRPCCode)
}

// parts lays a function request's phases out from b, in the order the
// engine spends them: resolve, the version's fetch (a cold request),
// queue, the load of a program and instance, sched, the run, then
// dispatch (the rest of the call to the device, which Server-Timing
// counts apart; under it a worker's handoff and handback): together they
// cover the request's total.
func (t *Tracer) parts(ctx context.Context, b time.Time, tm *call.Timing) {
	at := b
	span := func(ctx context.Context, name string, from time.Time, d time.Duration) context.Context {
		ctx, s := t.t.Start(ctx, name, trace.WithTimestamp(from))
		s.End(trace.WithTimestamp(from.Add(d)))
		return ctx
	}
	if tm.Resolve > 0 {
		span(ctx, "resolve", at, tm.Resolve)
		at = at.Add(tm.Resolve)
	}
	if tm.Prep > 0 {
		// The version's bundle, fetched (or waited for) before the
		// request queued for an instance.
		span(ctx, "fetch", at, tm.Prep)
		at = at.Add(tm.Prep)
	}
	if tm.Queue > 0 {
		qctx := span(ctx, "queue", at, tm.Queue)
		if tm.BatchWait > 0 {
			span(qctx, "batch wait", at.Add(tm.Queue-tm.BatchWait), tm.BatchWait)
		}
		at = at.Add(tm.Queue)
	}
	if load := tm.Load - tm.Prep; load > 0 {
		lctx := span(ctx, "load", at, load)
		if tm.Program > 0 {
			span(lctx, "program", at, tm.Program)
			if rest := load - tm.Program; rest > 0 {
				span(lctx, "instance", at.Add(tm.Program), rest)
			}
		}
		at = at.Add(load)
	}
	if tm.Sched > 0 {
		span(ctx, "sched", at, tm.Sched)
		at = at.Add(tm.Sched)
	}
	run := tm.CopyIn + tm.Kernels + tm.CopyOut
	if run > 0 {
		rctx := span(ctx, "run", at, run)
		// Each only where it took time, as every part (a run that
		// copied nothing in, a host's run with no copy out).
		if tm.CopyIn > 0 {
			span(rctx, "copy in", at, tm.CopyIn)
		}
		if tm.Kernels > 0 {
			span(rctx, "kernels", at.Add(tm.CopyIn), tm.Kernels)
		}
		if tm.CopyOut > 0 {
			span(rctx, "copy out", at.Add(tm.CopyIn+tm.Kernels), tm.CopyOut)
		}
		at = at.Add(run)
	}
	if tm.Dispatch > 0 {
		dctx := span(ctx, "dispatch", at, tm.Dispatch)
		// A worker's run: the message's wait for the worker first, the
		// reply's for the server last (laid out as the rest is; End keeps
		// both within dispatch).
		if tm.Handoff > 0 {
			span(dctx, "handoff", at, tm.Handoff)
		}
		if tm.Handback > 0 {
			span(dctx, "handback", at.Add(tm.Dispatch-tm.Handback), tm.Handback)
		}
	}
}

// maxMessage is the most of an error's text a span keeps.
const maxMessage = 1 << 10

// keptMessage is msg as a span keeps it past its request: its head, where
// it is longer than maxMessage, with its length. An error may quote what
// a client sent (an input's name, in a message of up to the body limit),
// and a span waits in the exporter's queue (2,048 of them) after the
// request's bytes are given back.
func keptMessage(msg string) string { return errdefs.Clip(msg, maxMessage) }
