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
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"google.golang.org/protobuf/proto"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/apierr"
	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/gate"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
	"github.com/plover-run/plover/ioshare"
	"github.com/plover-run/plover/netguard"
	"github.com/plover-run/plover/oip"
	"github.com/plover-run/plover/pipeline"
	"github.com/plover-run/plover/reqmetrics"
)

// Options configure a Server.
type Options struct {
	Log     *slog.Logger
	Version string
	// Ready, if set, is what ServerReady adds to the devices' health (a
	// server shutting down answers false first).
	Ready func() bool
	// MaxMessageBytes bounds a request and a response message (the
	// server's --max-body; a request up to envelope over it is read, to
	// be refused with a message that says so). Default 256 MiB.
	MaxMessageBytes int
	// ReadTimeout bounds the time from a call's headers to its message
	// (HTTP's read timeout); past it the call is cancelled. It bounds a
	// connection's handshake too. 0: 60 s.
	ReadTimeout time.Duration
	// WriteTimeout bounds the time an answer written from its function's
	// slot may hold the slot (HTTP's write timeout): past it the call's
	// connection is closed. 0: 60 s.
	WriteTimeout time.Duration
	// BodyBudget, when set, is the request bytes held in memory that
	// ModelInfer's messages count in, with HTTP's bodies (room.go).
	BodyBudget Budget
	// TLS, when set, serves TLS (its certificate may be reloaded through
	// GetCertificate); h2 is added to its NextProtos.
	TLS *tls.Config
}

// Server implements inference.GRPCInferenceService.
type Server struct {
	pb.UnimplementedGRPCInferenceServiceServer
	door *frontdoor.Door
	opts Options

	authLog   netguard.LogThrottle
	authLines refusalLog // the lines authLog lets through
	anon      anonCalls
	refused   refusals  // the codec's (wire.go)
	conns     conns     // the connections, for calls to put in their functions' turns (conns.go)
	held      heldSlots // the slots of answers on connections closed for holding them (held.go)
	// inferInfo is ModelInfer's, for its interceptors (io.go).
	inferInfo grpc.UnaryServerInfo
}

// New returns a Server over door, the front door it shares with the HTTP
// server: its gate, request metrics, tracer, request path and request
// timeout, so a token's limits and the counts hold across both.
func New(door *frontdoor.Door, opts Options) *Server {
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.MaxMessageBytes <= 0 {
		opts.MaxMessageBytes = 256 << 20
	}
	if opts.ReadTimeout <= 0 {
		opts.ReadTimeout = 60 * time.Second
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = 60 * time.Second
	}
	s := &Server{door: door, opts: opts, authLines: refusalLog{log: opts.Log}, conns: conns{wait: opts.ReadTimeout}, held: heldSlots{log: opts.Log, writeTimeout: opts.WriteTimeout}}
	s.inferInfo = grpc.UnaryServerInfo{Server: s, FullMethod: pb.GRPCInferenceService_ModelInfer_FullMethodName}
	return s
}

// GRPC returns a grpc.Server with s registered, its limits and credentials
// set; serve it with Serve on a listener (behind the connection cap).
func (s *Server) GRPC() *grpc.Server {
	opts := []grpc.ServerOption{
		grpc.ForceServerCodecV2(recoveringCodec{newCodec(s), s.door}),
		// gRPC-Go refuses a message over its receive limit itself, from
		// its length, before any handler: ResourceExhausted, the class of
		// a busy server, naming no flag. Up to envelope over the limit
		// the message is read, and ModelInfer refuses it as HTTP refuses
		// a body over --max-body (too_large).
		grpc.MaxRecvMsgSize(s.opts.MaxMessageBytes + envelope),
		grpc.MaxSendMsgSize(s.opts.MaxMessageBytes),
		grpc.RPCDecompressor(refuseCompressed{}), //nolint:staticcheck // the one hook that keeps the registered gzip from inflating a call's message
		// Streams per connection: with the connection cap, what bounds
		// the requests one client holds, and the messages read before
		// they are counted in --max-body-memory (room.go); the tap keeps
		// them to callers with a known token.
		grpc.MaxConcurrentStreams(32),
		// A call's headers are read whole before the tap sees them:
		// bounded as HTTP bounds a request's (431 past 4 KiB), with room
		// for trace context and a token.
		grpc.MaxHeaderListSize(maxHeaderList),
		// A connection's handshake (TLS, the HTTP/2 preface and
		// settings) is bounded as HTTP bounds a request's arrival:
		// gRPC-Go's own bound is two minutes, for a place under the
		// connection cap that HTTP shares.
		grpc.ConnectionTimeout(s.opts.ReadTimeout),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: 120 * time.Second}),
		grpc.InTapHandle(s.recoverTap),
		grpc.ChainUnaryInterceptor(s.recoverUnary, s.admit),
		grpc.StreamInterceptor(s.recoverStream),
		// Fixed flow-control windows turn off grpc-go's bandwidth-delay
		// probing, a ping per burst of data that a request/response
		// protocol on a fast network pays for in latency. A stream's
		// window is what gRPC-Go takes in of a call before its handler
		// asks for the message, outside --max-body-memory (room.go):
		// 64 KiB, an HTTP body's first window. Once the handler asks,
		// gRPC-Go reads the message's length and opens the window to the
		// whole message at once, so a large input waits one window
		// update, not one per 64 KiB. The connection's window gRPC-Go
		// gives back as bytes arrive, read or not: it bounds nothing
		// held, and 16 MiB keeps many streams' inputs moving.
		grpc.InitialWindowSize(streamWindow),
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
	g.RegisterService(s.service(), s)
	return g
}

