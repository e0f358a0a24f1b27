// Package httpapi is Plover's HTTP front end (fasthttp). It parses requests,
// calls an Invoker (the request path) or an Admin (the control plane) and
// writes responses; it owns no functions itself.
package httpapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/apierr"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/gate"
	"github.com/plover-run/plover/netguard"
	"github.com/plover-run/plover/pipeline"
	"github.com/plover-run/plover/reqmetrics"
)

// Admin changes and describes what is deployed: the control plane
// (engine.Control).
type Admin interface {
	// DeployAs deploys name's bundle by tenant, the caller's token name
	// ("" without tokens), recorded with the version.
	DeployAs(ctx context.Context, name, tenant string, body io.Reader, force bool) (api.FunctionInfo, error)
	Function(ctx context.Context, name string) (api.FunctionInfo, error)
	Functions(ctx context.Context) ([]api.FunctionInfo, error)
	Delete(ctx context.Context, name string, force bool) error
	Versions(ctx context.Context, name string) (*api.Record, error)
	Rollback(ctx context.Context, name, version string) (api.FunctionInfo, error)
	GC(ctx context.Context, grace time.Duration) ([]string, error)
}

// Options configure a Server.
type Options struct {
	// MaxBodyBytes bounds any request body (inputs and bundles); larger
	// requests get 413 before the handler runs.
	MaxBodyBytes int
	// MaxConns is the most connections the listener lets through
	// (--max-conns; 0: fasthttp's own bound, 262,144). fasthttp's bound is
	// set past it: left at its default under a higher --max-conns (one
	// derived from a container's open-file limit of 2^20 is 786,432), it
	// was the port's real bound, its 503 naming no flag and counted
	// nowhere, and the per-client cap never came into play.
	MaxConns int
	Log      *slog.Logger
	Version  string
	// Registry is served at /metrics: the caller registers the door's
	// request metrics and other collectors (the engine's) on it. Nil: a
	// private registry.
	Registry *prometheus.Registry
	// BodyBudget, when set, bounds the request bytes held in memory at
	// once; a request that finds no room within 5 s gets 503.
	BodyBudget BodyBudget
	// CPUWeights, when set, says how worker processes' CPU weights are
	// applied ("cgroup v2", "cgroup v1", "nice", "off"), for /healthz,
	// and why they are off ("" while they are on).
	CPUWeights func() (mechanism, offReason string)
	// ReadTimeout bounds the time a client takes to send a request, its
	// headers and body (408 past it); 0: 60 s.
	ReadTimeout time.Duration
	// WriteTimeout bounds the time a response takes to be written once
	// its handler returned (the connection is closed past it); 0: 60 s.
	WriteTimeout time.Duration
	// Repository, when set, is the model repository the node serves
	// (plover serve --repository), behind /v2/repository/...; nil: those
	// routes answer 404.
	Repository Repository
	// NoConsole turns the web console at /ui/ off (plover serve
	// --console=false); the zero value serves it.
	NoConsole bool
	// Origins are further origins (scheme://host[:port], as ParseOrigin
	// reads them) whose pages' requests the server takes as its own (plover
	// serve --origin): a plain-HTTP proxy that rewrites Host leaves the
	// browser's Origin naming the proxy, and its browser sends no
	// Sec-Fetch-Site to say same-origin (only secure contexts do).
	Origins []string
	// RefuseQueued, when set, is called at the end of a Shutdown whose
	// context's deadline passed, before the connections close: it fails
	// the requests that have not started to run (engine.RefuseQueued)
	// and reports whether requests are in flight, whose answers (the
	// refused ones' 503s) are then written first, for up to a second.
	RefuseQueued func() bool
}

