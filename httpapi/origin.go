package httpapi

// Which browser requests are the server's own pages'.

import (
	"bytes"
	"fmt"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"unsafe"

	"github.com/valyala/fasthttp"
)

// crossSite names the header that shows a request which may change
// something (any method but GET and HEAD) to come from another site's page,
// or is "". A browser sends a "simple" request (a form's, or fetch's
// no-cors: POST with text/plain, no header of its own) to any site without
// asking it first; on a server without tokens, nothing else would stand
// between such a page and a rollback or gc. A browser names the page's
// origin in Origin and, lately, says cross-site in Sec-Fetch-Site; other
// clients send neither. An origin the operator named (--origin) is the
// server's own, whatever the browser says of the Host it sees.
func (s *Server) crossSite(ctx *fasthttp.RequestCtx) string {
	if ctx.IsGet() || ctx.IsHead() {
		return ""
	}
	h := &ctx.Request.Header
	o := h.PeekBytes(hdrOrigin)
	if len(o) > 0 && s.namedOrigin(o) {
		return ""
	}
	// A browser that sends Sec-Fetch-Site says itself whether the page is
	// this origin's: behind a proxy the Host the server sees (localhost,
	// say) need not be the page's, so Origin is compared only without it.
	switch site := string(h.PeekBytes(hdrSecFetchSite)); site {
	case "cross-site", "same-site":
		return "Sec-Fetch-Site: " + site
	case "same-origin", "none":
		return ""
	}
	if len(o) > 0 && !sameOrigin(o, ctx.Host()) {
		return "Origin " + strconv.Quote(string(o)) + " is not this server's nor one named by plover serve --origin"
	}
	return ""
}

// namedOrigin reports whether origin (an Origin header) is one the
// operator named (Options.Origins). Browsers send an origin's scheme and
// host in lower case and leave a default port out, as ParseOrigin keeps
// the named ones; the comparison still ignores case.
func (s *Server) namedOrigin(origin []byte) bool {
	for _, n := range s.origins {
		if bytes.EqualFold(origin, n) {
			return true
		}
	}
	return false
}

// ParseOrigin reads an origin as a browser's Origin header names it,
// scheme://host[:port] with the scheme http or https, and returns it as
// browsers write it: in lower case, the scheme's default port left out.
// A path, query, fragment or user is refused: an origin has none, and one
// given would match no browser's.
func ParseOrigin(s string) (string, error) {
	u, err := url.Parse(strings.TrimSuffix(s, "/"))
	switch {
	case err != nil:
		return "", err
	case u.Scheme != "http" && u.Scheme != "https":
		return "", fmt.Errorf("%q: want http://HOST[:PORT] or https://HOST[:PORT]", s)
	case u.Host == "" || u.User != nil || u.Path != "" || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" || strings.HasSuffix(u.Host, ":"):
		return "", fmt.Errorf("%q: an origin is a scheme, a host and perhaps a port, nothing more (no path, query, fragment or user)", s)
	}
	host := strings.ToLower(u.Host)
	if p := u.Port(); (u.Scheme == "http" && p == "80") || (u.Scheme == "https" && p == "443") {
		host = strings.TrimSuffix(host, ":"+p)
	}
	return u.Scheme + "://" + host, nil
}

// sameOrigin reports whether origin (an Origin header: scheme://host[:port])
// names host (the request's Host). The scheme is not compared: behind a
// proxy that ends TLS the server sees http for the page's https.
func sameOrigin(origin, host []byte) bool {
	_, authority, ok := bytes.Cut(origin, []byte("://"))
	return ok && len(host) > 0 && bytes.EqualFold(authority, host)
}

var (
	hdrNoSniff = []byte("X-Content-Type-Options")
	hdrCSP     = []byte("Content-Security-Policy")
	hdrCORP    = []byte("Cross-Origin-Resource-Policy")
	valNoSniff = []byte("nosniff")
	valCSP     = []byte("default-src 'none'; frame-ancestors 'none'; sandbox")
	valCORP    = []byte("same-origin")
)

// setAPIHeaders has a browser take an API answer as data alone: not
// sniffed into a page or script, not run or framed if opened as one,
// not read by another site's page through an embedding element.
func setAPIHeaders(h *fasthttp.ResponseHeader) {
	h.SetCanonical(hdrNoSniff, valNoSniff)
	h.SetCanonical(hdrCSP, valCSP)
	h.SetCanonical(hdrCORP, valCORP)
}

// loopbackHost reports whether host, a Host header (a name or address and
// perhaps a port), names the loopback: localhost or a loopback address.
func loopbackHost(host []byte) bool {
	if host[0] == '[' { // [::1]:8080
		end := bytes.IndexByte(host, ']')
		if end < 0 {
			return false
		}
		host = host[1:end]
	} else if i := bytes.LastIndexByte(host, ':'); i >= 0 {
		host = host[:i]
	}
	host = bytes.TrimSuffix(host, []byte{'.'}) // localhost. is localhost
	if bytes.EqualFold(host, []byte("localhost")) {
		return true
	}
	a, err := netip.ParseAddr(unsafe.String(unsafe.SliceData(host), len(host))) // not kept
	return err == nil && a.IsLoopback()
}