// envelope is how far past the message limit a request is still read, to
// be refused by ModelInfer with a message that names the limit and its
// flag: room for the names, shapes and parameters around inputs that
// come near the limit themselves.
const envelope = 64 << 10

// required is the scope a method outside openMethods needs and the
// function it acts on, as the HTTP routes: model metadata and readiness
// need read; inference needs invoke on the model.
func required(req any) (scope auth.Scope, fn string) {
	if r, ok := req.(*pb.ModelInferRequest); ok {
		return auth.Invoke, r.GetModelName()
	}
	return auth.Read, ""
}

// maxHeaderList bounds a call's header list (gRPC-Go's default: 16 MiB).
const maxHeaderList = 16 << 10

// openMethods need no token, as /v2 and /v2/health/* over HTTP: health
// and server metadata. Their messages are empty, but gRPC-Go reads one of
// up to the message limit before any handler, so on a server with tokens
// a client calling them holds at most anonPerClient at once, each ended
// if its message has not come within anonReadTimeout (anonCalls).
var openMethods = map[string]bool{
	pb.GRPCInferenceService_ServerLive_FullMethodName:     true,
	pb.GRPCInferenceService_ServerReady_FullMethodName:    true,
	pb.GRPCInferenceService_ServerMetadata_FullMethodName: true,
}

// pending is what the tap starts for a call and its end releases: the
// timer that ends it if its message does not come within the read
// timeout, and its place in its token's concurrency, unless its handler
// took that over (handOver).
type pending struct {
	timer  *time.Timer
	place  *place
	anon   *anonCalls // an open method's call on a server with tokens: its client's place to give back
	client string
	wait   time.Duration // how long its message may take
	// stop keeps release from running when the stream's context ends;
	// true if it did stop it (release is then the caller's to run),
	// false if the context had ended and release has run or is running.
	stop func() bool
}

func (c *pending) release() {
	c.timer.Stop()
	c.place.giveBack()
	if c.anon != nil {
		c.anon.done(c.client)
	}
}

// Bounds on the open methods' calls of one client (netguard.ClientKey)
// on a server with tokens: what a client without one can make the server
// read and hold is anonPerClient messages of up to the message limit,
// for anonReadTimeout at most before they come.
const (
	anonPerClient   = 4
	anonReadTimeout = time.Second
)

// anonCalls counts the open methods' calls in flight per client.
type anonCalls struct {
	mu sync.Mutex
	n  map[string]int
}

func (a *anonCalls) take(client string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.n[client] >= anonPerClient {
		return false
	}
	if a.n == nil {
		a.n = map[string]int{}
	}
	a.n[client]++
	return true
}

func (a *anonCalls) done(client string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.n[client]--; a.n[client] <= 0 {
		delete(a.n, client)
	}
}

type pendingKey struct{}

// errNoMessage is the cause of a call ended for want of its message.
var errNoMessage = errors.New("no request message within the read timeout")

