package httpapi

import (
	"bytes"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// Expect: 100-continue. A client that sends it holds its body back until
// the server says 100 Continue, or answers. fasthttp says 100 Continue as
// soon as the headers are read, before any handler, so a request the
// handler then refused (no token, an unknown function, a body over a
// limit, a token over its limits) had been told to upload its body first;
// its ContinueHandler can only turn a request away with 417 and no
// handler (and in v1.62.0 the connection stays open with every later
// request on it answered an empty 200, no handler run). So the server takes the expectation from fasthttp and keeps it
// itself, as net/http does: the handler runs on the headers alone, and
// the 100 Continue goes out when it first reads the body. Whatever the
// handler refuses before that is the client's answer in place of 100
// Continue, from the handler's own checks; the body, never read, closes
// the connection (closeIfUnread).

var (
	hdrExpect        = []byte("Expect")
	expect100        = []byte("100-continue")
	responseContinue = []byte("HTTP/1.1 100 Continue\r\n\r\n")
)

// continueWrite bounds the write of a 100 Continue: the connection's write
// deadline is the last answer's, maybe past.
const continueWrite = 10 * time.Second

// headerSet carries requests from fasthttp's HeaderReceived, which sees
// only the headers, to their handler, which sees the connection: the same
// goroutine, one after the other. It holds the requests that expect
// 100-continue (their Content-Length), and those whose HeaderReceived
// panicked (recover.go).
type headerSet struct {
	n  atomic.Int32 // entries in m: the handler of any other request looks at nothing
	mu sync.Mutex
	m  map[*fasthttp.RequestHeader]int
}

// headerReceived is the server's HeaderReceived. A request that expects
// 100-continue loses its Expect, so that fasthttp neither says 100
// Continue nor reads any of its body before the handler (its
// Content-Length is 0 until the handler starts: fasthttp reads the first
// 8 KiB of a body announced before any handler). An HTTP/1.0 request's
// expectation is ignored (RFC 9110 section 10.1.1), as is that of one
// with no body.
func (cs *connSet) headerReceived(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	if cs.over.n.Load() > 0 {
		cs.over.take(h) // as expect's, below
	}
	v := h.PeekBytes(hdrExpect)
	if len(v) == 0 || !bytes.EqualFold(v, expect100) {
		if cs.expect.n.Load() > 0 {
			// Should fasthttp ever skip a handler, its request's entry
			// must not give this one a Content-Length it did not send.
			cs.expect.take(h)
		}
		cs.holdIfOver(h)
		return fasthttp.RequestConfig{}
	}
	if d, ok := cs.byHeader.Load(h); ok && d.(*drainConn).pipelined() {
		// Pipelined behind an answer fasthttp may still buffer (it read
		// these headers from its buffer, and flushes only before a read):
		// its own 100 Continue goes into that buffer after the answer,
		// where one written by the handler would overtake it.
		cs.holdIfOver(h)
		return fasthttp.RequestConfig{}
	}
	h.DelBytes(hdrExpect)
	cl := h.ContentLength()
	if cl == 0 || cl == -2 || !h.IsHTTP11() { // -2: no body headers
		cs.holdIfOver(h) // an HTTP/1.0 request's expectation is ignored, not its length
		return fasthttp.RequestConfig{}
	}
	if cl > 0 {
		h.SetContentLength(0)
	}
	cs.expect.put(h, cl)
	return fasthttp.RequestConfig{}
}

// holdIfOver holds h's body (holdOver) where its Content-Length is over
// --max-body.
func (cs *connSet) holdIfOver(h *fasthttp.RequestHeader) {
	if cl := h.ContentLength(); cs.maxBody > 0 && cl > cs.maxBody {
		cs.holdOver(h, cl)
	}
}

// holdOver keeps fasthttp from reading any of a body whose Content-Length
// cl is over --max-body before the handler, as for 100-continue: it would
// wait for min(cl, 8 KiB) of it first (readBodyWithStreaming), so that a
// client that announced 2^63-1 bytes and sent fewer than 8 KiB had no
// answer until the read timeout (408), where the handler refuses it from
// its Content-Length alone (413) and closes the connection. The length is
// kept in over until the handler starts (unhold).
func (cs *connSet) holdOver(h *fasthttp.RequestHeader, cl int) {
	h.SetContentLength(0)
	cs.over.put(h, cl)
}

// unhold gives ctx's request back the Content-Length holdOver kept, if it
// kept one: none of its body has been read (preReadOf).
func (cs *connSet) unhold(ctx *fasthttp.RequestCtx) {
	if cl, ok := cs.over.take(&ctx.Request.Header); ok {
		ctx.Request.Header.SetContentLength(cl)
		ctx.SetUserValue(expectedKey{}, true)
	}
}

// pipelined reports whether the request whose headers fasthttp has just
// read into c's context came from its buffer, no read since c's last
// handler returned; called from HeaderReceived, on the goroutine that
// read them. fasthttp gives a connection's context back to its pool
// before it closes the connection, and ConnState's close, which drops c's
// entry in byHeader, comes after: a new connection may read its first
// headers into that context in between, and c, closing, its last read
// before its last handler, would take them for its own pipelined request
// (leaving its expectation to fasthttp, whose read of the body, before
// any handler, only the read timeout bounds). The context's connection
// is the one that read them.
func (c *drainConn) pipelined() bool {
	ctx := c.ctx.Load()
	return ctx != nil && drainOf(ctx.Conn()) == c && c.reads.Load() == c.ended.Load()
}

// put adds h's entry, v.
func (e *headerSet) put(h *fasthttp.RequestHeader, v int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.m == nil {
		e.m = make(map[*fasthttp.RequestHeader]int)
	}
	e.m[h] = v
	e.n.Store(int32(len(e.m)))
}

// expecting restores the Content-Length of ctx's request if it expects
// 100-continue, and has its connection say 100 Continue before its first
// read, and reports whether it did. fasthttp's body stream reads the
// length from the header as it goes.
func (cs *connSet) expecting(ctx *fasthttp.RequestCtx) bool {
	h := &ctx.Request.Header
	cl, ok := cs.expect.take(h)
	if !ok {
		return false
	}
	if cl > 0 {
		h.SetContentLength(cl)
	}
	ctx.SetUserValue(expectedKey{}, true)
	if d := drainOf(ctx.Conn()); d != nil {
		if d.reads.Load() == d.ended.Load() {
			// Pipelined, and headerReceived did not know the connection
			// (a new context): a 100 now could overtake the last answer.
			// None is said; the client sends its body after its own wait.
			return false
		}
		d.owe100.Store(true)
		return true
	}
	ctx.Conn().Write(responseContinue) // not a connection Serve accepted: at once, as fasthttp would
	return false
}

// expectedKey is the user-value key of a request none of whose body
// fasthttp read before the handler: one that expected 100-continue, or
// whose Content-Length was over --max-body (holdOver); zero-size, as
// bodyReadKey.
type expectedKey struct{}

// preReadOf is the most fasthttp read of ctx's body with the headers:
// preRead, or nothing for a request that expected 100-continue or
// announced a body over --max-body. What it read is in memory already;
// the rest of the body is still the client's.
func preReadOf(ctx *fasthttp.RequestCtx) int {
	if expected, _ := ctx.UserValue(expectedKey{}).(bool); expected {
		return 0
	}
	return preRead
}

// take removes h's entry, and returns its value.
func (e *headerSet) take(h *fasthttp.RequestHeader) (int, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	cl, ok := e.m[h]
	delete(e.m, h)
	e.n.Store(int32(len(e.m)))
	return cl, ok
}

// answered takes back a 100 Continue the handler did not call for by
// reading the body: its answer is the final one.
func answered(ctx *fasthttp.RequestCtx) { drainOf(ctx.Conn()).owe100.Store(false) }

// sayContinue writes the 100 Continue c owes, if it owes one, before it
// reads: the handler wants the body. None is owed by a request pipelined
// behind an answer fasthttp may still buffer (expecting).
func (c *drainConn) sayContinue() error {
	if !c.owe100.CompareAndSwap(true, false) {
		return nil
	}
	c.Conn.SetWriteDeadline(time.Now().Add(continueWrite)) // fasthttp sets its own before the answer
	_, err := c.Conn.Write(responseContinue)
	return err
}
