package httpapi

import (
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
