package httpapi

import (
	"bytes"
	"context"
	"errors"
	"io"
	"slices"
	"strconv"
	"time"

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

// readBody reads the request body under limit and the body budget, into
// *keep's capacity when keep is not nil (and leaves the buffer there for the
// next request unless it grew past keptBody). Bodies are streamed (fasthttp's
// StreamRequestBody): memory grows with the bytes that arrive, never with
// what Content-Length announces. The caller releases the returned
// reservation once done with the bytes.
func (s *Server) readBody(ctx *fasthttp.RequestCtx, limit int, keep *[]byte) ([]byte, int64, error) {
	cl := ctx.Request.Header.ContentLength()
	if cl > limit {
		ctx.SetConnectionClose() // the body stays unread
		return nil, 0, &requestError{fasthttp.StatusRequestEntityTooLarge, "too_large",
			"request body of " + strconv.Itoa(cl) + " bytes is over the limit of " + strconv.Itoa(limit) + " bytes"}
	}
	stream := ctx.RequestBodyStream()
	if stream == nil { // not streamed (a handler called in process): already read
		b := ctx.Request.Body()
		if len(b) > limit {
			return nil, 0, &requestError{fasthttp.StatusRequestEntityTooLarge, "too_large", "request body is over the limit of " + strconv.Itoa(limit) + " bytes"}
		}
		return b, 0, nil
	}
	reserve := int64(cl)
	if cl < 0 { // chunked: the size is unknown until the end
		reserve = int64(limit)
	}
	if s.opts.BodyBudget != nil && reserve > 0 {
		if err := s.acquire(reserve); err != nil {
			return nil, 0, err
		}
	}
	var buf []byte
	if keep != nil {
		buf = (*keep)[:0]
	}
	b, err := readAllLimited(stream, buf, limit, cl)
	if keep != nil && err == nil && cap(b) <= keptBody {
		*keep = b[:0]
	}
	if err != nil {
		s.releaseBody(reserve)
		ctx.SetConnectionClose() // the rest of the body is unread
		if errors.Is(err, errTooLarge) {
			return nil, 0, &requestError{fasthttp.StatusRequestEntityTooLarge, "too_large", "request body is over the limit of " + strconv.Itoa(limit) + " bytes"}
		}
		return nil, 0, &requestError{fasthttp.StatusBadRequest, "bad_request", "reading the request body: " + err.Error()}
	}
	return b, reserve, nil
}

// acquire waits for room for n body bytes: up to budgetWait, so a client
// cannot park requests forever by announcing large bodies.
func (s *Server) acquire(n int64) error {
	if s.opts.BodyBudget.TryAcquire(n) { // the usual case: no deadline to build
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), budgetWait)
	defer cancel()
	if err := s.opts.BodyBudget.Acquire(ctx, n); err != nil {
		return &requestError{fasthttp.StatusServiceUnavailable, "unavailable",
			"the server holds its limit of request bytes in memory (plover serve --max-body-memory); retry shortly"}
	}
	return nil
}

func (s *Server) releaseBody(n int64) {
	if s.opts.BodyBudget != nil && n > 0 {
		s.opts.BodyBudget.Release(n)
	}
}

var errTooLarge = errors.New("body over the limit")

// readAllLimited appends r's bytes to dst, growing it (doubling) as they
// arrive, never beyond the announced length (-1: chunked, unknown).
func readAllLimited(r io.Reader, dst []byte, limit, announced int) ([]byte, error) {
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
		end := cap(dst)
		if announced >= 0 {
			end = min(end, announced)
		}
		n, err := r.Read(dst[len(dst):end])
		dst = dst[:len(dst)+n]
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

// smuggling reports a request that carries both Content-Length and
// Transfer-Encoding: chunked, which RFC 9112 (6.3) says to refuse and
// close: two parsers could disagree on where it ends.
func smuggling(ctx *fasthttp.RequestCtx) bool {
	if ctx.Request.Header.ContentLength() != -1 {
		return false // not chunked
	}
	raw := ctx.Request.Header.RawHeaders()
	for len(raw) > 0 {
		line := raw
		if i := bytes.IndexByte(raw, '\n'); i >= 0 {
			line, raw = raw[:i], raw[i+1:]
		} else {
			raw = nil
		}
		if k, _, ok := bytes.Cut(line, []byte{':'}); ok && bytes.EqualFold(bytes.TrimSpace(k), []byte("Content-Length")) {
			return true
		}
	}
	return false
}
