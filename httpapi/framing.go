package httpapi

// A request's framing checked before it is routed: what no route can read
// as sent is refused whole (400, 415) rather than misread.

import (
	"bytes"

	"github.com/valyala/fasthttp"
)

// encodedBody is the Content-Encoding of a request whose body has one
// other than identity, which no route decodes: read as sent, such a body
// ran a function on its compressed bytes (a 200 on the wrong input) or
// failed as JSON naming a byte the client never wrote. nil where there is
// none, or no body.
func encodedBody(ctx *fasthttp.RequestCtx) []byte {
	if cl := ctx.Request.Header.ContentLength(); cl == 0 || cl == -2 {
		return nil
	}
	ce := ctx.Request.Header.PeekBytes(hdrContentEncoding)
	if len(ce) == 0 || bytes.EqualFold(ce, identity) {
		return nil
	}
	return ce
}

var (
	hdrContentEncoding = []byte("Content-Encoding")
	identity           = []byte("identity")
)

// smuggling reports a request that carries Content-Length and
// Transfer-Encoding (chunked, identity, anything), which RFC 9112 (6.3)
// says to refuse and close: two parsers could disagree on where it ends.
// fasthttp keeps neither header as such, so the raw header is scanned; a
// line that starts with neither c nor t costs one comparison.
func smuggling(ctx *fasthttp.RequestCtx) bool {
	if ctx.Request.Header.ContentLength() == -2 {
		return false // no body headers at all
	}
	var cl, te bool
	raw := ctx.Request.Header.RawHeaders()
	for len(raw) > 0 {
		line := raw
		if i := bytes.IndexByte(raw, '\n'); i >= 0 {
			line, raw = raw[:i], raw[i+1:]
		} else {
			raw = nil
		}
		if len(line) == 0 || (line[0]|0x20 != 'c' && line[0]|0x20 != 't') {
			continue
		}
		if k, _, ok := bytes.Cut(line, []byte{':'}); ok {
			k = bytes.TrimSpace(k)
			cl = cl || bytes.EqualFold(k, []byte("Content-Length"))
			te = te || bytes.EqualFold(k, []byte("Transfer-Encoding"))
		}
	}
	return cl && te
}
