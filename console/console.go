// Package console is the operator's and author's web console that plover
// serve shows at /ui/: static HTML, CSS and JavaScript modules embedded in
// the binary, so that it works offline and needs no build step. The files
// hold no data and so need no token; the page's own API calls carry the
// user's token.
package console

import (
	"embed"
	"io/fs"
	"path"
	"strings"

	"github.com/valyala/fasthttp"
)

// Prefix is the path the console is served under.
const Prefix = "/ui/"

//go:embed static
var embedded embed.FS

var static, _ = fs.Sub(embedded, "static")

// Policy is the Content-Security-Policy of every console response: only
// the server's own scripts, styles and API (no inline script, no eval, no
// other origin), and no framing, so that a tenant's string that slipped
// past escaping still could not run or be framed into a click-jack.
const Policy = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

var types = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".png":  "image/png",
	".svg":  "image/svg+xml",
}

// Serve answers a request for a path under Prefix (or Prefix without its
// slash, redirected) from the embedded files: GET and HEAD only.
func Serve(ctx *fasthttp.RequestCtx) {
	h := &ctx.Response.Header
	h.Set("Content-Security-Policy", Policy)
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	// The token travels in the fragment, which browsers never send; no
	// referrer either, so that no other page learns the console's address.
	h.Set("Referrer-Policy", "no-referrer")
	// A page of another site that opened the console (a popup, or its own
	// tab led there) keeps no handle on its window: it cannot move or
	// close it under the user's pointer, nor watch where it goes.
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cache-Control", "no-cache")
	if !ctx.IsGet() && !ctx.IsHead() {
		h.Set("Allow", "GET, HEAD")
		refuse(ctx, fasthttp.StatusMethodNotAllowed, "method not allowed: the console is read with GET")
		return
	}
	p := string(ctx.Path())
	if p == strings.TrimSuffix(Prefix, "/") || p == "/" {
		// The server's own address, as a browser opens it, leads to the
		// console (it answered a JSON 404 naming /v1 routes alone).
		// A path, not fasthttp's absolute URL (built from the request's
		// Host and the connection's scheme: a forged host reflected, https
		// behind a proxy made http), and not permanent: --console=false
		// must not be cached away.
		ctx.Response.Header.Set("Location", Prefix)
		ctx.SetStatusCode(fasthttp.StatusFound)
		return
	}
	name := strings.TrimPrefix(p, Prefix)
	if name == "" {
		name = "index.html"
	}
	name = path.Clean(name)
	b, err := fs.ReadFile(static, name)
	if err != nil || strings.HasPrefix(name, "..") {
		refuse(ctx, fasthttp.StatusNotFound, "not found: the console has no file "+p)
		return
	}
	ct, ok := types[path.Ext(name)]
	if !ok {
		ct = "application/octet-stream"
	}
	ctx.SetContentType(ct)
	ctx.SetBody(b)
}

// refuse answers code with msg as text, keeping the headers set before
// (ctx.Error would drop the policy with them).
func refuse(ctx *fasthttp.RequestCtx, code int, msg string) {
	ctx.SetStatusCode(code)
	ctx.SetContentType("text/plain; charset=utf-8")
	ctx.SetBodyString(msg)
}

// Files are the console's files, for tests that read them.
func Files() fs.FS { return static }

// Is reports whether path is the console's.
func Is(p []byte) bool {
	return strings.HasPrefix(string(p), Prefix) || string(p) == strings.TrimSuffix(Prefix, "/") || string(p) == "/"
}
