package httpapi

import (
	"bytes"
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
		defer func() {
			if v := recover(); v != nil {
				s.panicked(ctx, v)
			}
		}()
		h(ctx)
	}
}

// panicked records a request's recovered panic v and answers it.
func (s *Server) panicked(ctx *fasthttp.RequestCtx, v any) {
	path := ctx.Path()
	route := string(ctx.Method()) + " " + string(path)
	if invocation(path) {
		s.door.PanickedInvoke("http", route, functionOf(path), v)
	} else {
		s.door.Panicked("http", route, functionOf(path), v)
	}
	ctx.SetConnectionClose()
	st := apierr.Of(errdefs.KindInternal)
	writeError(ctx, st.HTTP, st.Name, frontdoor.PanicMessage)
}

// streamRecovered, deferred in what writes an answer after its handler
// returned (a followed log stream's writer, which fasthttp runs in a
// goroutine of its own, where a panic ended the process), recovers a
// panic there: the answer has begun, so its connection is closed, for the
// client to find it cut rather than ended.
func (s *Server) streamRecovered(route, function string, conn net.Conn) {
	if v := recover(); v != nil {
		s.cutAnswer(route, function, conn, v)
	}
}

// cut is streamRecovered's for a panic v recovered while ctx's answer was
// written by fasthttp (answerBody), ctx still its request's.
func (s *Server) cut(ctx *fasthttp.RequestCtx, conn net.Conn, v any) {
	s.cutAnswer(string(ctx.Method())+" "+string(ctx.Path()), functionOf(ctx.Path()), conn, v)
}

// cutAnswer records a panic v recovered once route's answer had begun and
// closes its connection. Not counted in plover_requests_total: the
// request was, as answered, before its answer was written.
func (s *Server) cutAnswer(route, function string, conn net.Conn, v any) {
	s.door.Panicked("http", route, function, v)
	conn.Close()
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
