// Package grpcapi serves the Open Inference Protocol over gRPC
// (inference.GRPCInferenceService): health, server and model metadata, and
// ModelInfer, on the same request path as the HTTP routes (package
// pipeline: functions and pipelines alike), behind the same gate (tokens,
// scopes, limits), counted in the same request metrics, with errors mapped
// by the same table (apierr).
package grpcapi

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"google.golang.org/protobuf/proto"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/apierr"
	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/gate"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
	"github.com/plover-run/plover/pipeline"
	"github.com/plover-run/plover/reqmetrics"
	"github.com/plover-run/plover/tracing"
)

// Invoker is the request path (pipeline.Runner).
type Invoker interface {
	// Pin resolves name's current version (a function's, or a pipeline's
	// and its steps') and holds it until Release.
	Pin(ctx context.Context, name string) (pipeline.Pin, error)
	Health() (bool, []api.DeviceHealth)
}

// Options configure a Server.
type Options struct {
	Log     *slog.Logger
	Version string
	// Gate admits callers; share the HTTP server's, so that a token's
	// limits hold across both. Nil: no authentication.
	Gate *gate.Gate
	// Metrics counts requests; share the HTTP server's. Nil: not counted.
	Metrics *reqmetrics.Metrics
	// Ready, if set, is what ServerReady adds to the devices' health (a
	// server shutting down answers false first).
	Ready func() bool
	// MaxMessageBytes bounds a request and a response message (the
	// server's --max-body-mb). Default 256 MiB.
	MaxMessageBytes int
	// Tracer, when set, records every inference as spans.
	Tracer *tracing.Tracer
	// TLS, when set, serves TLS (its certificate may be reloaded through
	// GetCertificate); h2 is added to its NextProtos.
	TLS *tls.Config
}

// Server implements inference.GRPCInferenceService.
type Server struct {
	pb.UnimplementedGRPCInferenceServiceServer
	inv  Invoker
	opts Options

	logMu   sync.Mutex
	lastLog time.Time
}

// New returns a Server over inv.
func New(inv Invoker, opts Options) *Server {
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.MaxMessageBytes <= 0 {
		opts.MaxMessageBytes = 256 << 20
	}
	return &Server{inv: inv, opts: opts}
}

// GRPC returns a grpc.Server with s registered, its limits and credentials
// set; serve it with Serve on a listener (behind the connection cap).
func (s *Server) GRPC() *grpc.Server {
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(s.opts.MaxMessageBytes),
		grpc.MaxSendMsgSize(s.opts.MaxMessageBytes),
		// Streams per connection: with the connection cap, what bounds
		// the requests (and their messages in memory) one client holds.
		// gRPC reads a whole message before a handler runs, so unlike
		// HTTP bodies these are not counted in --max-body-memory; the tap
		// keeps them to callers with a known token.
		grpc.MaxConcurrentStreams(32),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: 120 * time.Second}),
		grpc.InTapHandle(s.tap),
		grpc.UnaryInterceptor(s.admit),
		// Fixed flow-control windows turn off grpc-go's bandwidth-delay
		// probing, a ping per burst of data that a request/response
		// protocol on a fast network pays for in latency; 4 MiB per
		// stream and 16 MiB per connection keep inputs of a few MiB
		// from waiting for window updates.
		grpc.InitialWindowSize(4 << 20),
		grpc.InitialConnWindowSize(16 << 20),
		// A pool of goroutines serves the streams, rather than one
		// started for each.
		grpc.NumStreamWorkers(uint32(max(2, runtime.GOMAXPROCS(0)))),
		grpc.SharedWriteBuffer(true),
	}
	if s.opts.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(s.opts.TLS)))
	}
	g := grpc.NewServer(opts...)
	pb.RegisterGRPCInferenceServiceServer(g, s)
	return g
}

