// Package frontdoor is what every transport calls between its own encoding
// and the request path: the gate (tokens, scopes, limits), the runner
// (functions and pipelines, package pipeline), and, once an invoke ends,
// the one classification of its outcome (apierr), the log line of a
// failure the client is not told the cause of, its count (reqmetrics) and
// its trace (tracing). httpapi and grpcapi keep only what their protocols
// need: parsing, encoding, and where the token and the trace context are
// found. A new transport takes a Door and writes its encoding; nothing
// else is stitched by hand.
package frontdoor

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/propagation"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/apierr"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/gate"
	"github.com/plover-run/plover/ioshare"
	"github.com/plover-run/plover/netguard"
	"github.com/plover-run/plover/pipeline"
	"github.com/plover-run/plover/reqmetrics"
	"github.com/plover-run/plover/tracing"
)

// Runner is the request path (pipeline.Runner): functions and pipelines.
type Runner interface {
	// Invoke runs req on name's current version: a function's chain or a
	// pipeline's steps.
	Invoke(ctx context.Context, name string, req *call.Request) error
	// Admit is asked before a body is read: the most input bytes name
	// takes (0: unknown) and its current version, or the error a request
	// would get now (404, 429 for a full queue). It holds nothing.
	// Its store read ends at deadline (the request's: Door.Deadline).
	Admit(ctx context.Context, name string, deadline time.Time) (pipeline.Admission, error)
	// Land lends memory to read a request's body into, where the device
	// that will run it reads it (a worker's slot), or nil; the transport
	// puts it in the request and releases it once the response is written.
	Land(name string) call.Landing
	// PinLanding pins the version l, a landing Land lent for name, was
	// lent for, as Pin does: a body read into it runs there, whatever
	// deploys landed since. False where l is not such a landing (Pin).
	PinLanding(name string, l call.Landing) (pipeline.Pin, bool)
	// IO is name's share of the server's own I/O, for reading its body
	// and writing its answer a piece at a time in its turns, or nil for a
	// name the node has no record of (ask after Admit or Invoke met it).
	IO(name string) *ioshare.Flow
	// Deadline is a request's deadline: d, the client's, or the node's
	// request timeout (plover serve --timeout) from start when d is zero:
	// the one place that default is kept (the engine's).
	Deadline(d, start time.Time) time.Time
	// Refused counts, in name's requests and, by status's class, its
	// client errors or errors, one that its transport refused itself
	// before Invoke (End calls it).
	Refused(name string, status int)
	// Names is every function's name, for a did-you-mean on an error's
	// path: it may list the store (engine.Engine.Names bounds how often).
	Names() []string
	// Pin resolves name's current version once, without loading it, and
	// holds it until its Release: a route that reads the version (the Open
	// Inference Protocol lays inputs out by its tensors) runs that version.
	// Its store read ends at deadline (the request's: Door.Deadline).
	Pin(ctx context.Context, name string, deadline time.Time) (pipeline.Pin, error)
	// PinVersion is Pin for the version ref names (an id, a prefix of 8 or
	// more characters, or a model repository's label), current or not.
	PinVersion(ctx context.Context, name, ref string, deadline time.Time) (pipeline.Pin, error)
	Health() (bool, []api.DeviceHealth)
}

// Config assembles a Door. Gate nil: no authentication; Metrics and Tracer
// nil: not counted, not traced; Log nil: discarded.
type Config struct {
	Runner  Runner
	Gate    *gate.Gate
	Metrics *reqmetrics.Metrics
	Tracer  *tracing.Tracer
	Log     *slog.Logger
}

// Door is one server's front door, shared by its transports, so a token's
// limits, the request counts and the traces are one however clients
// connect.
type Door struct {
	Runner
	gate    *gate.Gate
	metrics *reqmetrics.Metrics
	tracer  *tracing.Tracer
	log     *slog.Logger
	// panicLog caps the lines about recovered panics (Panicked).
	panicLog netguard.LogThrottle
	// failLog caps the lines about failures (logFailure), which clients
	// can drive: one a second per function.
	failLog netguard.LogThrottle
}