// tap runs on a call's headers, before its message is read. It refuses a
// call without a known token (admit then checks its scope and model once
// the message has come), charges its token's rate and takes its place in
// the token's concurrency (a message that does not decode reaches no
// interceptor: it is charged all the same), and
// ends the call (its stream's context is cancelled, and the client reads
// CANCELLED) if its message has not come within the read timeout: gRPC-Go
// waits for a message without limit, so a client could hold streams, and
// the goroutines serving them, for ever. Both are released once, when the
// handler returns (admit; a ModelInfer call's place goes on with its
// answer: handOver) or, for a call that never reaches it, when its stream
// ends however it ends.
func (s *Server) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	c := &pending{}
	wait := s.opts.ReadTimeout
	g := s.door.Gate()
	var authz []byte
	if v := info.Header.Get("authorization"); len(v) > 0 && !g.Open() {
		authz = []byte(v[0])
	}
	switch {
	case g.Open():
	case openMethods[info.FullMethodName]:
		// The open methods look at no token, as HTTP's open routes do: a
		// stale or malformed one is no auth failure (a load balancer's
		// probe configured with a revoked token counted one a probe), and
		// nothing in the answer, the strangers' bound included, tells
		// whether a token is known (a known one was exempt from it, which
		// let a stolen token be tried without a trace).
		var addr net.Addr
		if p, ok := peer.FromContext(ctx); ok {
			addr = p.Addr
		}
		c.client = netguard.ClientKey(addr)
		if !s.anon.take(c.client) {
			return ctx, status.Errorf(codes.ResourceExhausted, "%s: at most %d calls of the methods open without a token at once from one client", info.FullMethodName, anonPerClient)
		}
		c.anon, wait = &s.anon, min(wait, anonReadTimeout)
	default:
		tk, r := g.Hold(authz)
		if r != nil {
			if r.Status.HTTP != 429 {
				s.logRefusal(ctx, info.FullMethodName, r)
			}
			return ctx, status.Error(r.Status.GRPC, r.Msg)
		}
		c.place = &place{tk: tk}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	c.wait = wait
	c.timer = time.AfterFunc(wait, func() { cancel(errNoMessage) })
	c.stop = context.AfterFunc(ctx, c.release)
	return context.WithValue(ctx, pendingKey{}, c), nil
}

// admit is the gate for every method, once its message has come: the
// token in the authorization metadata ("Bearer TOKEN"), as HTTP's
// Authorization header, for the method's scope and model (its rate and
// its place in the token's concurrency were taken by the tap, from the
// headers: a message that does not decode reaches no interceptor). It gives the call's place
// back as the handler returns, before its status is written: a client
// calling one at a time must find it free for its next call. ModelInfer's
// handler takes the place over (handOver) for its answer to hold: a large
// one until gRPC-Go has written it, which is still before the status, or
// freed or dropped it, or its connection closes (marshalCall).
func (s *Server) admit(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	ctx = s.takeRefusal(ctx, req) // first: every decoded request comes here
	// Answers go uncompressed whatever the call's grpc-encoding (the
	// server takes no compressed message, but a call may say gzip and send
	// one uncompressed): gRPC-Go answers in the call's encoding, and a
	// gzip answer cost the server CPU uncounted in its I/O time and was
	// compressed into buffers of gRPC-Go's own, the held ones freed as it
	// queued them, which gave a large answer's place back before a byte
	// was written. Identity is always accepted.
	_ = grpc.SetSendCompressor(ctx, encoding.Identity)
	if c, ok := ctx.Value(pendingKey{}).(*pending); ok {
		// From here the place is the handler's until it returns, as an
		// HTTP request's is: a client that cancels must not free it while
		// the server still runs its call. The stream's end is asked first:
		// its release stops the timer too, and a timer stopped reads as
		// one that fired.
		ended := !c.stop()
		if !ended {
			defer c.release()
		}
		switch {
		case ended && !errors.Is(context.Cause(ctx), errNoMessage):
			// The stream ended first (the client cancelled, or its own
			// deadline passed), and its end gave the place back: no
			// handler runs without one.
			return nil, status.FromContextError(ctx.Err()).Err()
		case ended || !c.timer.Stop(): // the read timeout passed, or did as the message came
			return nil, status.Errorf(codes.DeadlineExceeded, "the request message did not arrive within %v of its headers (the server's read timeout; 1 s for the methods open without a token)", c.wait)
		}
	}
	g := s.door.Gate()
	if g.Open() || openMethods[info.FullMethod] {
		return h(ctx, req)
	}
	scope, fn := required(req)
	authz := authorization(ctx)
	admit := g.AdmitHeld
	if scope == auth.Invoke && fn == "" {
		// An inference naming no model (or one the codec refused, its
		// name too long to be any function's) runs nothing: its handler
		// answers InvalidArgument naming the field. The token and its
		// invoke scope still apply (its rate was charged by the tap); its
		// globs, which would read the empty name as a store-wide
		// operation (403), do not.
		admit = func(authz []byte, scope auth.Scope, _ string) *gate.Refusal { return g.AdmitHeldUnnamed(authz, scope) }
	}
	if r := admit(authz, scope, fn); r != nil {
		if r.Status.HTTP != 429 {
			s.logRefusal(ctx, info.FullMethod, r)
		}
		return nil, status.Error(r.Status.GRPC, r.Msg)
	}
	return h(ctx, req)
}

