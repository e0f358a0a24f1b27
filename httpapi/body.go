package httpapi

import (
	"bytes"
	"context"
	"errors"
	"io"
	"slices"
	"strconv"
	"time"

	"github.com/plover-run/plover/apierr"
	"github.com/valyala/fasthttp"
)

// BodyBudget bounds the bytes of request bodies held in memory at once
// (netguard.Budget).
type BodyBudget interface {
	TryAcquire(n int64) bool
	Acquire(ctx context.Context, n int64) error
	Release(n int64)
}

// budgetWait is how long a request waits for room in the body budget
// before it gets 503.
const budgetWait = 5 * time.Second

// keptBody is the largest input buffer a pooled call keeps between
// requests: a rare huge request must not pin its memory forever.
const keptBody = 1 << 20

// limitName is a body limit as a client should read it: the server's
// --max-body is named, so an operator knows what to raise.
func (s *Server) limitName(limit int) string {
	if limit == s.opts.MaxBodyBytes {
		return strconv.Itoa(limit) + " bytes (plover serve --max-body)"
	}
	return strconv.Itoa(limit) + " bytes for this route"
}

// readBody reads the request body under limit and the body budget, into
// *keep's capacity when keep is not nil (and leaves the buffer there for the
// next request unless it grew past keptBody). Bodies are streamed (fasthttp's
// StreamRequestBody) and the budget is taken as bytes arrive, a read window
// at a time: a client holds what it has sent plus one window, never what its
// Content-Length announces. The caller releases the returned reservation
// once done with the bytes.
func (s *Server) readBody(ctx *fasthttp.RequestCtx, limit int, keep *[]byte) ([]byte, int64, error) {
	cl := ctx.Request.Header.ContentLength()
	if cl > limit {
		ctx.SetConnectionClose() // the body stays unread
		return nil, 0, tooLarge("request body of " + strconv.Itoa(cl) + " bytes is over the limit of " + s.limitName(limit))
	}
	stream := ctx.RequestBodyStream()
	if stream == nil { // not streamed (a handler called in process): already read
		b := ctx.Request.Body()
		if len(b) > limit {
			return nil, 0, tooLarge("request body is over the limit of " + s.limitName(limit))
		}
		return b, 0, nil
	}
	var buf []byte
	if keep != nil {
		buf = (*keep)[:0]
	}
	r := bodyReader{s: s, r: stream}
	b, err := r.readAll(buf, limit, cl)
	if err != nil {
		s.releaseBody(r.held)
		ctx.SetConnectionClose() // the rest of the body is unread
		if rq, ok := err.(*apierr.Error); ok {
			return nil, 0, rq
		}
		if errors.Is(err, errTooLarge) {
			return nil, 0, tooLarge("request body is over the limit of " + s.limitName(limit))
		}
		return nil, 0, &apierr.Error{Status: apierr.BadRequest, Msg: "reading the request body: " + err.Error()}
	}
	markRead(ctx)
	if keep != nil && cap(b) <= keptBody {
		*keep = b[:0]
	}
	return b, r.held, nil
}

// acquire waits for room for n body bytes: up to budgetWait, so that no
// request waits for ever behind clients that hold the budget.
func (s *Server) acquire(n int64) error {
	if s.opts.BodyBudget.TryAcquire(n) { // the usual case: no deadline to build
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), budgetWait)
	defer cancel()
	if err := s.opts.BodyBudget.Acquire(ctx, n); err != nil {
		return &apierr.Error{Status: apierr.Unavailable,
			Msg: "the server holds its limit of request bytes in memory (plover serve --max-body-memory); retry shortly"}
	}
	return nil
}

func (s *Server) releaseBody(n int64) {
	if s.opts.BodyBudget != nil && n > 0 {
		s.opts.BodyBudget.Release(n)
	}
}

var errTooLarge = errors.New("body over the limit")

// readWindow bounds one read, and so the budget a client waiting to send
// more can hold beyond the bytes it has sent.
const readWindow = 64 << 10

// bodyReader reads a body into a growing buffer, holding budget for the
// bytes it has read (held).
type bodyReader struct {
	s    *Server
	r    io.Reader
	held int64
}

// readAll appends the body to dst, growing it (doubling) as bytes arrive,
// never beyond the announced length (-1: chunked, unknown).
func (b *bodyReader) readAll(dst []byte, limit, announced int) ([]byte, error) {
	budget := b.s.opts.BodyBudget != nil
	for {
		if announced >= 0 && len(dst) == announced {
			return dst, nil
		}
		if len(dst) == cap(dst) {
			grow := max(cap(dst), 4096)
			if announced >= 0 {
				grow = min(grow, announced-len(dst))
			}
			dst = slices.Grow(dst, grow)
		}
		end := min(cap(dst), len(dst)+readWindow)
		if announced >= 0 {
			end = min(end, announced)
		}
		window := int64(end - len(dst))
		if budget {
			if err := b.s.acquire(window); err != nil {
				return nil, err
			}
			b.held += window
		}
		n, err := b.r.Read(dst[len(dst):end])
		dst = dst[:len(dst)+n]
		if budget && int64(n) < window { // keep only what arrived
			b.s.opts.BodyBudget.Release(window - int64(n))
			b.held -= window - int64(n)
		}
		if len(dst) > limit {
			return nil, errTooLarge
		}
		switch {
		case err == io.EOF && (announced < 0 || len(dst) == announced):
			return dst, nil
		case err == io.EOF:
			return nil, io.ErrUnexpectedEOF
		case err != nil:
			return nil, err
		}
	}
}

// bodyReadKey is the user-value key of a request whose body was read; a
// zero-size type, so setting it allocates nothing.
type bodyReadKey struct{}

// markRead records that the handler consumed the request body to its end.
func markRead(ctx *fasthttp.RequestCtx) { ctx.SetUserValue(bodyReadKey{}, true) }

// closeIfUnread closes the connection after a response to a request whose
// body was left unread (a refusal, an early error): fasthttp does not drain
// a streamed body, so its remaining bytes would be parsed as the next
// request on the connection.
func closeIfUnread(ctx *fasthttp.RequestCtx) {
	if ctx.Request.Header.ContentLength() == 0 || ctx.RequestBodyStream() == nil {
		return
	}
	if read, _ := ctx.UserValue(bodyReadKey{}).(bool); !read {
		ctx.SetConnectionClose()
	}
}

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