// New returns the Door cfg describes.
func New(cfg Config) *Door {
	if cfg.Gate == nil {
		cfg.Gate = gate.New(nil, nil)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Door{Runner: cfg.Runner, gate: cfg.Gate, metrics: cfg.Metrics, tracer: cfg.Tracer, log: cfg.Log}
}

// Begin normalises an invoke's request once, as the transport begins it:
// its start, and its deadline (Deadline). Every layer after the door reads
// the one deadline, so none keeps a default of its own.
func (d *Door) Begin(r *call.Request, start, asked time.Time) {
	r.Began, r.Deadline = start, d.Deadline(start, asked)
}

// Deadline is a request's deadline: asked, the client's, or the runner's
// timeout from start when the client asked for none (zero). A request
// that is not an invoke (a model's metadata) bounds its store read by it.
// A door without a runner (a control-plane server in a test) has none.
func (d *Door) Deadline(start, asked time.Time) time.Time {
	if d.Runner == nil {
		return asked
	}
	return d.Runner.Deadline(asked, start)
}

// Gate is the door's gate, for a transport to admit callers with what its
// protocol carries (a header, metadata).
func (d *Door) Gate() *gate.Gate { return d.gate }

// Traced reports whether invokes are traced: a transport builds a trace
// carrier only then.
func (d *Door) Traced() bool { return d.tracer != nil }

// Outcome is one ended invoke as its transport saw it.
type Outcome struct {
	Transport string    // "http", "grpc"
	Route     string    // the span's name and the log's "route"
	Function  call.Name // what the request names: End keeps only copies
	// Carrier holds the request's trace context; read only when Traced.
	Carrier propagation.TextMapCarrier
	Req     *call.Request // begun at the door (Begin): its start is the trace's
	Err     error         // nil: it succeeded
	// Authorization is the request's Authorization header (gRPC: its
	// authorization metadata), read only when Err names no function (the
	// names a did-you-mean may offer); borrowed for the call.
	Authorization []byte
}

// End classifies an ended invoke once, logs a failure whose cause the
// client is not told (a foreign error) or that is the server's (5xx),
// counts it by function and status (and, refused by the transport before
// it ran, in the function's client errors: Runner.Refused), and records
// its trace. The transport
// encodes st and msg (nothing to write on success).
func (d *Door) End(o *Outcome) (st apierr.Status, msg string) {
	st, kind := apierr.Status{HTTP: 200, Name: "ok"}, errdefs.KindInternal
	if o.Err != nil {
		var known bool
		st, kind, msg, known = d.classify(o.Err, o.Authorization)
		d.logFailure(o.Err, o.Transport, o.Route, o.Function.Borrow(), st, known)
		if d.Runner != nil && refusedByTransport(o.Err, o.Req) {
			d.Runner.Refused(o.Function.Borrow(), st.HTTP)
		}
	}
	if d.metrics != nil {
		d.metrics.Record(o.Function, st.HTTP, kind, o.Req)
	}
	if d.tracer != nil {
		code := -1
		if o.Transport == "grpc" {
			code = int(st.GRPC)
		}
		d.tracer.Record(o.Carrier, &tracing.Call{Transport: o.Transport, Route: o.Route, Function: o.Function,
			End: time.Now(), Status: st.HTTP, GRPCCode: code, Err: o.Err, Req: o.Req})
	}
	return st, msg
}

// refusedByTransport reports whether err ended req before Invoke, so
// that the engine did not count it: one marked by Refusal (Admit's, a
// body the transport could not read in time or room), or a transport's
// own 4xx (an apierr.Error: a body it could not parse, over the
// function's limit, of a type it does not take) made before Invoke
// resolved a version (req.Version, which only the engine and a pipeline's
// run set, and which they counted). A transport's error after the run (a
// 5xx output it cannot encode, /v2's 400 for JSON data over 16 MiB) is
// no refusal: counted here too, the request showed twice in plover ls,
// once a success and once a client error. On the error path only: the
// errors.As targets escape.
func refusedByTransport(err error, req *call.Request) bool {
	var r *refusal
	if errors.As(err, &r) {
		return true
	}
	var e *apierr.Error
	return errors.As(err, &e) && e.Status.HTTP < 500 && (req == nil || req.Version == "")
}

// Refusal marks err (nil: nil) as the end of a request before it reached
// the engine, whatever its status: End then counts it in the function's
// requests (Runner.Refused), as the metrics count it, which Invoke never
// did. Its status and message are err's.
func Refusal(err error) error {
	if err == nil {
		return nil
	}
	return &refusal{err}
}

type refusal struct{ error }

func (r *refusal) Unwrap() error { return r.error }

// Admit is the runner's, its full queue's 429 marked as a refusal
// (Refusal): the request ends there, before the engine, which counts the
// same 429 when Invoke meets it (a body too small to be admitted first).
// Its other errors (a pipeline's step deleted, the store) are not marked:
// Invoke's pin counts none of them, and a request's counts must not
// depend on its body's size.
func (d *Door) Admit(ctx context.Context, name string, deadline time.Time) (pipeline.Admission, error) {
	a, err := d.Runner.Admit(ctx, name, deadline)
	if errdefs.KindOf(err) == errdefs.KindBusy {
		return a, Refusal(err)
	}
	return a, err
}

// Fail classifies a failure of a request that is not an invoke (metadata,
// readiness, the control plane) and logs it as End does; it is not counted.
// authorization is the request's (Outcome.Authorization).
func (d *Door) Fail(err error, transport, route string, authorization []byte) (apierr.Status, string) {
	st, _, msg, known := d.classify(err, authorization)
	d.logFailure(err, transport, route, "", st, known)
	return st, msg
}

// FailUnnamed is Fail for an invoke refused before the name it asks for
// could be read (a gRPC message that waited for room in --max-body-memory
// before it was read): counted besides in plover_requests_total under
// _unknown, so that a rate of 503s or 504s on requests sees it.
func (d *Door) FailUnnamed(err error, transport, route string, authorization []byte) (apierr.Status, string) {
	st, msg := d.Fail(err, transport, route, authorization)
	if d.metrics != nil {
		d.metrics.Failed(reqmetrics.Unknown, st.HTTP)
	}
	return st, msg
}

// classify is apierr.Classify, the one mapping of both transports, and for
// an error about a name no function has (errdefs.NoFunction: a 404, a
// pipeline's step), a did-you-mean in the message: a function within a
// typo of the name, among those the caller's token may see (gate.Sees).
func (d *Door) classify(err error, authorization []byte) (apierr.Status, errdefs.Kind, string, bool) {
	st, kind, msg, known := apierr.Classify(err)
	var nf *errdefs.NoFunction
	if known && d.Runner != nil && errors.As(err, &nf) {
		msg += apierr.DidYouMean(nf.Name, d.Runner.Names(), d.gate.Sees(authorization))
	}
	return st, kind, msg, known
}

// logFailure logs a failure whose cause the client is not told (an error
// of no class) or that is the server's or the function's (5xx): at most a
// line a second per function (per route for a request that names none)
// and 20 a second in all (netguard.LogThrottle.AllowKey), since a client can
// make a function fail or ask for a deadline it cannot meet at its own
// rate; a line says how many of its function's the throttle held back
// before it (not_logged), and every failure is counted in /metrics.
// function may be borrowed.
func (d *Door) logFailure(err error, transport, route, function string, st apierr.Status, known bool) {
	if known && st.HTTP < 500 {
		return
	}
	key := function
	if key == "" {
		key = route
	}
	// Bounded (KeptName): the throttle keeps its keys, and a gRPC model
	// name may be as long as the body limit.
	key = errdefs.KeptName(key)
	ok, unlogged := d.failLog.AllowKey(key)
	if !ok {
		return
	}
	attrs := []any{"transport", transport, "route", route}
	if function != "" {
		attrs = append(attrs, "function", key)
	}
	if unlogged > 0 {
		attrs = append(attrs, "not_logged", unlogged) // this function's failures the throttle held back before this one
	}
	if !known { // a foreign error's text is for the log, not the client
		d.log.Error("request failed", append(attrs, "error", err)...)
		return
	}
	d.log.Warn("request failed", append(attrs, "status", st.HTTP, "error", err)...)
}