// handOver takes the place in its token's concurrency of the call whose
// handler admit runs (ctx's), for the handler to give back or pass on:
// admit then gives back none. Nil where the call holds none (a server
// without tokens, an open method's call). Only a handler admit runs may
// call it: admit's release, which reads the same pending, runs on its
// return, and the stream's end no longer does.
func handOver(ctx context.Context) *place {
	c, ok := ctx.Value(pendingKey{}).(*pending)
	if !ok {
		return nil
	}
	p := c.place
	c.place = nil
	return p
}

// authorization is the call's authorization metadata ("Bearer TOKEN"), as
// HTTP's Authorization header; nil without one.
func authorization(ctx context.Context) []byte {
	if v := metadata.ValueFromIncomingContext(ctx, "authorization"); len(v) > 0 {
		return []byte(v[0])
	}
	return nil
}

// logRefusal logs an authentication failure, once a second per client at
// most (netguard.LogThrottle), without waiting for the log (refusalLog).
func (s *Server) logRefusal(ctx context.Context, method string, r *gate.Refusal) {
	var addr net.Addr
	client := "?"
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		addr = p.Addr
		if host, _, err := net.SplitHostPort(p.Addr.String()); err == nil {
			client = host
		}
	}
	ok, unlogged := s.authLog.Allow(addr)
	if !ok {
		return
	}
	s.authLines.add([]any{"reason", r.Reason, "client", client, "method", errdefs.KeptName(method), "transport", "grpc"}, unlogged)
}

// ServerLive answers while the process serves.
func (s *Server) ServerLive(context.Context, *pb.ServerLiveRequest) (*pb.ServerLiveResponse, error) {
	return &pb.ServerLiveResponse{Live: true}, nil
}