// Server serves the Plover HTTP API.
type Server struct {
	door     *frontdoor.Door
	gate     *gate.Gate
	adm      Admin
	opts     Options
	calls    sync.Pool // *exchange
	srv      *fasthttp.Server
	notReady atomic.Bool // going down (SetReady(false), Shutdown)
	starting atomic.Bool // not up yet (SetStarting)
	scrape   fasthttp.RequestHandler
	// The hooks fasthttp calls outside the handler, each under a
	// recovery (recover.go): fields, for a test to make them panic.
	header     func(*fasthttp.RequestHeader) fasthttp.RequestConfig
	badRequest func(*fasthttp.RequestCtx, error)
	connState  func(net.Conn, fasthttp.ConnState)
	// headerPanics marks the requests whose HeaderReceived panicked
	// (headerRecovered), for their handler's wrapper to answer.
	headerPanics headerSet

	authLog    netguard.LogThrottle
	metricsSrv atomic.Pointer[fasthttp.Server]
	// conns and metricsConns follow the two servers' connections for
	// Shutdown.
	conns, metricsConns connSet
	// loopback is the loopback address Serve listens on when the server
	// checks no tokens ("" otherwise): then only a request naming a
	// loopback host is answered (misdirected).
	loopback atomic.Pointer[string]
	// origins are Options.Origins, normalized (ParseOrigin).
	origins [][]byte
	// waits are the bodies waiting for room in the body budget.
	waits bodyWaits
}

// SetReady sets what /readyz answers; a server going down sets it false
// before it stops accepting, so load balancers drain it first.
func (s *Server) SetReady(ready bool) { s.notReady.Store(!ready) }

// SetStarting says whether the server's node is still starting (a model
// repository being deployed): not ready, as SetReady(false) says, but not
// going down: followed log streams go on, and SetReady(false) wins.
func (s *Server) SetStarting(starting bool) { s.starting.Store(starting) }

// Ready is what /readyz answers: false while the node starts and once the
// server is going down (gRPC's ServerReady answers the same).
func (s *Server) Ready() bool { return !s.notReady.Load() && !s.starting.Load() }

// exchange is the per-request scratch state, pooled so a hot invoke allocates
// nothing.
type exchange struct {
	req    call.Request
	in     []byte // the input buffer, reused
	timing []byte
	conn   net.Conn // the client's, for gone
	lend   slotLend // a raw invoke's slot (invokeRaw): kept here, not allocated each request
}

// gone reports whether the client closed its connection, by peeking at the
// socket without consuming anything (a pipelined next request stays
// readable for fasthttp). The engine calls it only while the request is
// queued.
func (c *exchange) gone() bool { return connGone(c.conn) }

// New returns a Server over door, the front door it shares with the
// server's other transports (gRPC): one gate (tokens, scopes, limits), one
// set of request metrics, one tracer, one request path and one request
// timeout however clients connect; adm is the control plane. /metrics
// serves opts.Registry: the registry the door's metrics were made on, for
// its request series to be there.
func New(door *frontdoor.Door, adm Admin, opts Options) *Server {
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = 256 << 20
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.ReadTimeout <= 0 {
		opts.ReadTimeout = 60 * time.Second
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = 60 * time.Second
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	s := &Server{door: door, gate: door.Gate(), adm: adm, opts: opts}
	for _, o := range opts.Origins {
		n, err := ParseOrigin(o)
		if err != nil {
			// plover serve checks its flag; a caller that passed a
			// malformed one has it match nothing, and hears of it.
			opts.Log.Warn("an origin that is no origin is not taken as the server's own", "origin", o, "error", err)
			continue
		}
		s.origins = append(s.origins, []byte(n))
	}
	s.scrape = fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(opts.Registry, promhttp.HandlerOpts{}))
	s.calls.New = func() any {
		c := &exchange{timing: make([]byte, 0, reqmetrics.ServerTimingCap)}
		c.req.Gone = c.gone // bound once: no allocation per request
		return c
	}
	s.conns.readTimeout, s.conns.panicked, s.metricsConns.panicked = opts.ReadTimeout, s.connPanicked, s.connPanicked
	s.conns.maxBody = opts.MaxBodyBytes
	s.header, s.badRequest, s.connState = s.conns.headerReceived, s.parseError, s.conns.state
	s.srv = &fasthttp.Server{
		Handler:            s.recovered(s.conns.handle(s.Handle)),
		ConnState:          s.stateRecovered,
		Name:               "plover/" + opts.Version,
		MaxRequestBodySize: opts.MaxBodyBytes,
		ReadBufferSize:     readBuffer,
		ReadTimeout:        opts.ReadTimeout,
		WriteTimeout:       opts.WriteTimeout,
		IdleTimeout:        120 * time.Second,
		ErrorHandler:       s.errorRecovered,
		HeaderReceived:     s.headerRecovered, // Expect: 100-continue (continue.go)
		// Bodies are read as they arrive, by the handlers: a client that
		// announces a large Content-Length and sends nothing holds nothing.
		StreamRequestBody: true,
		// fasthttp would parse a streamed multipart body whole before
		// any handler, whatever its length: past the body limit, the
		// budget, authentication and the I/O turns.
		DisablePreParseMultipartForm: true,
		Logger:                       fasthttpLogger{opts.Log},
		// fasthttp's parse errors would quote the request's raw bytes,
		// a bearer token among them, into the 400 and the log.
		SecureErrorLogMessage: true,
		CloseOnShutdown:       true,
		Concurrency:           concurrencyFor(opts.MaxConns),
	}
	return s
}