// required is the scope a method needs and the function it acts on, as
// the HTTP routes: health and server metadata are open, as /v2 and
// /v2/health are; model metadata and readiness need read; inference needs
// invoke on the model.
func required(req any) (scope auth.Scope, fn string, open bool) {
	switch r := req.(type) {
	case *pb.ServerLiveRequest, *pb.ServerReadyRequest, *pb.ServerMetadataRequest:
		return 0, "", true
	case *pb.ModelInferRequest:
		return auth.Invoke, r.GetModelName(), false
	}
	return auth.Read, "", false
}

// openMethods need no token, as /v2 and /v2/health/* over HTTP.
var openMethods = map[string]bool{
	pb.GRPCInferenceService_ServerLive_FullMethodName:     true,
	pb.GRPCInferenceService_ServerReady_FullMethodName:    true,
	pb.GRPCInferenceService_ServerMetadata_FullMethodName: true,
}

// tap refuses a call without a known token from its headers, before its
// message is read (admit then checks its scope and model).
func (s *Server) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	g := s.opts.Gate
	if g == nil || g.Open() || openMethods[info.FullMethodName] {
		return ctx, nil
	}
	var authz []byte
	if v := info.Header.Get("authorization"); len(v) > 0 {
		authz = []byte(v[0])
	}
	if r := g.Authenticate(authz); r != nil {
		s.logRefusal(ctx, info.FullMethodName, r)
		return ctx, status.Error(r.Status.GRPC, r.Msg)
	}
	return ctx, nil
}

// admit is the gate for every method: the token in the authorization
// metadata ("Bearer TOKEN"), as HTTP's Authorization header.
func (s *Server) admit(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	g := s.opts.Gate
	if g == nil || g.Open() {
		return h(ctx, req)
	}
	scope, fn, open := required(req)
	if open {
		return h(ctx, req)
	}
	var authz []byte
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get("authorization"); len(v) > 0 {
			authz = []byte(v[0])
		}
	}
	tk, r := g.Admit(authz, scope, fn)
	if r != nil {
		if r.Status.HTTP != 429 {
			s.logRefusal(ctx, info.FullMethod, r)
		}
		return nil, status.Error(r.Status.GRPC, r.Msg)
	}
	defer tk.Done()
	return h(ctx, req)
}

// logRefusal logs an authentication failure, once a second at most, so
// that a client hammering with bad tokens cannot flood the log.
func (s *Server) logRefusal(ctx context.Context, method string, r *gate.Refusal) {
	s.logMu.Lock()
	now := time.Now()
	ok := now.Sub(s.lastLog) >= time.Second
	if ok {
		s.lastLog = now
	}
	s.logMu.Unlock()
	if !ok {
		return
	}
	client := "?"
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		if host, _, err := net.SplitHostPort(p.Addr.String()); err == nil {
			client = host
		}
	}
	s.opts.Log.Warn("request refused", "reason", r.Reason, "client", client, "method", method, "transport", "grpc")
}

// ServerLive answers while the process serves.
func (s *Server) ServerLive(context.Context, *pb.ServerLiveRequest) (*pb.ServerLiveResponse, error) {
	return &pb.ServerLiveResponse{Live: true}, nil
}

// ServerReady is /v2/health/ready: the devices healthy and the server not
// draining.
func (s *Server) ServerReady(context.Context, *pb.ServerReadyRequest) (*pb.ServerReadyResponse, error) {
	ok, _ := s.inv.Health()
	if s.opts.Ready != nil && !s.opts.Ready() {
		ok = false
	}
	return &pb.ServerReadyResponse{Ready: ok}, nil
}

// ServerMetadata names the server. The binary tensor extension is HTTP's:
// gRPC carries raw bytes natively.
func (s *Server) ServerMetadata(context.Context, *pb.ServerMetadataRequest) (*pb.ServerMetadataResponse, error) {
	return &pb.ServerMetadataResponse{Name: "plover", Version: s.opts.Version, Extensions: []string{}}, nil
}

