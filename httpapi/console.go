package httpapi

import (
	"github.com/plover-run/plover/console"
	"github.com/valyala/fasthttp"
)

// serveConsole answers the console's static files (/ui/) before the gate:
// they hold no data, so a browser can load the page and ask its user for
// the token that the page's own API calls then carry. With the console
// off, /ui/ is a path like any other: the gate, then 404.
func (s *Server) serveConsole(ctx *fasthttp.RequestCtx) bool {
	if s.opts.NoConsole || !console.Is(ctx.Path()) {
		return false
	}
	console.Serve(ctx)
	return true
}