// ServeMetrics serves only GET /metrics, without authentication, on ln (plover
// serve --metrics-listen): for a scraper on a private network.
func (s *Server) ServeMetrics(ln net.Listener) error {
	listen := loopbackListener(ln)
	const readTimeout = 10 * time.Second
	s.metricsConns.readTimeout = readTimeout
	srv := &fasthttp.Server{
		ConnState: func(c net.Conn, st fasthttp.ConnState) {
			defer s.connRecovered(c)
			s.metricsConns.state(c, st)
		},
		Handler: s.recovered(s.metricsConns.handle(func(ctx *fasthttp.RequestCtx) {
			if misdirected(ctx, listen) {
				return
			}
			if string(ctx.Path()) != "/metrics" {
				writeError(ctx, fasthttp.StatusNotFound, "not_found", "this address serves only GET /metrics")
				return
			}
			if s.method(ctx, fasthttp.MethodGet) {
				s.scrape(ctx)
			}
		})),
		Name: "plover/" + s.opts.Version, ReadTimeout: readTimeout, WriteTimeout: 10 * time.Second,
		IdleTimeout: time.Minute, Logger: fasthttpLogger{s.opts.Log}, MaxRequestBodySize: 1 << 10,
		CloseOnShutdown: true, SecureErrorLogMessage: true, ErrorHandler: metricsError,
	}
	s.metricsSrv.Store(srv)
	return srv.Serve(s.metricsConns.listener(ln))
}

// Serve accepts connections on ln until Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	if a := loopbackListener(ln); a != "" && s.gate.Open() {
		s.loopback.Store(&a)
	}
	return s.srv.Serve(s.conns.listener(ln))
}

// loopbackListener is ln's address when it is a loopback one, else "".
func loopbackListener(ln net.Listener) string {
	if a, ok := ln.Addr().(*net.TCPAddr); ok && a.IP.IsLoopback() {
		return a.String()
	}
	return ""
}

// misdirected refuses, with 421, a request to a server listening on
// loopback (listen; "" checks nothing) whose Host is not a loopback name
// or address, and reports whether it did. Such a server checks no tokens:
// anyone who reaches the port may do anything, and a web page the
// operator visits reaches it through the browser by DNS rebinding (its
// own name made to resolve to 127.0.0.1), its requests then naming the
// page's host. A client on this machine names localhost or the address.
// An empty Host (HTTP/1.0) is no browser's.
func misdirected(ctx *fasthttp.RequestCtx, listen string) bool {
	host := ctx.Host()
	if listen == "" || len(host) == 0 || loopbackHost(host) {
		return false
	}
	ctx.SetConnectionClose()
	writeError(ctx, fasthttp.StatusMisdirectedRequest, "misdirected_request", "Host "+strconv.Quote(string(host))+
		" is not this server's loopback name; a server without tokens answers only localhost, 127.0.0.1, [::1] or its listen address "+
		listen+" (with any port): give it --auth-file to serve other names")
	return true
}