// ModelReady is a model's /ready: it exists (in the version asked, if
// any) and the devices are healthy.
func (s *Server) ModelReady(ctx context.Context, req *pb.ModelReadyRequest) (*pb.ModelReadyResponse, error) {
	pin, _, err := s.pin(ctx, req.GetName(), req.GetVersion())
	if err != nil {
		return nil, s.statusOf(err, "ModelReady")
	}
	pin.Release()
	ok, _ := s.inv.Health()
	return &pb.ModelReadyResponse{Ready: ok}, nil
}

// ModelMetadata is a model's current version and tensors.
func (s *Server) ModelMetadata(ctx context.Context, req *pb.ModelMetadataRequest) (*pb.ModelMetadataResponse, error) {
	pin, ts, err := s.pin(ctx, req.GetName(), req.GetVersion())
	if err != nil {
		return nil, s.statusOf(err, "ModelMetadata")
	}
	cur := pin.Version()
	pin.Release()
	return &pb.ModelMetadataResponse{Name: req.GetName(), Versions: []string{cur.ID}, Platform: "plover",
		Inputs: tensorMeta(ts.Inputs), Outputs: tensorMeta(ts.Outputs)}, nil
}

func tensorMeta(ts []abi.Tensor) []*pb.ModelMetadataResponse_TensorMetadata {
	out := make([]*pb.ModelMetadataResponse_TensorMetadata, len(ts))
	for i, t := range ts {
		out[i] = &pb.ModelMetadataResponse_TensorMetadata{Name: t.Name, Datatype: t.Datatype, Shape: t.Shape}
	}
	return out
}

// pin resolves name's current version, as the HTTP route does: the version
// whose tensors lay the inputs out is the version that runs. A version
// asked for must be the current one.
func (s *Server) pin(ctx context.Context, name, version string) (pipeline.Pin, *abi.Tensors, error) {
	if name == "" {
		return pipeline.Pin{}, nil, badRequest("model name: empty")
	}
	pin, err := s.inv.Pin(ctx, name)
	if err != nil {
		return pin, nil, err
	}
	cur := pin.Version()
	if version != "" && !cur.Matches(version) {
		pin.Release()
		return pin, nil, &reqError{apierr.NotFound, fmt.Sprintf("model %s version %q is not its current version %s: Plover serves the current version (plover rollback to change it; a prefix needs 8+ characters)", name, version, cur.ID)}
	}
	ts := cur.Tensors
	if ts == nil {
		ts = &abi.RawTensors
	}
	return pin, ts, nil
}

// ModelInfer runs one inference: inputs from raw_input_contents or typed
// contents, laid out in the model's declared order; the outputs answered
// the way the inputs came (raw for raw, typed for typed where the
// datatype has typed contents), each output named in outputs, or all.
func (s *Server) ModelInfer(ctx context.Context, req *pb.ModelInferRequest) (*pb.ModelInferResponse, error) {
	var t0 time.Time
	if s.opts.Tracer != nil {
		t0 = time.Now()
	}
	name := req.GetModelName()
	var r engine.Request
	resp, err := s.infer(ctx, req, &r)
	st, kind := apierr.Status{HTTP: 200, GRPC: codes.OK}, engine.KindInternal
	if err != nil {
		st, kind = classify(err)
	}
	if s.opts.Metrics != nil {
		s.opts.Metrics.Record(name, st.HTTP, kind, &r.Timing)
	}
	if s.opts.Tracer != nil {
		md, _ := metadata.FromIncomingContext(ctx)
		s.opts.Tracer.Record(mdCarrier(md), &tracing.Call{Transport: "grpc", Route: "inference.GRPCInferenceService/ModelInfer",
			Function: name, Start: t0, End: time.Now(), Status: st.HTTP, GRPCCode: int(st.GRPC), Err: err, Req: &r})
	}
	if err != nil {
		return nil, s.statusOf(err, "ModelInfer")
	}
	// What HTTP says in Server-Timing, X-Plover-Start and X-Plover-Version.
	grpc.SetHeader(ctx, metadata.Pairs("server-timing", string(reqmetrics.AppendServerTiming(make([]byte, 0, 160), &r)),
		"x-plover-start", reqmetrics.StartNames[r.Start], "x-plover-version", r.Version))
	return resp, nil
}

