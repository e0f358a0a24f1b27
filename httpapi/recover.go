package httpapi

import (
	"bytes"
	"errors"
	"net"

	"github.com/valyala/fasthttp"

	"github.com/plover-run/plover/apierr"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/frontdoor"
)

// recovered wraps h, a server's outermost handler, so that a panic in
// handling a request ends that request, not the process: fasthttp
// recovers none, and one bug met by one request ended the server for
// every tenant. The panic is logged and counted (frontdoor.Panicked) and
// the request answered 500 internal, in the route's error shape. Nothing
// of an answer is on the wire before the handler returns (a body stream it
// set is dropped with the response, writeJSON's Reset closing it), so the
// 500 can always be sent; the connection is closed after it, since what
// the handler read of a streamed body and left of the request's state are
// unknown.
func (s *Server) recovered(h fasthttp.RequestHandler) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		defer dropLargeResponse(ctx) // last: a panic's answer is small
		defer s.requestRecovered(ctx)
		if !s.answerMarked(ctx) {
			h(ctx)
		}
	}
}

// answerMarked answers ctx's request 500 if its HeaderReceived panicked
// (its panic is recorded: headerRecovered), and reports whether it did.
func (s *Server) answerMarked(ctx *fasthttp.RequestCtx) bool {
	if s.headerPanics.n.Load() > 0 {
		if _, ok := s.headerPanics.take(&ctx.Request.Header); ok {
			answerPanicked(ctx)
			return true
		}
	}
	return false
}

// requestRecovered, deferred, recovers a panic in serving ctx's request,
// records it and answers it.
func (s *Server) requestRecovered(ctx *fasthttp.RequestCtx) {
	if v := recover(); v != nil {
		s.record(ctx.Method(), ctx.Path(), v)
		answerPanicked(ctx)
	}
}

// record logs and counts a panic v recovered in serving a request for
// path.
func (s *Server) record(method, path []byte, v any) {
	route := string(method) + " " + string(path)
	if invocation(path) {
		s.door.PanickedInvoke("http", route, functionOf(path), v)
	} else {
		s.door.Panicked("http", route, functionOf(path), v)
	}
}

// answerPanicked answers a request whose serving panicked.
func answerPanicked(ctx *fasthttp.RequestCtx) {
	ctx.SetConnectionClose()
	st := apierr.Of(errdefs.KindInternal)
	writeError(ctx, st.HTTP, st.Name, frontdoor.PanicMessage)
}

// headerRecovered is the server's HeaderReceived: s.header
// (connSet.headerReceived) under a recovery, fasthttp calling it outside
// the handler, between a request's headers and its body, and recovering
// nothing. A panic there is recorded at once and its request answered 500
// by the handler's wrapper (recovered) without the handler: what the
// hook left of the request (its Expect taken, its Content-Length zeroed)
// is unknown. A request still expecting 100-continue loses it, and its
// body, as the hook would have it lose them: fasthttp would say 100
// Continue and wait for a body only to answer 500. Marked by header in
// headerPanics, the one thing the hook and the handler share; a mark whose
// handler fasthttp skipped (its body failed) is taken by errorRecovered,
// else with the header's next request, here, before it can answer that
// one.
func (s *Server) headerRecovered(h *fasthttp.RequestHeader) (rc fasthttp.RequestConfig) {
	if s.headerPanics.n.Load() > 0 {
		s.headerPanics.take(h)
	}
	defer func() {
		if v := recover(); v != nil {
			var u fasthttp.URI // the path as the handler's ctx.Path() would have it
			u.Parse(nil, h.RequestURI())
			s.record(h.Method(), u.Path(), v)
			if expects100(h.RawHeaders()) { // the hook may have taken Expect, not yet the length
				h.DelBytes(hdrExpect)
				h.SetContentLength(0)
			}
			s.headerPanics.put(h, 0)
			rc = fasthttp.RequestConfig{}
		}
	}()
	return s.header(h)
}

// expects100 reports whether raw, a request's headers as read, expect
// 100-continue.
func expects100(raw []byte) bool {
	for len(raw) > 0 {
		var line []byte
		line, raw, _ = bytes.Cut(raw, []byte{'\n'})
		name, value, ok := bytes.Cut(line, []byte{':'})
		if ok && bytes.EqualFold(bytes.TrimSpace(name), hdrExpect) && bytes.EqualFold(bytes.TrimSpace(value), expect100) {
			return true
		}
	}
	return false
}

// errorRecovered is the server's ErrorHandler: s.badRequest (parseError)
// under the handler's recovery. fasthttp calls it outside the handler,
// for a request it could not read, and recovers nothing; it closes the
// connection after the answer. A request whose body failed after its
// headers skips its handler: the mark headerRecovered left for it is
// taken here (else it stayed, its pooled context perhaps dropped, every
// later request taking the set's lock), and it is answered 500, as it
// was recorded, not 400; so is one whose connection's read panicked.
func (s *Server) errorRecovered(ctx *fasthttp.RequestCtx, err error) {
	defer s.requestRecovered(ctx)
	if s.answerMarked(ctx) || readPanicAnswered(ctx) {
		return
	}
	s.badRequest(ctx, err)
}