var (
	hdrSecFetchSite = []byte("Sec-Fetch-Site")
	hdrOrigin       = []byte("Origin")
)

// Shutdown stops accepting, on the API and the metrics address together,
// ends the connections that hold no request (a request not yet whole is
// answered 503) and waits for the requests in handlers to finish. When ctx
// ends first it closes every connection left, and returns ctx's error
// only if requests are still in handlers: a client that does not read
// its answer, or sends its headers a byte at a time, holds no request.
// When ctx's deadline passed, Options.RefuseQueued is called before the
// close.
func (s *Server) Shutdown(ctx context.Context) error {
	// Not ready from here on, which also ends followed log streams (they
	// would hold the shutdown until ctx ends otherwise).
	s.notReady.Store(true)
	var metrics sync.WaitGroup
	if m := s.metricsSrv.Load(); m != nil {
		metrics.Add(1)
		go func() {
			defer metrics.Done()
			s.metricsConns.shutdown(ctx, m, nil)
		}()
	}
	err := s.conns.shutdown(ctx, s.srv, s.opts.RefuseQueued)
	metrics.Wait()
	return err
}

type fasthttpLogger struct{ l *slog.Logger }

func (f fasthttpLogger) Printf(format string, args ...any) {
	f.l.Debug("fasthttp: " + fmt.Sprintf(format, args...))
}

func (s *Server) parseError(ctx *fasthttp.RequestCtx, err error) {
	var small *fasthttp.ErrSmallBuffer
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		writeError(ctx, fasthttp.StatusRequestEntityTooLarge, "too_large", "request body is over the server's limit of "+strconv.Itoa(s.opts.MaxBodyBytes)+" bytes (plover serve --max-body)")
	case errors.As(err, &small):
		st := apierr.HeaderTooLarge
		writeError(ctx, st.HTTP, st.Name, "the request line and headers are over the server's limit of "+strconv.Itoa(s.srv.ReadBufferSize)+" bytes")
	case timedOut(err) && s.notReady.Load():
		// Shutdown cut a request that had not come whole.
		ctx.SetConnectionClose()
		writeError(ctx, fasthttp.StatusServiceUnavailable, apierr.Unavailable.Name, "the server is shutting down; retry on another")
	case timedOut(err):
		st := apierr.RequestTimeout
		writeError(ctx, st.HTTP, st.Name, "the request did not arrive within the server's read timeout of "+s.readTimeout().String())
	default:
		writeError(ctx, fasthttp.StatusBadRequest, "bad_request", "malformed HTTP request: "+err.Error())
	}
}

func (s *Server) readTimeout() time.Duration { return s.srv.ReadTimeout }

// readBuffer bounds a request's line and headers (431 past it): fasthttp's
// default, named so that the 431 can say it.
const readBuffer = 4096

var (
	pathFunctions = []byte("/v1/functions")
	suffixInvoke  = []byte("/invoke")
)

