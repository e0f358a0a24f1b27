package tracing

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/plover-run/plover/call"
)

// The environment decides: no endpoint, a disabled SDK or the none
// exporter is off (a nil Tracer, which the transports skip); an endpoint
// is on, over the protocol asked for; what Plover cannot honour is an
// error naming the variable, not a silent default.
func TestFromEnv(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		on   bool
		err  string
	}{
		{"nothing set", nil, false, ""},
		{"endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, true, ""},
		{"traces endpoint", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, true, ""},
		{"grpc", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, true, ""},
		{"disabled", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"}, false, ""},
		{"exporter none", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_EXPORTER": "none"}, false, ""},
		{"exporter zipkin", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_EXPORTER": "zipkin"}, false, "OTEL_TRACES_EXPORTER"},
		{"http/json", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, false, "OTEL_EXPORTER_OTLP_PROTOCOL"},
		{"traces http/json", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}, false, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"},
		// The SDK took these for a ratio of 1 (every request traced).
		{"sampler arg 5%", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "5%"}, false, "OTEL_TRACES_SAMPLER_ARG"},
		{"sampler misspelt", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_SAMPLER": "parentbased_ratio", "OTEL_TRACES_SAMPLER_ARG": "0.05"}, false, "OTEL_TRACES_SAMPLER"},
		{"propagator b3", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_PROPAGATORS": "b3"}, false, "OTEL_PROPAGATORS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := fromEnv(context.Background(), "test", func(k string) string { return tc.env[k] })
			if refused(t, err, tc.err) {
				return
			}
			if (tr != nil) != tc.on {
				t.Fatalf("tracer %v, want on=%v", tr, tc.on)
			}
			tr.Shutdown(context.Background())
		})
	}
}

// refused reports whether the case wants an error (naming says the
// variable it names first; "" none), failing t unless err is that.
func refused(t *testing.T, err error, naming string) bool {
	t.Helper()
	if naming == "" {
		if err != nil {
			t.Fatal(err)
		}
		return false
	}
	if err == nil || !strings.HasPrefix(err.Error(), naming) {
		t.Fatalf("err %v, want one naming %s", err, naming)
	}
	return true
}

// The sampler and propagators fromEnv builds are the environment's: which
// of a request without a parent, one whose client sent a sampled
// traceparent and one with an unsampled one are traced, and whether the
// sampled one joins the client's trace. OTEL_PROPAGATORS=none takes both
// choices from the client.
func TestFromEnvSamples(t *testing.T) {
	t.Setenv("OTEL_TRACES_SAMPLER", "") // the SDK's own reading, which Plover's must override
	t.Setenv("OTEL_TRACES_SAMPLER_ARG", "")
	type kept struct{ root, sampled, unsampled, joined bool }
	for _, tc := range []struct {
		name string
		env  map[string]string
		want kept
	}{
		{"default", nil, kept{root: true, sampled: true, joined: true}},
		{"always_off", map[string]string{"OTEL_TRACES_SAMPLER": "always_off"}, kept{joined: true}},
		{"always_on", map[string]string{"OTEL_TRACES_SAMPLER": "always_on"}, kept{root: true, sampled: true, unsampled: true, joined: true}},
		{"parentbased_always_off", map[string]string{"OTEL_TRACES_SAMPLER": "parentbased_always_off"}, kept{sampled: true, joined: true}},
		{"parentbased_traceidratio 0", map[string]string{"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0"}, kept{sampled: true, joined: true}},
		{"baggage only", map[string]string{"OTEL_PROPAGATORS": "baggage"}, kept{root: true, sampled: true, unsampled: true}},
		{"propagators none", map[string]string{"OTEL_PROPAGATORS": "none"}, kept{root: true, sampled: true, unsampled: true}},
		{"none, parentbased_always_off", map[string]string{"OTEL_PROPAGATORS": "none", "OTEL_TRACES_SAMPLER": "parentbased_always_off"}, kept{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
			for k, v := range tc.env {
				env[k] = v
			}
			tr, err := fromEnv(context.Background(), "test", func(k string) string { return env[k] })
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Shutdown(context.Background())
			const id = "4bf92f3577b34da6a3ce929d0e0e4736"
			start := func(traceparent string) trace.Span { // as Record does
				h := propagation.MapCarrier{}
				if traceparent != "" {
					h["traceparent"] = traceparent
				}
				_, s := tr.t.Start(tr.prop.Extract(context.Background(), h), "r")
				return s // not ended: nothing to export
			}
			sampled := start("00-" + id + "-00f067aa0ba902b7-01")
			got := kept{root: start("").IsRecording(), sampled: sampled.IsRecording(),
				unsampled: start("00-" + id + "-00f067aa0ba902b7-00").IsRecording(), joined: sampled.SpanContext().TraceID().String() == id}
			if got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// OTEL_TRACES_SAMPLER and _ARG: the SDK's values, case and spaces aside;
// what it would take for "trace everything" (a ratio it cannot parse or
// outside [0, 1], a name it does not know) or ignore (an argument to a
// sampler that reads none) is an error naming the variable.
func TestSamplerFromEnv(t *testing.T) {
	for _, tc := range []struct {
		sampler, arg string
		want         sdktrace.Sampler
		err          string
	}{
		{"", "", sdktrace.ParentBased(sdktrace.AlwaysSample()), ""},
		{"always_on", "", sdktrace.AlwaysSample(), ""},
		{" Always_Off ", "", sdktrace.NeverSample(), ""},
		{"parentbased_always_on", "", sdktrace.ParentBased(sdktrace.AlwaysSample()), ""},
		{"parentbased_always_off", "", sdktrace.ParentBased(sdktrace.NeverSample()), ""},
		{"traceidratio", "", sdktrace.TraceIDRatioBased(1), ""},
		{"traceidratio", " 0.25 ", sdktrace.TraceIDRatioBased(0.25), ""},
		{"parentbased_traceidratio", "0.05", sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.05)), ""},
		{"PARENTBASED_TRACEIDRATIO", "0", sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0)), ""},
		{"parentbased_traceidratio", "1", sdktrace.ParentBased(sdktrace.TraceIDRatioBased(1)), ""},
		{"parentbased_traceidratio", "5%", nil, "OTEL_TRACES_SAMPLER_ARG"},
		{"traceidratio", "0,05", nil, "OTEL_TRACES_SAMPLER_ARG"},
		{"traceidratio", "1.5", nil, "OTEL_TRACES_SAMPLER_ARG"},
		{"traceidratio", "-0.1", nil, "OTEL_TRACES_SAMPLER_ARG"},
		{"traceidratio", "NaN", nil, "OTEL_TRACES_SAMPLER_ARG"},
		{"parentbased_ratio", "0.05", nil, "OTEL_TRACES_SAMPLER "},
		{"jaeger_remote", "", nil, "OTEL_TRACES_SAMPLER "},
		{"always_on", "0.05", nil, "OTEL_TRACES_SAMPLER_ARG"},
		{"", "0.05", nil, "OTEL_TRACES_SAMPLER_ARG"},
	} {
		t.Run(tc.sampler+"="+tc.arg, func(t *testing.T) {
			env := map[string]string{"OTEL_TRACES_SAMPLER": tc.sampler, "OTEL_TRACES_SAMPLER_ARG": tc.arg}
			s, err := samplerFromEnv(func(k string) string { return env[k] })
			if refused(t, err, tc.err) {
				return
			}
			if s.Description() != tc.want.Description() {
				t.Fatalf("sampler %s, want %s", s.Description(), tc.want.Description())
			}
		})
	}
}

// OTEL_PROPAGATORS: whether a request's traceparent is read; baggage,
// which Plover has no use for, is never parsed, by default nor where it
// is named (OpenTelemetry's own default, tracecontext,baggage, is taken);
// none reads nothing; what Plover has no propagator for, none with others
// and an empty item are errors naming the variable.
func TestPropagatorFromEnv(t *testing.T) {
	for _, tc := range []struct {
		value                string
		traceparent, baggage bool
		err                  string
	}{
		{"", true, false, ""},
		{"tracecontext", true, false, ""},
		{"baggage", false, false, ""},
		{" TraceContext , Baggage ", true, false, ""},
		{"none", false, false, ""},
		{"b3", false, false, "OTEL_PROPAGATORS"},
		{"tracecontext,xray", false, false, "OTEL_PROPAGATORS"},
		{"none,tracecontext", false, false, "OTEL_PROPAGATORS"},
		{"none,baggage", false, false, "OTEL_PROPAGATORS"},
		{"tracecontext,", false, false, "OTEL_PROPAGATORS"},
	} {
		t.Run(tc.value, func(t *testing.T) {
			p, err := propagatorFromEnv(func(k string) string {
				if k == "OTEL_PROPAGATORS" {
					return tc.value
				}
				return ""
			})
			if refused(t, err, tc.err) {
				return
			}
			ctx := p.Extract(context.Background(), propagation.MapCarrier{
				"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "baggage": "k=v"})
			if tp, bg := trace.SpanContextFromContext(ctx).IsValid(), baggage.FromContext(ctx).Len() > 0; tp != tc.traceparent || bg != tc.baggage {
				t.Fatalf("reads traceparent %v, baggage %v; want %v, %v", tp, bg, tc.traceparent, tc.baggage)
			}
		})
	}
}

// recorded returns a Tracer that samples everything and the recorder of
// the spans it ends.
func recorded() (*Tracer, *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	return New(tracetest.NewNoopExporter(), sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSpanProcessor(rec)), rec
}

// aCall is a request to fn that ended now, with the transport's status.
func aCall(transport string, status, grpcCode int, err error) *Call {
	now := time.Now()
	r := &call.Request{Began: now.Add(-time.Millisecond), Reached: now.Add(-900 * time.Microsecond), Version: "v1", Device: "host0"}
	r.Timing.Total, r.Timing.Kernels = 500*time.Microsecond, 400*time.Microsecond
	return &Call{Transport: transport, Route: "r", Function: call.NameOf("fn"), End: now, Status: status, GRPCCode: grpcCode, Err: err, Req: r}
}

// A request's span is an error only for the server's failures, as
// OpenTelemetry's server conventions have it: an HTTP 5xx, a gRPC
// Unknown, DeadlineExceeded, Unimplemented, Internal, Unavailable or
// DataLoss. A client's (404, 422 invalid_input, 429, 499; gRPC NotFound,
// InvalidArgument, ResourceExhausted, Cancelled) leaves it unset; every
// failure has its error.type (the status) and error.message.
func TestSpanStatus(t *testing.T) {
	for _, tc := range []struct {
		name      string
		transport string
		status    int
		grpc      int
		fails     bool
		want      codes.Code
		errorType string
	}{
		{"http 200", "http", 200, -1, false, codes.Unset, ""},
		{"http 404", "http", 404, -1, true, codes.Unset, "404"},
		{"http 422", "http", 422, -1, true, codes.Unset, "422"},
		{"http 429", "http", 429, -1, true, codes.Unset, "429"},
		{"http 499", "http", 499, -1, true, codes.Unset, "499"},
		{"http 500", "http", 500, -1, true, codes.Error, "500"},
		{"http 503", "http", 503, -1, true, codes.Error, "503"},
		{"http 504", "http", 504, -1, true, codes.Error, "504"},
		{"http 507", "http", 507, -1, true, codes.Error, "507"},
		{"grpc ok", "grpc", 200, 0, false, codes.Unset, ""},
		{"grpc not found", "grpc", 404, 5, true, codes.Unset, "NOT_FOUND"},
		{"grpc invalid argument", "grpc", 422, 3, true, codes.Unset, "INVALID_ARGUMENT"},
		{"grpc resource exhausted", "grpc", 429, 8, true, codes.Unset, "RESOURCE_EXHAUSTED"},
		{"grpc resource exhausted (507)", "grpc", 507, 8, true, codes.Unset, "RESOURCE_EXHAUSTED"},
		{"grpc cancelled", "grpc", 499, 1, true, codes.Unset, "CANCELLED"},
		{"grpc unknown", "grpc", 500, 2, true, codes.Error, "UNKNOWN"},
		{"grpc deadline exceeded", "grpc", 504, 4, true, codes.Error, "DEADLINE_EXCEEDED"},
		{"grpc unimplemented", "grpc", 501, 12, true, codes.Error, "UNIMPLEMENTED"},
		{"grpc internal", "grpc", 500, 13, true, codes.Error, "INTERNAL"},
		{"grpc unavailable", "grpc", 503, 14, true, codes.Error, "UNAVAILABLE"},
		{"grpc data loss", "grpc", 500, 15, true, codes.Error, "DATA_LOSS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, rec := recorded()
			var err error
			if tc.fails {
				err = errors.New("it failed: \xff")
			}
			tr.Record(propagation.MapCarrier{}, aCall(tc.transport, tc.status, tc.grpc, err))
			if err := tr.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			var span sdktrace.ReadOnlySpan
			for _, s := range rec.Ended() {
				if s.SpanKind() == trace.SpanKindServer {
					span = s
				}
			}
			if span == nil {
				t.Fatal("no server span")
			}
			attrs := map[attribute.Key]string{}
			for _, a := range span.Attributes() {
				attrs[a.Key] = a.Value.Emit()
			}
			if st := span.Status(); st.Code != tc.want || (tc.want == codes.Error) != (st.Description == "it failed: \uFFFD") {
				t.Errorf("status %v %q, want %v", st.Code, st.Description, tc.want)
			}
			if attrs["error.type"] != tc.errorType {
				t.Errorf("error.type %q, want %q", attrs["error.type"], tc.errorType)
			}
			if msg := attrs["error.message"]; tc.fails != (msg == "it failed: \uFFFD") {
				t.Errorf("error.message %q", msg)
			}
		})
	}
}

// Shutdown waits for the spans of requests recorded before it, which are
// made on other goroutines (without the wait, most of these were lost); a
// Record racing Shutdown neither panics nor blocks it.
func TestShutdownWaitsForSpans(t *testing.T) {
	for _, tc := range []struct {
		name   string
		during int // Records on another goroutine, racing Shutdown
	}{
		{"recorded before", 0},
		{"recorded during", 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const rounds, per = 20, 20
			for range rounds {
				tr, rec := recorded()
				for range per {
					tr.Record(propagation.MapCarrier{}, aCall("http", 200, -1, nil))
				}
				var racing sync.WaitGroup
				racing.Add(1)
				go func() {
					defer racing.Done()
					for range tc.during {
						tr.Record(propagation.MapCarrier{}, aCall("http", 200, -1, nil))
					}
				}()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				err := tr.Shutdown(ctx)
				cancel()
				racing.Wait()
				if err != nil {
					t.Fatal(err)
				}
				servers := 0
				for _, s := range rec.Ended() {
					if s.SpanKind() == trace.SpanKindServer {
						servers++
					}
				}
				if servers < per || servers > per+tc.during {
					t.Fatalf("%d server spans for %d requests recorded before Shutdown (and %d during)", servers, per, tc.during)
				}
			}
		})
	}
}

// The function's attribute is the name a client sent, bounded: a gRPC
// model_name may be as long as the body limit, and each sampled request
// kept a copy of it whole in the exporter's queue (a review's probe: a
// 64 MiB attribute).
func TestTheFunctionAttributeIsBounded(t *testing.T) {
	for _, tc := range []struct{ name, want string }{
		{"fn", "fn"},
		{strings.Repeat("q", 63), strings.Repeat("q", 63)},
		{strings.Repeat("q", 1<<20), `"` + strings.Repeat("q", 64) + `"...`},
		{"f\xffn", "f\uFFFDn"},
	} {
		tr, rec := recorded()
		c := aCall("grpc", 404, 5, errors.New("no function"))
		c.Function = call.NameOf(tc.name)
		tr.Record(propagation.MapCarrier{}, c)
		if err := tr.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		got := serverAttr(rec, "plover.function")
		if got != tc.want {
			t.Errorf("a %d-byte name: plover.function %.80q (%d bytes), want %.80q", len(tc.name), got, len(got), tc.want)
		}
	}
}

// An error's text, which may quote what a client sent, is kept in a span
// to its first KiB and its length: the span outlives the request in the
// exporter's queue. It kept all of it (16 MiB for a 4 MiB name quoted).
func TestTheErrorMessageIsBounded(t *testing.T) {
	for _, tc := range []struct{ msg, want string }{
		{"bad input", "bad input"},
		{strings.Repeat("q", 1024), strings.Repeat("q", 1024)},
		{strings.Repeat("q", 1<<20), strings.Repeat("q", 1024) + "... (1048576 bytes)"},
		{strings.Repeat("q", 1023) + "é" + strings.Repeat("q", 9), strings.Repeat("q", 1023) + "... (1034 bytes)"}, // not inside a character
	} {
		tr, rec := recorded()
		tr.Record(propagation.MapCarrier{}, aCall("http", 400, 5, errors.New(tc.msg)))
		if err := tr.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		got := serverAttr(rec, "error.message")
		if got != tc.want {
			t.Errorf("a %d-byte message: error.message %.80q (%d bytes), want %.80q (%d)", len(tc.msg), got, len(got), tc.want, len(tc.want))
		}
	}
}

// serverAttr is the string attribute key of rec's server span, "(none)"
// where it has none.
func serverAttr(rec *tracetest.SpanRecorder, key attribute.Key) string {
	got := "(none)"
	for _, s := range rec.Ended() {
		for _, a := range s.Attributes() {
			if s.SpanKind() == trace.SpanKindServer && a.Key == key {
				got = a.Value.AsString()
			}
		}
	}
	return got
}

// spanned records c and returns its spans by name (the last of a name).
func spanned(t *testing.T, c *Call) map[string]sdktrace.ReadOnlySpan {
	t.Helper()
	tr, rec := recorded()
	tr.Record(propagation.MapCarrier{}, c)
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		got[s.Name()] = s
	}
	return got
}

// A part of zero length makes no span, the run's own parts too: a host
// run that copied nothing in or out showed empty "copy in" and "copy
// out" spans under its run, which README says are left out.
func TestZeroPartsAreLeftOut(t *testing.T) {
	for _, tc := range []struct {
		name         string
		tm           call.Timing
		want, absent []string
	}{
		{"kernels alone", call.Timing{Kernels: 400 * time.Microsecond},
			[]string{"run", "kernels", "dispatch"}, []string{"copy in", "copy out", "queue", "load", "sched"}},
		{"copies alone", call.Timing{CopyIn: 10 * time.Microsecond, CopyOut: 20 * time.Microsecond},
			[]string{"run", "copy in", "copy out"}, []string{"kernels"}},
		{"every run part", call.Timing{CopyIn: 10 * time.Microsecond, Kernels: 400 * time.Microsecond, CopyOut: 20 * time.Microsecond},
			[]string{"run", "copy in", "kernels", "copy out"}, nil},
		{"no run", call.Timing{Queue: 300 * time.Microsecond},
			[]string{"queue"}, []string{"run", "copy in", "kernels", "copy out"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := aCall("http", 200, -1, nil)
			c.Req.Timing = tc.tm
			c.Req.Timing.End(500 * time.Microsecond)
			sp := spanned(t, c)
			for _, n := range tc.want {
				if sp[n] == nil {
					t.Errorf("no %q span", n)
				}
			}
			for _, n := range tc.absent {
				if s := sp[n]; s != nil {
					t.Errorf("a %q span of %v", n, s.EndTime().Sub(s.StartTime()))
				}
			}
		})
	}
}

// The engine's parts are laid out from when it reached the request, to
// that plus its total, however long the transport took after it: they
// were laid back from when the answer was ready, after the transport had
// encoded it (/v2's JSON, /v1's base64), so that the encoding showed as
// time before the engine, in resolve or queue, and the run ended before
// the engine had run it. A pipeline's steps likewise; a request that
// failed before it ran has its parts laid out as one that ran.
func TestPartsAreLaidFromTheEngine(t *testing.T) {
	reached := time.Now().Add(-time.Second)
	const total, encoding = 10 * time.Millisecond, 50 * time.Millisecond
	type at struct{ from, to time.Duration } // after reached
	for _, tc := range []struct {
		name   string
		status int
		tm     call.Timing
		steps  []call.StepTiming
		want   map[string]at
	}{
		{"a run", 200, call.Timing{Resolve: time.Millisecond, Queue: 2 * time.Millisecond, Kernels: 6 * time.Millisecond}, nil,
			map[string]at{"resolve": {0, time.Millisecond}, "queue": {time.Millisecond, 3 * time.Millisecond},
				"kernels": {3 * time.Millisecond, 9 * time.Millisecond}, "dispatch": {9 * time.Millisecond, total}}},
		{"a 504 after its queue and a cold load", 504, call.Timing{Resolve: time.Millisecond, Prep: 3 * time.Millisecond, Load: 4 * time.Millisecond, Queue: 5 * time.Millisecond}, nil,
			map[string]at{"resolve": {0, time.Millisecond}, "fetch": {time.Millisecond, 4 * time.Millisecond},
				"queue": {4 * time.Millisecond, 9 * time.Millisecond}, "load": {9 * time.Millisecond, total}}},
		{"a pipeline", 200, call.Timing{}, []call.StepTiming{
			{Step: "a", Index: 0, Version: "va", Timing: call.Timing{Kernels: 4 * time.Millisecond, Total: 4 * time.Millisecond}},
			{Step: "b", Index: 1, Version: "vb", Timing: call.Timing{Kernels: 5 * time.Millisecond, Total: 5 * time.Millisecond}, Begin: 5 * time.Millisecond}},
			map[string]at{"step 0 a": {0, 4 * time.Millisecond}, "step 1 b": {5 * time.Millisecond, total}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := aCall("http", tc.status, -1, nil)
			r := c.Req
			r.Began, r.Reached, r.Timing, r.Steps = reached.Add(-time.Millisecond), reached, tc.tm, tc.steps
			r.Timing.End(total)
			c.End = reached.Add(total + encoding)
			sp := spanned(t, c)
			for name, w := range tc.want {
				s := sp[name]
				if s == nil {
					t.Errorf("no %q span", name)
					continue
				}
				if from, to := s.StartTime().Sub(reached), s.EndTime().Sub(reached); from != w.from || to != w.to {
					t.Errorf("%s from %v to %v after the engine reached the request, want %v to %v", name, from, to, w.from, w.to)
				}
			}
		})
	}
}