func (s *Server) infer(ctx context.Context, req *pb.ModelInferRequest, r *engine.Request) (*pb.ModelInferResponse, error) {
	if d, ok := ctx.Deadline(); ok {
		// The client's deadline is the request's: queue time plus the run.
		r.Deadline = d
	}
	// The engine learns of a client that cancels by polling Gone (499, as
	// for HTTP), and of its deadline through r.Deadline (504,
	// DeadlineExceeded): the RPC's context, which ends at that deadline
	// too, would read as a cancellation.
	// A client whose own deadline passes resets the stream, which reads
	// as a cancellation a little before the server's copy of the deadline:
	// near the deadline, that is the deadline's to report (504).
	rpc := ctx
	d, hasDeadline := ctx.Deadline()
	r.Gone = func() bool {
		return errors.Is(rpc.Err(), context.Canceled) && (!hasDeadline || time.Until(d) > goneMargin)
	}
	ctx = context.WithoutCancel(ctx)
	pin, ts, err := s.pin(ctx, req.GetModelName(), req.GetModelVersion())
	if err != nil {
		return nil, err
	}
	defer pin.Release()
	typed, err := layInputs(req, ts.Inputs, r)
	if err != nil {
		return nil, err
	}
	pick, err := requested(req.GetOutputs(), ts.Outputs)
	if err != nil {
		return nil, err
	}
	if err := pin.Invoke(ctx, r); err != nil {
		return nil, err
	}
	resp, err := outputs(req, r, ts.Outputs, pick, typed)
	if err == nil && typed && proto.Size(resp) > s.opts.MaxMessageBytes {
		// Typed contents can be ten times the raw bytes (a negative
		// int32 is a 10-byte varint): what does not fit goes raw.
		resp, err = outputs(req, r, ts.Outputs, pick, false)
	}
	return resp, err
}

// goneMargin is how near its deadline a reset stream counts as timed out
// rather than cancelled.
const goneMargin = 25 * time.Millisecond

// reqError is a request the transport refused itself, or an output it
// could not encode.
type reqError struct {
	st  apierr.Status
	msg string
}

func (e *reqError) Error() string { return e.msg }

func badRequest(format string, a ...any) error {
	return &reqError{apierr.BadRequest, fmt.Sprintf(format, a...)}
}

// classify is an error's status and the engine kind the metrics count.
func classify(err error) (apierr.Status, engine.Kind) {
	var rq *reqError
	if errors.As(err, &rq) {
		if rq.st.HTTP >= 500 {
			return rq.st, engine.KindInternal
		}
		if rq.st.HTTP == 404 {
			return rq.st, engine.KindNotFound
		}
		return rq.st, engine.KindBadRequest
	}
	k := engine.KindOf(err)
	return apierr.Of(k), k
}

// statusOf is err as a gRPC status: the class's code and the message a
// client of the HTTP routes reads; a foreign error's text goes to the log
// only. A 429 says when to retry, as HTTP's Retry-After does.
func (s *Server) statusOf(err error, method string) error {
	st, _ := classify(err)
	var rq *reqError
	var ee *engine.Error
	msg := "internal error"
	switch {
	case errors.As(err, &rq):
		msg = rq.msg
	case errors.As(err, &ee):
		msg = ee.Msg
		if st.HTTP >= 500 {
			s.opts.Log.Warn("request failed", "method", method, "code", st.GRPC.String(), "error", err)
		}
	default:
		s.opts.Log.Error("request failed", "method", method, "error", err)
	}
	if st.GRPC == codes.ResourceExhausted && st.HTTP == 429 {
		msg += " (retry in 1 s)"
	}
	return status.Error(st.GRPC, msg)
}

// mdCarrier reads the trace context from gRPC metadata (its keys are
// lower case, as traceparent and tracestate are).
type mdCarrier metadata.MD

func (c mdCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}
func (c mdCarrier) Set(string, string) {}
func (c mdCarrier) Keys() []string     { return nil }