// Handle routes one request. Exported for in-process benchmarks.
func (s *Server) Handle(ctx *fasthttp.RequestCtx) {
	defer closeIfUnread(ctx)
	// Answers carry tenants' bytes (a function's output, its log lines,
	// its plover_fail messages) on the console's origin, where its token
	// is kept: none may be read as a page or a script, whatever type it
	// has or a browser guesses. Set on return (writeJSON resets the
	// response), on every answer but the console's pages, which run its
	// scripts under a policy of their own.
	page := false
	defer func() {
		if !page {
			setAPIHeaders(&ctx.Response.Header)
		}
	}()
	if smuggling(ctx) {
		ctx.SetConnectionClose()
		writeError(ctx, fasthttp.StatusBadRequest, "bad_request", "the request has both Content-Length and Transfer-Encoding (RFC 9112 section 6.3): send one")
		return
	}
	if ce := encodedBody(ctx); ce != nil {
		writeError(ctx, fasthttp.StatusUnsupportedMediaType, "unsupported_media_type",
			"Content-Encoding "+strconv.Quote(string(ce))+": request bodies are read as sent; send the body uncompressed, without Content-Encoding")
		return
	}
	if l := s.loopback.Load(); l != nil && misdirected(ctx, *l) {
		return
	}
	if h := s.crossSite(ctx); h != "" {
		s.refuse(ctx, &gate.Refusal{Status: apierr.Forbidden, Reason: "cross_site",
			Msg: string(ctx.Method()) + " from another site's page (" + h + "): the server takes requests that change anything only from its own pages (the console) and from clients that send no Origin"})
		return
	}
	if page = s.serveConsole(ctx); page {
		return
	}
	if ctx.IsGet() || ctx.IsHead() {
		// What a read answers is its token's (the console fetches it with
		// the user's): not for the browser's disk cache, where it would
		// outlive the sign-out. Set on return: writeJSON resets the
		// response. (POST answers are not stored without being told to.)
		defer ctx.Response.Header.Set("Cache-Control", "no-store")
	}
	var tk gate.Ticket
	if !s.gate.Open() {
		var ok bool
		if tk, ok = s.authorize(ctx); !ok {
			return
		}
		// Read when the handler returns: a followed log stream takes the
		// place on (Ticket.Pass) and gives it back when it ends; an answer
		// written after the return holds it until written (holdTicket).
		defer func() { holdTicket(ctx, tk) }()
	}
	path := ctx.Path()
	switch {
	case string(path) == "/healthz":
		if s.method(ctx, fasthttp.MethodGet) {
			s.health(ctx)
		}
	case string(path) == "/metrics":
		if s.method(ctx, fasthttp.MethodGet) {
			s.metrics(ctx)
		}
	case string(path) == "/readyz":
		if s.method(ctx, fasthttp.MethodGet) {
			if !s.Ready() {
				writeJSON(ctx, fasthttp.StatusServiceUnavailable, map[string]bool{"ready": false})
			} else {
				writeJSON(ctx, fasthttp.StatusOK, map[string]bool{"ready": true})
			}
		}
	case bytes.Equal(path, pathFunctions), string(path) == "/v1/functions/":
		if s.method(ctx, fasthttp.MethodGet) {
			s.list(ctx)
		}
	case bytes.HasPrefix(path, pathFunctions) && path[len(pathFunctions)] == '/':
		rest := path[len(pathFunctions)+1:]
		if name, ok := bytes.CutSuffix(rest, suffixInvoke); ok && bytes.IndexByte(name, '/') < 0 {
			if s.method(ctx, fasthttp.MethodPost) {
				s.invoke(ctx, name)
			}
			return
		}
		if name, sub, ok := bytes.Cut(rest, []byte{'/'}); ok {
			s.functionSub(ctx, string(name), string(sub), &tk)
			return
		}
		s.function(ctx, string(rest))
	case isV2(path):
		s.v2(ctx)
	case string(path) == "/v1/gc":
		if s.method(ctx, fasthttp.MethodPost) {
			s.gc(ctx)
		}
	default:
		writeError(ctx, fasthttp.StatusNotFound, "not_found", "no route for "+string(path)+" (see GET /v1/functions, POST /v1/functions/{name}/invoke)")
	}
}

// metrics serves a scrape. A body it carries is left unread and dropped:
// the adaptor behind s.scrape reads a request's whole body into memory
// (PostBody) before it calls the handler, outside the body budget and,
// chunked, without --max-body's bound (a 256 MiB chunked body under a 1 MiB
// --max-body was read whole: 1 GiB allocated, 256 MiB of heap held), and a
// scrape has no use for one.
func (s *Server) metrics(ctx *fasthttp.RequestCtx) {
	if leaveBody(ctx) {
		ctx.Request.ResetBody() // the stream detached, nothing of it read
	}
	if v := s.view(ctx); !v.All() {
		s.scrapeSeen(ctx, v)
		return
	}
	s.scrape(ctx)
}