// readPanicAnswered answers ctx's request 500 if its connection's read
// panicked (recorded as recovered: drainConn.Read), and reports whether
// it did: the read's error is no client's fault.
func readPanicAnswered(ctx *fasthttp.RequestCtx) bool {
	if d := drainOf(ctx.Conn()); d != nil && d.readPanicked.Load() {
		answerPanicked(ctx)
		return true
	}
	return false
}

// metricsError is the --metrics-listen server's ErrorHandler: its
// connections are drainConns too, whose read's panic fasthttp's own
// handler answered 400 "Error when parsing request". Any other error is
// answered with fasthttp's own codes and texts (431, 408, 400), except that
// a timeout wrapped in a header read's error (headers begun, then nothing
// until the read timeout) is a 408, as the API's parseError says too,
// where fasthttp's own handler, matching types unwrapped, says 400.
func metricsError(ctx *fasthttp.RequestCtx, err error) {
	if readPanicAnswered(ctx) {
		return
	}
	var small *fasthttp.ErrSmallBuffer
	switch {
	case errors.As(err, &small):
		ctx.Error("Too big request header", fasthttp.StatusRequestHeaderFieldsTooLarge)
	case timedOut(err): // as parseError tells it
		ctx.Error("Request timeout", fasthttp.StatusRequestTimeout)
	default:
		ctx.Error("Error when parsing request", fasthttp.StatusBadRequest)
	}
}

// stateRecovered is the server's ConnState: s.connState (connSet.state)
// under connRecovered.
func (s *Server) stateRecovered(c net.Conn, st fasthttp.ConnState) {
	defer s.connRecovered(c)
	s.connState(c, st)
}

// connRecovered, deferred in a server's ConnState, which fasthttp calls
// recovering nothing (for a new connection, in its accept loop), recovers
// a panic there. No request is known to answer: c is closed, its state
// in the server's drain unknown.
func (s *Server) connRecovered(c net.Conn) {
	if v := recover(); v != nil {
		s.connPanicked(c, v)
	}
}

// connPanicked records a panic v recovered in serving connection c
// outside any request (c nil: none accepted yet), and closes c.
func (s *Server) connPanicked(c net.Conn, v any) { s.cutConn("", "", c, v) }

// streamRecovered, deferred in what writes an answer after its handler
// returned (a followed log stream's writer, which fasthttp runs in a
// goroutine of its own, where a panic ended the process), recovers a
// panic there: the answer has begun, so its connection is closed, for the
// client to find it cut rather than ended.
func (s *Server) streamRecovered(route, function string, conn net.Conn) {
	if v := recover(); v != nil {
		s.cutConn(route, function, conn, v)
	}
}

// cut is streamRecovered's for a panic v recovered while fasthttp wrote
// or closed ctx's answer (answerBody), closing conn (nil: none). Its route
// is unknown once fasthttp reset the request (it resets the request
// before the answer, closing an answer it did not write).
func (s *Server) cut(ctx *fasthttp.RequestCtx, conn net.Conn, v any) {
	route, function := "", ""
	if len(ctx.Request.Header.RawHeaders()) > 0 {
		route, function = string(ctx.Method())+" "+string(ctx.Path()), functionOf(ctx.Path())
	}
	s.cutConn(route, function, conn, v)
}

// cutConn records a panic v recovered once route's answer had begun (or
// outside any request: route "") and closes its connection (nil: none).
// Not counted in plover_requests_total: the request was, as answered,
// before its answer was written.
func (s *Server) cutConn(route, function string, conn net.Conn, v any) {
	s.door.Panicked("http", route, function, v)
	if conn != nil {
		conn.Close()
	}
}

var (
	pathFunctionsSlash = []byte("/v1/functions/")
	suffixInfer        = []byte("/infer")
)

// invocation reports whether path runs a function (/v1's invoke, /v2's
// infer), whose failures are counted per function.
func invocation(path []byte) bool {
	return bytes.HasPrefix(path, pathFunctionsSlash) && bytes.HasSuffix(path, suffixInvoke) ||
		bytes.HasPrefix(path, pathV2Models) && bytes.HasSuffix(path, suffixInfer)
}

// functionOf is the function (or model) a request's path names, a copy
// (the log keeps it past the request's buffers), or "".
func functionOf(path []byte) string {
	for _, prefix := range [...][]byte{pathFunctionsSlash, pathV2Models} {
		if rest, ok := bytes.CutPrefix(path, prefix); ok {
			name, _, _ := bytes.Cut(rest, []byte{'/'})
			return string(name)
		}
	}
	return ""
}