// ServerReady is /v2/health/ready: the devices healthy and the server not
// draining.
func (s *Server) ServerReady(context.Context, *pb.ServerReadyRequest) (*pb.ServerReadyResponse, error) {
	ok, _ := s.door.Health()
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
// any), a request to it may run now (pipeline.Pin.Unready: not a function
// whose load failed for good, nor one backing off), and the devices are
// healthy.
func (s *Server) ModelReady(ctx context.Context, req *pb.ModelReadyRequest) (*pb.ModelReadyResponse, error) {
	if err := refusal(ctx); err != nil {
		return nil, s.statusOf(ctx, err, "ModelReady")
	}
	pin, _, err := s.pinSeen(ctx, req.GetName(), req.GetVersion())
	var pe *pipeline.PlanError
	if errors.As(err, &pe) {
		// A pipeline whose steps do not resolve (a step's function
		// deleted): it exists, but its requests fail before they run.
		return &pb.ModelReadyResponse{Ready: false}, nil
	}
	if err != nil {
		return nil, s.statusOf(ctx, err, "ModelReady")
	}
	unready := pin.Unready(time.Now())
	pin.Release()
	ok, _ := s.door.Health()
	return &pb.ModelReadyResponse{Ready: ok && unready == nil}, nil
}

// ModelMetadata is a model's current version and tensors.
func (s *Server) ModelMetadata(ctx context.Context, req *pb.ModelMetadataRequest) (*pb.ModelMetadataResponse, error) {
	if err := refusal(ctx); err != nil {
		return nil, s.statusOf(ctx, err, "ModelMetadata")
	}
	pin, ts, err := s.pinSeen(ctx, req.GetName(), req.GetVersion())
	if err != nil {
		return nil, s.statusOf(ctx, oip.MetadataError(req.GetName(), err, s.door.Gate().View(authorization(ctx)).Sees), "ModelMetadata")
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

// pinSeen is pin for a model's metadata or readiness: one the caller may
// not learn of reads as no model (gate.View.Hide, as over HTTP). Not cut
// by the call's end: a client past its deadline resets the stream a
// little before it, which must read as the deadline's 504.
func (s *Server) pinSeen(ctx context.Context, name, version string) (pipeline.Pin, *abi.Tensors, error) {
	if err := s.door.Gate().View(authorization(ctx)).Hide(name); err != nil {
		return pipeline.Pin{}, nil, err
	}
	return s.pin(context.WithoutCancel(ctx), name, version, s.deadline(ctx))
}

// pin resolves name's current version for the request (oip.Pin, as the
// HTTP route does).
// A store read it needs ends at deadline (the call's: Door.Deadline).
func (s *Server) pin(ctx context.Context, name, version string, deadline time.Time) (pipeline.Pin, *abi.Tensors, error) {
	if name == "" {
		return pipeline.Pin{}, nil, badRequest("model name: empty")
	}
	return oip.Pin(ctx, s.door, name, version, deadline)
}

// pinLanded pins the model a call names, as pin does, in a slot lent for
// it where io may be lent one: its function's current version, for a call
// that names none (a pipeline, a batching function, a function not loaded
// here lends none), pinned as the version the slot was lent for, so that
// a deploy between the two costs the call nothing (Runner.PinLanding).
// The slot is io.land, for the caller to lay the inputs out in or give
// back.
func (s *Server) pinLanded(ctx context.Context, req *pb.ModelInferRequest, deadline time.Time, io *inferIO) (pipeline.Pin, *abi.Tensors, error) {
	name := req.GetModelName()
	if io.lend && name != "" && req.GetModelVersion() == "" {
		if l := s.door.Land(name); l != nil {
			if pin, ok := s.door.PinLanding(name, l); ok {
				io.land = &lent{Landing: l}
				return pin, oip.Tensors(pin), nil
			}
			l.Release()
		}
	}
	return s.pin(ctx, name, req.GetModelVersion(), deadline)
}

// run runs r on pin. A run that panics discards the slot land, which its
// worker may still write into (its release after is nothing).
func (s *Server) run(ctx context.Context, pin pipeline.Pin, r *call.Request, t0 time.Time, land *lent) error {
	ran := false
	defer func() {
		if !ran {
			land.discard()
		}
	}()
	err := pin.InvokeSince(ctx, r, t0)
	ran = true
	return err
}

// deadline is a call's deadline at the door: the client's, or the
// server's timeout from now.
func (s *Server) deadline(ctx context.Context) time.Time {
	return s.door.Deadline(time.Now(), deadlineOf(ctx))
}

// deadlineOf is ctx's deadline, or zero.
func deadlineOf(ctx context.Context) time.Time {
	d, _ := ctx.Deadline()
	return d
}

// ModelInfer runs one inference: inputs from raw_input_contents or typed
// contents, laid out in the model's declared order; the outputs answered
// the way the inputs came (raw for raw, typed for typed where the
// datatype has typed contents), each output named in outputs, or all.
func (s *Server) ModelInfer(ctx context.Context, req *pb.ModelInferRequest) (*pb.ModelInferResponse, error) {
	var io inferIO
	return s.modelInfer(ctx, req, &io)
}

// modelInfer is ModelInfer of a call whose message's decoding took
// io.decode; it sets io.fl to the flow its answer's encoding is charged to
// (io.go).
func (s *Server) modelInfer(ctx context.Context, req *pb.ModelInferRequest, io *inferIO) (*pb.ModelInferResponse, error) {
	o := frontdoor.Outcome{Transport: "grpc", Route: "inference.GRPCInferenceService/ModelInfer", Function: call.NameOf(req.GetModelName()), Req: &call.Request{}}
	// The client's deadline is the request's (queue time plus the run);
	// none, the server's.
	s.door.Begin(o.Req, time.Now(), deadlineOf(ctx))
	if s.door.Traced() {
		md, _ := metadata.FromIncomingContext(ctx)
		o.Carrier = mdCarrier(md)
	}
	resp, err := s.infer(ctx, req, o.Req, io)
	o.Err = err
	if err != nil {
		o.Authorization = authorization(ctx)
	}
	st, msg := s.door.End(&o)
	if err != nil {
		if hid, ok := pipeline.Hidden(err, s.stepsSeen(ctx, o.Req, err)); ok {
			msg = hid // logged whole above, told less
		}
		return nil, grpcStatus(st, msg, err)
	}
	// What HTTP says in Server-Timing, X-Plover-Start and X-Plover-Version.
	r := o.Req
	grpc.SetHeader(ctx, metadata.Pairs("server-timing", string(reqmetrics.AppendServerTiming(make([]byte, 0, reqmetrics.ServerTimingCap), r, s.stepsSeen(ctx, r, nil))),
		"x-plover-start", r.Start.String(), "x-plover-version", r.Version))
	return resp, nil
}

// stepsSeen is which of a pipeline call's steps its caller may learn of
// (reqmetrics.StepShown, pipeline.Hidden); nil for a function's call (no
// steps, and err, if any, names none): nothing to ask.
func (s *Server) stepsSeen(ctx context.Context, r *call.Request, err error) func(string) bool {
	if len(r.Steps) == 0 && !pipeline.AtStep(err) {
		return nil
	}
	return s.door.Gate().Sees(authorization(ctx))
}

func (s *Server) infer(ctx context.Context, req *pb.ModelInferRequest, r *call.Request, io *inferIO) (*pb.ModelInferResponse, error) {
	if err := refusal(ctx); err != nil {
		return nil, err
	}
	// A message read past the limit (up to envelope): too_large, counted
	// as the function's refused request, as HTTP's 413 for a body over
	// --max-body. Sizing it is the server's time on its bytes too.
	w := ioshare.Now()
	n := io.size
	if n == 0 { // not from the codec: a caller's request
		n = proto.Size(req)
	}
	io.decode += w.Elapsed()
	if n > s.opts.MaxMessageBytes {
		return nil, &apierr.Error{Status: apierr.TooLarge, Msg: fmt.Sprintf(
			"model %s: request message of %d bytes is over the server's limit of %d bytes (plover serve --max-body)", errdefs.KeptName(req.GetModelName()), n, s.opts.MaxMessageBytes)}
	}
	if err := oip.CheckID(req.GetId()); err != nil {
		return nil, err
	}
	// Read, its message holds its size in the budget, not its ticket.
	if err := io.room.resize(ctx, int64(n)); err != nil {
		return nil, err
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
	looked := ioshare.Now() // the model's total counts its lookup, as HTTP's does
	pctx := ctx
	if req.GetModelVersion() != "" {
		// A pipeline's version other than its current one runs only for
		// a token that may invoke its steps (oip.PinVersion).
		pctx = s.door.Gate().InvokeCheck(ctx, authorization(ctx))
	}
	pin, ts, err := s.pinLanded(pctx, req, r.Deadline, io)
	if err != nil {
		return nil, err
	}
	defer pin.Release()
	found := ioshare.Now() // laying the tensors out is metered I/O, not the lookup
	// The model found (a pipeline's flow is its own, as over HTTP), the
	// call is its function's: touched, and charged its message's decoding
	// (io.go).
	io.fl = s.door.IO(req.GetModelName())
	io.fl.Touch(r.Began)
	io.fl.Metered(io.decode)
	// A large call puts its connection's bytes in its function's turns, a
	// small one to another function takes them out (conns.go): admitted,
	// its token may invoke the function.
	if p, ok := peer.FromContext(rpc); ok {
		s.conns.called(p.LocalAddr, p.Addr, io.fl, n >= bigMessage)
		io.peer = p
	}
	typed, pick, err := s.lay(req, pin, ts, r, io)
	laid := io.fl.MeteredSince(found)
	if err != nil {
		return nil, err
	}
	if err := s.runLaid(ctx, req, pin, ts, r, io, (laid - (found - looked)).Time()); err != nil {
		return nil, err
	}
	t := ioshare.Now() // and cutting the answer (the codec encodes it)
	resp, err := s.answer(req, r, ts.Outputs, pick, typed)
	io.fl.MeteredSince(t)
	return resp, err
}

// lay lays the call's inputs out for its run (layInputs): in io's slot
// where it was lent one and they fit (r.Landing then), else in memory,
// the slot given back; and picks the outputs to answer, those the request
// names, in its order, or all.
func (s *Server) lay(req *pb.ModelInferRequest, pin pipeline.Pin, ts *abi.Tensors, r *call.Request, io *inferIO) (typed bool, pick []int, err error) {
	maxIn, step := pin.InputBound() // a pipeline's: its first step's
	var into []byte
	if io.land != nil {
		into = io.land.Input()
	}
	typed, inSlot, err := layInputs(req, io.raw(req), ts.Inputs, maxIn, step, into, r)
	if inSlot {
		// The function's device reads the inputs where they were laid out
		// and writes its output beside them: the answer is cut from there.
		r.Landing = io.land.Landing // the engine's own: it knows its slot
	} else {
		io.land.release()
		io.land = nil
	}
	if err == nil {
		pick, err = oip.Requested(nil, req.GetOutputs(), (*pb.ModelInferRequest_InferRequestedOutputTensor).GetName, ts.Outputs)
	}
	return typed, pick, err
}

// runLaid runs the call whose inputs lay laid out, from t0. Laying them
// out in a slot is the one copy of the inputs, counted as a body read
// into memory first and copied into its slot is.
func (s *Server) runLaid(ctx context.Context, req *pb.ModelInferRequest, pin pipeline.Pin, ts *abi.Tensors, r *call.Request, io *inferIO, t0 time.Time) error {
	var laidOut int64
	if r.Landing != nil {
		laidOut = int64(len(r.Input))
	}
	err := s.run(ctx, pin, r, t0, io.land)
	if r.Landing != nil && errors.Is(err, call.ErrLandedElsewhere) {
		// The slot's worker was replaced (it crashed) while the call
		// waited, and the call did not run. Unlike an HTTP body read into
		// the slot, the inputs are still in the message: laid out again
		// in memory, the call runs on the new worker, as it would have
		// without a slot.
		io.land.release()
		io.land, r.Landing, r.Output = nil, nil, nil
		maxIn, step := pin.InputBound()
		if _, _, err = layInputs(req, io.raw(req), ts.Inputs, maxIn, step, nil, r); err == nil {
			err = s.run(ctx, pin, r, t0, nil)
		}
	}
	r.Copied += laidOut // the run counts its own from 0
	return err
}

// answer is the response to req, whose function ran: its outputs cut from
// r.Output, typed when the inputs were and the typed answer fits the
// message limit and maxTypedAnswer (else raw: outputs decides before
// building it, as typed contents can be ten times the raw bytes, a
// negative int32 a 10-byte varint).
func (s *Server) answer(req *pb.ModelInferRequest, r *call.Request, decl []abi.Tensor, pick []int, typed bool) (*pb.ModelInferResponse, error) {
	resp, err := outputs(req, r, decl, pick, typed, min(s.opts.MaxMessageBytes, maxTypedAnswer))
	// Raw, a response is its output's bytes and a little framing: sized
	// only when those bytes come near the limit, which gRPC would
	// otherwise enforce with a message that names neither. (A typed one
	// fits: outputs sized it.)
	if err == nil && 2*len(r.Output) > s.opts.MaxMessageBytes {
		if n := proto.Size(resp); n > s.opts.MaxMessageBytes {
			return nil, &apierr.Error{Status: apierr.BadOutput, Msg: fmt.Sprintf(
				"model %s: its response of %d bytes is over the gRPC message limit of %d bytes (plover serve --max-body)", req.GetModelName(), n, s.opts.MaxMessageBytes)}
		}
	}
	return resp, err
}

// goneMargin is how near its deadline a reset stream counts as timed out
// rather than cancelled.
const goneMargin = 25 * time.Millisecond

func badRequest(format string, a ...any) error {
	return &apierr.Error{Status: apierr.BadRequest, Msg: fmt.Sprintf(format, a...)}
}

// statusOf is err as a gRPC status, classified and logged by the front
// door.
func (s *Server) statusOf(ctx context.Context, err error, method string) error {
	st, msg := s.door.Fail(err, "grpc", method, authorization(ctx))
	return grpcStatus(st, msg, err)
}

// grpcStatus is err's class and message as a gRPC status; a 429, and an
// error that says when the same request may succeed (a crash back-off:
// apierr.RetrySeconds), say when to retry, as HTTP's Retry-After does.
func grpcStatus(st apierr.Status, msg string, err error) error {
	if n := apierr.RetrySeconds(err, time.Now()); n > 0 {
		msg += fmt.Sprintf(" (retry in %d s)", n)
	} else if st.GRPC == codes.ResourceExhausted && st.HTTP == 429 {
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