func (s *Server) method(ctx *fasthttp.RequestCtx, want string) bool {
	if string(ctx.Method()) == want {
		return true
	}
	writeError(ctx, fasthttp.StatusMethodNotAllowed, "method_not_allowed", string(ctx.Method())+" is not allowed here; use "+want)
	ctx.Response.Header.Set("Allow", want) // after: writeError resets the response
	return false
}

// invoke is the hot path: no allocation for an octet-stream request on an
// idle instance (see BenchmarkServedInvoke).
func (s *Server) invoke(ctx *fasthttp.RequestCtx, nameBytes []byte) {
	// The request's bytes back the name for the call: what keeps it keeps
	// a copy (call.Name.Keep).
	name := call.BorrowName(nameBytes)
	c := s.calls.Get().(*exchange)
	c.conn = ctx.Conn()
	// Nothing of the exchange's last request: one refused before the
	// engine sets them (a name no function has, a bad header) is counted
	// and traced from these fields, and a stale version, start, device,
	// copy count or pipeline steps went into its span and metrics. The
	// buffers keep their capacity.
	c.req = call.Request{Gone: c.req.Gone, Output: c.req.Output[:0], Steps: c.req.Steps[:0]}
	err := s.begin(ctx, &c.req)
	if err == nil {
		switch ct := mediaType(ctx.Request.Header.ContentType()); ct {
		case "application/octet-stream", "":
			err = s.invokeRaw(ctx, name, c)
		case "application/json":
			err = s.invokeJSON(ctx, name, c)
		default:
			err = &apierr.Error{Status: apierr.UnsupportedMedia,
				Msg: "Content-Type " + strconv.Quote(ct) + ": send application/octet-stream (raw input bytes) or application/json ({\"input\":\"<base64>\"})"}
		}
	}
	s.finish(ctx, name, c, err)
	// A JSON invoke's output is the engine's, made at its out_bytes (up
	// to 1 GiB), whether the run succeeded or failed: kept by the pooled
	// exchange, every exchange a burst of large outputs used would hold
	// one for as long as small requests keep the pool in use.
	c.req.Output = kept(c.req.Output)
	// Not deferred: an exchange whose request panicked is left to the
	// collector, its output perhaps a device slot's memory (recover.go).
	c.conn = nil
	s.calls.Put(c)
}

// invokeRaw runs a request whose body is its input, and on success writes
// the output as the response. The body is read straight into a slot the
// request path lends (Land: where the function's worker reads it) when it
// has one, and the response is then written from the slot where the run
// left the output: no copy of the payload in the server. The slot is
// released once the response is written (answerBody.Close), so it never
// serves another request while this one's answer is still being sent.
func (s *Server) invokeRaw(ctx *fasthttp.RequestCtx, name call.Name, c *exchange) error {
	limit, err := s.inputLimit(ctx, name, "", rawBody, c.req.Deadline)
	if err != nil {
		return err
	}
	fn := name.Borrow()
	copied := int64(0)
	// The slot is lent as the body arrives (slotLend), or after it for a
	// body read with the headers. Until the run has it, no worker does:
	// an error or a panic (recovered above: a 500) releases it. A panic
	// in the run leaves it to a worker that may still write into it:
	// discarded, never lent again, its memory going once its worker is
	// done with it.
	sl := &c.lend
	*sl = slotLend{s: s, fn: fn}
	ran, handed := false, false
	defer func() {
		land := sl.land
		*sl = slotLend{} // the pooled exchange keeps no slot
		switch {
		case handed || land == nil:
		case ran:
			land.Discard()
		default:
			land.Release()
		}
	}()
	tn := s.turnsOf(ctx, fn, &c.req)
	body, held, err := s.readBodyLent(ctx, limit, &c.in, tn, sl)
	if err != nil {
		return err
	}
	defer s.releaseBody(held)
	if !sl.asked {
		// A body read with the headers, a chunked one (read into memory:
		// lendFor), or none: a slot for its run and its answer, where the
		// body fits.
		sl.lendInto(nil, len(body))
	}
	land := sl.land
	switch {
	case land != nil && !sameStart(body, land.Input()) && len(body) <= len(land.Input()):
		// Read before a slot was lent (by fasthttp with the headers, up
		// to 8 KiB, or a chunked body, into memory): one copy, into
		// where the device reads it.
		body = land.Input()[:copy(land.Input(), body)]
		copied = int64(len(body))
	case land != nil && ctx.RequestBodyStream() != nil:
		// Streamed into the slot, but for the first bytes, which fasthttp
		// read with the headers and its stream copied from its buffer,
		// and what was read before the slot was lent, copied into it.
		copied = int64(min(len(body), sl.pre)) + sl.copied
	case land == nil:
		// A body that gave its slot back as it paused (giveBack): what
		// it copied into the slot and out of it. None lent: nothing.
		copied = sl.copied
	}
	c.req.Input, c.req.Landing = body, land
	buf := ctx.Response.SwapBody(nil)[:0]
	c.req.Output = buf
	// Not ctx: fasthttp closes its Done at the start of a graceful
	// shutdown, and queued requests are meant to drain then. The
	// request's own deadline bounds it.
	ran = true
	err = s.door.Invoke(context.Background(), fn, &c.req)
	handed = true // released or answered from below
	out := c.req.Output
	c.req.Copied += copied
	s.answerRaw(ctx, out, buf, land, tn, err == nil)
	c.req.Input, c.req.Output, c.req.Landing = nil, nil, nil
	if err == nil {
		ctx.Response.Header.SetContentTypeBytes(octetStream)
		s.writeMeta(ctx, c)
	}
	return err
}

