package httpapi

import (
	"net"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// SetFollowTimes sets a followed log stream's write bound and keep-alive
// interval for a test; the returned func restores them.
func SetFollowTimes(write, keepAlive time.Duration) func() {
	w, k := followWrite, followKeepAlive
	followWrite, followKeepAlive = write, keepAlive
	return func() { followWrite, followKeepAlive = w, k }
}

// PanicOnScrape makes s's scrape (GET /metrics on the API's address and
// on the metrics one) panic with v for a request that carries the header
// X-Test-Panic, as a bug in a handler would; other scrapes are served.
// Call it before s serves.
func PanicOnScrape(s *Server, v any) {
	scrape := s.scrape
	s.scrape = func(ctx *fasthttp.RequestCtx) {
		if len(ctx.Request.Header.Peek("X-Test-Panic")) > 0 {
			panic(v)
		}
		scrape(ctx)
	}
}

// PanicIn makes one of the hooks fasthttp calls outside s's handler panic
// with v, as a bug there would: "header" (HeaderReceived) for a request
// that carries X-Test-Panic ("header, Expect taken": after it took the
// request's Expect), "parse error" (ErrorHandler) for any, "conn
// state" (ConnState) once, as a connection's first request begins. Call
// it before s serves.
func PanicIn(s *Server, hook string, v any) {
	switch header, connState := s.header, s.connState; hook {
	case "header", "header, Expect taken":
		s.header = func(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
			if len(h.Peek("X-Test-Panic")) > 0 {
				if hook != "header" {
					h.Del("Expect")
				}
				panic(v)
			}
			return header(h)
		}
	case "parse error":
		s.badRequest = func(*fasthttp.RequestCtx, error) { panic(v) }
	case "conn state":
		var once atomic.Bool
		s.connState = func(c net.Conn, st fasthttp.ConnState) {
			if st == fasthttp.StateActive && once.CompareAndSwap(false, true) {
				panic(v)
			}
			connState(c, st)
		}
	default:
		panic("PanicIn: no hook " + hook)
	}
}

// HeaderMarks is the requests s holds marked for their handler as their
// HeaderReceived panicked.
func HeaderMarks(s *Server) int32 { return s.headerPanics.n.Load() }

// Concurrency is the bound fasthttp puts on the connections s serves at
// once (0: its default, 262,144).
func Concurrency(s *Server) int { return s.srv.Concurrency }