// answerRaw makes out, a raw invoke's output, its response when the run
// succeeded (ok), and releases the request's slot, if any (land): at once,
// or once the answer is written from it where out is in it. buf is the
// response's own buffer, lent to the run for its output.
func (s *Server) answerRaw(ctx *fasthttp.RequestCtx, out, buf []byte, land call.Landing, tn turns, ok bool) {
	if land != nil && aliases(out, land.Output()) {
		// The output is in the slot: the response is written from there,
		// and the slot released after. The response keeps its own buffer
		// (an error written later must not land in the slot).
		ctx.Response.SwapBody(buf)
		if ok && len(out) > 0 {
			s.answer(ctx, out, land, tn)
		} else {
			land.Release()
		}
		return
	}
	// out is not in the slot: the slot goes back before the answer is
	// made, so that a panic while it is (recovered as a 500) leaves none
	// held (handed is set: invokeRaw's recovery releases nothing).
	if land != nil {
		land.Release()
	}
	switch {
	case cap(out) > keptBody:
		// Made for this run (the engine's, at its out_bytes): never the
		// response's buffer, which fasthttp keeps for the connection's
		// life (ReduceMemoryUsage is off) under an error written over it
		// or an answer of a few bytes. The response keeps its own, and
		// the answer is written from out.
		ctx.Response.SwapBody(kept(buf))
		if ok {
			s.answer(ctx, out, nil, tn)
		}
	default:
		ctx.Response.SwapBody(out)
		if ok {
			s.pieceAnswer(ctx, tn)
		}
	}
}

// aliases reports whether a's memory (to its capacity) is within b's.
func aliases(a, b []byte) bool {
	if cap(a) == 0 || cap(b) == 0 {
		return false
	}
	a0, b0 := uintptr(unsafe.Pointer(unsafe.SliceData(a))), uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return a0 >= b0 && a0 < b0+uintptr(cap(b))
}

// sameStart reports whether a and b start at the same byte.
func sameStart(a, b []byte) bool {
	return len(a) > 0 && len(b) > 0 && &a[0] == &b[0]
}

// preRead is what fasthttp reads of a streamed body before any handler
// runs (readBodyWithStreaming): a body that fits is in memory already.
const preRead = 8 << 10

// badField is a 400 naming the offending field or header.
func badField(field, reason string) error {
	return &apierr.Error{Status: apierr.BadRequest, Msg: field + ": " + reason}
}

// tooLarge is a 413 saying what was over which limit.
func tooLarge(msg string) error {
	return &apierr.Error{Status: apierr.TooLarge, Msg: msg}
}

// finish ends every invoke once, through the front door (classified,
// logged, counted, traced), and writes its error, if any.
func (s *Server) finish(ctx *fasthttp.RequestCtx, name call.Name, c *exchange, err error) {
	o := frontdoor.Outcome{Transport: "http", Route: routeInvoke, Function: name, Req: &c.req, Err: err}
	if isV2(ctx.Path()) {
		o.Route = routeInfer
	}
	if s.door.Traced() {
		o.Carrier = headerCarrier{&ctx.Request.Header}
	}
	if err != nil {
		o.Authorization = ctx.Request.Header.PeekBytes(hdrAuthorization)
	}
	if st, msg := s.door.End(&o); err != nil {
		if hid, ok := pipeline.Hidden(err, s.stepsSeen(ctx, c, err)); ok {
			msg = hid // logged whole above, told less
		}
		writeFailure(ctx, st, msg, err)
	}
}

// The invoke routes, as spans and log lines name them.
const (
	routeInvoke = "POST /v1/functions/{name}/invoke"
	routeInfer  = "POST /v2/models/{name}/infer"
)

// headerCarrier reads the trace context headers of a request.
type headerCarrier struct{ h *fasthttp.RequestHeader }

func (c headerCarrier) Get(key string) string { return string(c.h.Peek(key)) }
func (c headerCarrier) Set(string, string)    {}
func (c headerCarrier) Keys() []string        { return nil }

var (
	octetStream    = []byte("application/octet-stream")
	hdrServerTimng = []byte("Server-Timing")
	hdrStart       = []byte("X-Plover-Start")
	hdrVersion     = []byte("X-Plover-Version")
	startNames     = [...][]byte{[]byte(call.Hot.String()), []byte(call.Warm.String()), []byte(call.Cold.String())}
)

// writeMeta sets Server-Timing (milliseconds, as the header's dur expects)
// and the start kind and version headers.
func (s *Server) writeMeta(ctx *fasthttp.RequestCtx, c *exchange) {
	b := reqmetrics.AppendServerTiming(c.timing[:0], &c.req, s.stepsSeen(ctx, c, nil))
	c.timing = b
	h := &ctx.Response.Header
	h.SetCanonical(hdrServerTimng, b)
	h.SetCanonical(hdrStart, startNames[c.req.Start])
	h.SetCanonical(hdrVersion, s2b(c.req.Version))
}

// begin begins an invoke's request at the door, from when fasthttp began it
// and the deadline X-Plover-Timeout-Ms asks for (none, or one that cannot
// be read: the server's). Every invoke is begun, a bad header's too: its
// trace starts where the others' do.
func (s *Server) begin(ctx *fasthttp.RequestCtx, r *call.Request) error {
	dl, err := headerDeadline(ctx)
	s.door.Begin(r, started(ctx), dl)
	return err
}

// started is when fasthttp began ctx's request, or now for a ctx its
// server did not serve (Handle called in process), which has none.
func started(ctx *fasthttp.RequestCtx) time.Time {
	if t := ctx.Time(); !t.IsZero() {
		return t
	}
	return time.Now()
}

func s2b(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

func mediaType(ct []byte) string {
	if i := bytes.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	ct = bytes.TrimSpace(ct)
	// Common types come back as constants: no allocation on the hot path.
	switch {
	case len(ct) == 0:
		return ""
	case bytes.EqualFold(ct, octetStream):
		return "application/octet-stream"
	case bytes.EqualFold(ct, []byte("application/json")):
		return "application/json"
	}
	return string(bytes.ToLower(ct))
}

// concurrencyFor is fasthttp's bound on the connections it serves at
// once for a listener that lets max through: past it by a margin, since a
// connection the listener has let go of may still be counted by fasthttp
// for a moment; fasthttp's default (0) where max is 0.
func concurrencyFor(max int) int {
	switch {
	case max <= 0:
		return 0
	case max > math.MaxInt/2: // past it the sum wraps, to fasthttp's default
		return math.MaxInt / 2
	}
	return max + max/8 + 64
}
