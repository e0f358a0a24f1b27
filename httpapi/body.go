package httpapi

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/plover-run/plover/apierr"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/ioshare"
	"github.com/plover-run/plover/netguard"
	"github.com/plover-run/plover/oip"
	"github.com/plover-run/plover/pipeline"
	"github.com/valyala/fasthttp"
)

// BodyBudget bounds the bytes of request bodies held in memory at once
// (netguard.Budget).
type BodyBudget interface {
	TryAcquire(n int64) bool
	Acquire(ctx context.Context, n int64) error
	Release(n int64)     // at most Max at once
	TakePast(n int64)    // n whether or not they fit (bodyRoom)
	ReleasePast(n int64) // what TakePast took, or more than Max
	InUse() int64        // the bytes held now
	Max() int64          // the budget's size; 0: unlimited
}

// budgetWait is how long a request waits for room in the body budget
// before it gets 503.
const budgetWait = 5 * time.Second

// keptBody is the largest buffer a pooled call or a connection keeps
// between requests (an input's, an output's, a response's): a rare huge
// request must not pin its memory forever.
const keptBody = 1 << 20

// kept is b emptied for a later request, or nil when it grew past
// keptBody. A capacity check only: the small requests' hot path keeps its
// buffers without a copy or an allocation.
func kept(b []byte) []byte {
	if cap(b) > keptBody {
		return nil
	}
	return b[:0]
}

// dropLargeResponse hands an answer past keptBody that a handler wrote into
// the response's own buffer (a long listing, a scrape of many functions, a
// big /v2 answer) to fasthttp as a stream of itself, so that the buffer
// goes with the answer: fasthttp keeps the response's buffer for its
// connection's life (ReduceMemoryUsage is off), and each idle keep-alive
// connection such an answer passed through held its size. The bytes are
// written from the same memory, with the same Content-Length.
func dropLargeResponse(ctx *fasthttp.RequestCtx) {
	if ctx.Hijacked() || ctx.Response.IsBodyStream() {
		return // Body would read the stream
	}
	if b := ctx.Response.Body(); cap(b) > keptBody {
		ctx.Response.SwapBody(nil)
		ctx.Response.SetBodyStream(bytes.NewReader(b), len(b))
	}
}

// bodyLimit is the most bytes a route reads of a body, and what sets it,
// as a client should read it in a 413: --max-body is named, so that an
// operator knows what to raise; a function's max_input_bytes, so that an
// author does.
type bodyLimit struct {
	n   int
	why string    // what sets it; "" for a function's, named by fn, in and enc
	fn  call.Name // for the message only
	in  int64
	enc encoding
	// step is, for a pipeline, the step whose max_input_bytes in is
	// (pipeline.Pin.InputBound): a pipeline sets none of its own.
	step pipeline.StepRef
}

func (s *Server) serverLimit() bodyLimit {
	return bodyLimit{n: s.opts.MaxBodyBytes, why: "(plover serve --max-body)"}
}

func (l bodyLimit) over(size string) error {
	if l.why != "" {
		return tooLarge("request body " + size + " is over the limit of " + strconv.Itoa(l.n) + " bytes " + l.why)
	}
	return l.step.Refusal(l.fn.Keep(), func(step string) error {
		why := "for function " + l.fn.Borrow() + " (its max_input_bytes, "
		if step != "" {
			why = "for pipeline " + l.fn.Borrow() + " (its " + step + "'s max_input_bytes, "
		}
		return tooLarge("request body " + size + " is over the limit of " + strconv.Itoa(l.n) + " bytes " + why + strconv.FormatInt(l.in, 10) + encodingNames[l.enc] + ")")
	})
}

// encoding is how a request carries a function's input.
type encoding uint8

const (
	rawBody    encoding = iota // the bytes themselves
	base64JSON                 // /v1 JSON: {"input": "<base64>"} and the PyPlover fields
	v2JSON                     // /v2: tensors as JSON numbers, or the binary extension
)

var encodingNames = [...]string{rawBody: "", base64JSON: ", as base64 in JSON", v2JSON: ", as JSON numbers"}

// What a JSON body carrying max_input_bytes of input may take. Base64 is 4
// characters for 3 bytes. A number is at most about 24 characters plus its
// separator, for an element of 1 to 8 bytes: an FP16 written as the float64
// it widens to ("0.00010001659393310547, ", 12 a byte) or a UINT8 in
// indented JSON. jsonRoom is for names, shapes, parameters and the rest.
const (
	base64PerByte  = 2
	numbersPerByte = 32
	jsonRoom       = 64 << 10
)

// inputLimit is what may be read of a request to name (in version, if not
// "", current or not) carried as enc: the function's own
// max_input_bytes, or what carries that many bytes in enc, under
// --max-body. It is asked before the body is read (Invoker.Admit), so that
// a body the function could never take is a 413 from its Content-Length,
// or as a chunked body passes the bound, without waiting for or holding the
// body budget; an unknown function or version is a 404 and a full queue a
// 429 before the body too. At once past --max-body (holdOver); within it,
// once fasthttp has read the first min(Content-Length, 8 KiB) of the body
// (preReadOf), as the function's bound is not known before the handler
// without a lookup on every request. A body fasthttp has read already
// costs nothing more to read: the engine bounds it, and the hot path asks
// nothing here.
func (s *Server) inputLimit(ctx *fasthttp.RequestCtx, name call.Name, version string, enc encoding, deadline time.Time) (bodyLimit, error) {
	cl := ctx.Request.Header.ContentLength()
	if cl == -2 || (cl >= 0 && cl <= preReadOf(ctx)) { // -2: no body headers, so no body
		return s.serverLimit(), nil
	}
	a, err := s.door.Admit(context.Background(), name.Borrow(), deadline)
	if err != nil {
		return bodyLimit{}, err
	}
	maxIn, step := a.MaxInput, a.Step
	if version != "" && !a.Version.Names(version) {
		// Another version than the current one: its own bound, and an
		// unknown one's 404 before the body (oip.Pin pins it again after).
		p, err := oip.PinVersion(s.runCheck(ctx, version), s.door, name.Borrow(), version, deadline)
		if err != nil { // counted as the pin after the body would count it: not at all
			return bodyLimit{}, err
		}
		maxIn, step = p.InputBound() // a pipeline's: its first step's
		p.Release()
	}
	lim := s.serverLimit()
	if maxIn <= 0 {
		return lim, nil
	}
	n := maxIn
	switch enc {
	case base64JSON:
		n = maxIn*base64PerByte + jsonRoom
	case v2JSON:
		n = maxIn*numbersPerByte + jsonRoom
		// The binary extension: a JSON header of the length given, then
		// at most max_input_bytes of tensors.
		if h := ctx.Request.Header.PeekBytes(hdrInferHeaderLen); len(h) > 0 {
			if hl, err := strconv.ParseInt(b2s(h), 10, 64); err == nil && hl >= 0 {
				n = min(n, hl) + maxIn
			}
		}
	}
	if n < int64(lim.n) {
		lim = bodyLimit{n: int(n), fn: name, in: maxIn, enc: enc, step: step}
	}
	return lim, nil
}

// readBody reads the request body under limit and the body budget, into
// *keep's capacity when keep is not nil (and leaves the buffer there for the
// next request unless it grew past keptBody). Bodies are streamed (fasthttp's
// StreamRequestBody) and the budget is taken as bytes arrive, a read window
// at a time: a client holds what it has sent plus one window, never what its
// Content-Length announces. Past what fasthttp read with the headers, each
// read is a piece in the request's turns (pieces.go). The caller releases
// the returned reservation once done with the bytes.
func (s *Server) readBody(ctx *fasthttp.RequestCtx, limit bodyLimit, keep *[]byte, t turns) ([]byte, int64, error) {
	return s.readBodyLent(ctx, limit, keep, t, nil)
}

// readBodyLent is readBody for a body that may go on into a slot its
// function's worker reads it from (sl; nil: none), lent once the body is
// arriving (slotLend).
func (s *Server) readBodyLent(ctx *fasthttp.RequestCtx, limit bodyLimit, keep *[]byte, t turns, sl *slotLend) ([]byte, int64, error) {
	cl := ctx.Request.Header.ContentLength()
	if cl > limit.n {
		ctx.SetConnectionClose() // the body stays unread
		return nil, 0, limit.over("of " + strconv.Itoa(cl) + " bytes")
	}
	stream := ctx.RequestBodyStream()
	if stream == nil { // not streamed (a handler called in process): already read
		b := ctx.Request.Body()
		if len(b) > limit.n {
			return nil, 0, limit.over("of " + strconv.Itoa(len(b)) + " bytes")
		}
		return b, 0, nil
	}
	var buf []byte
	if keep != nil {
		buf = (*keep)[:0]
	}
	r := bodyReader{s: s, r: stream, t: t, conn: ctx.Conn(), chunked: cl < 0, pre: min(max(cl, 0), preReadOf(ctx)), spare: buf}
	// Deferred: a panic in a read must not keep the budget, nor the
	// flow's count of bodies being read, for good.
	defer r.release()
	if r.reading = cl < 0 || cl > r.pre; r.reading {
		t.fl.Reading(1)
	}
	var b []byte
	err := r.lendFor(sl, cl)
	if err == nil {
		if sl != nil && sl.land != nil {
			buf = sl.land.Input()[:0] // lent before any byte was read: none to copy
		}
		b, err = r.readAll(buf, limit.n, cl)
	}
	if err != nil {
		ctx.SetConnectionClose() // the rest of the body is unread
		// Before Invoke, whatever its status (a 503 for no room, a 504 at
		// the deadline): the engine never saw the request.
		return nil, 0, frontdoor.Refusal(s.bodyError(err, limit))
	}
	markRead(ctx)
	if keep != nil && cap(b) <= keptBody && (sl == nil || sl.land == nil || !aliases(b, sl.land.Input())) {
		*keep = b[:0] // never the slot's memory: it goes back to its worker
	}
	r.handed = true
	return b, r.held, nil
}

// release gives back the budget held for the body's bytes unless they
// were handed to the caller, who releases it, ends the flow's count of
// the body being read, and leaves the connection's read deadline as it
// was before a slot's (arm).
func (b *bodyReader) release() {
	if !b.handed {
		b.s.releaseBody(b.held)
	}
	if b.reading {
		b.t.fl.Reading(-1)
	}
	if b.landed {
		b.t.fl.Landed(-1)
	}
	if b.armed {
		b.conn.SetReadDeadline(b.back)
	}
}

// bodyError is what a client is told of err, which ended the reading of
// a body under limit.
func (s *Server) bodyError(err error, limit bodyLimit) error {
	if rq, ok := err.(*apierr.Error); ok {
		return rq
	}
	var turnErr *errdefs.Error
	if errors.As(err, &turnErr) {
		return turnErr
	}
	if errors.Is(err, errTooLarge) {
		return limit.over("of more than " + strconv.Itoa(limit.n) + " bytes")
	}
	if timedOut(err) {
		return &apierr.Error{Status: apierr.RequestTimeout,
			Msg: "the request body did not arrive within the server's read timeout of " + s.readTimeout().String()}
	}
	if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		// Its client is gone, not its request malformed: counted as a
		// client that left (499), as one that leaves while it waits is.
		// A body that ends short of its length with the connection
		// half-open may be a client waiting for its 400: that stays one.
		return errdefs.New(errdefs.KindGone, err, "the client went away while its request body was arriving (its connection was reset)")
	}
	return &apierr.Error{Status: apierr.BadRequest, Msg: "reading the request body: " + err.Error()}
}

var errTooLarge = errors.New("body over the limit")

// A read window bounds one read, and so the budget a client waiting to
// send more can hold beyond the bytes it has sent: readWindow to start
// with; past the first 256 KiB of a body, doubled each time a read fills
// it (the bytes were there already) up to maxReadWindow. A client that
// trickles holds 64 KiB ahead; a fast one's 4 MB body is read in a few
// large reads, not 61 (4-client
// throughput of 4 MB bodies 0.67-0.72x an echo floor with 64 KiB reads,
// 0.78x with 1 MiB: BENCHMARKS.md "The data path").
const (
	readWindow    = 64 << 10
	maxReadWindow = 1 << 20
)

// bodyReader reads a body into a growing buffer, holding budget for the
// bytes it has read (held), in its request's turns past what fasthttp
// read with the headers.
type bodyReader struct {
	s      *Server
	r      io.Reader
	held   int64
	handed bool          // held is the caller's to release
	waited time.Duration // for the budget so far, over all its windows
	since  time.Time     // its first wait for the budget (bodyWaits)

	t       turns
	conn    net.Conn
	chunked bool // no Content-Length: fasthttp's buffer may hold body bytes at any read
	pre     int  // the body's bytes fasthttp read with the headers (preReadOf at most)
	read    int  // bytes read so far
	drained bool // fasthttp's read buffer is known empty
	bounded bool // the connection's read deadline is the request's (bound)
	// lend, while not nil, is the slot to lend once a read past the
	// pre-read brings bytes (lendFor); then nil.
	lend *slotLend
	// sl is the request's slot once lent (lent), until the body ends or
	// gives it back (giveBack); spare is the memory it goes on in then
	// (the pooled exchange's).
	sl    *slotLend
	spare []byte
	// armed: the connection's read deadline is the slot's (arm), at most
	// slotIdle away, set when read was armedAt; back is the deadline the
	// reads run under without it.
	armed   bool
	armedAt int
	due     time.Time // the slot's deadline while armed
	back    time.Time
	// reading, landed: the body is counted being read (Flow.Reading),
	// and in a slot (Flow.Landed).
	reading, landed bool
}

// slotIdle is how long a body read into a worker's slot may bring no byte
// before it gives the slot back (giveBack): a slot is lent only once its
// body arrives (slotLend), but a client that sends some and stops would
// otherwise hold it until the request's deadline, and a few dozen such
// clients every slot of its function's worker, whose other requests then
// copied their bodies and answers. Above Linux's shortest TCP
// retransmission timeout (200 ms), so that a loopback or LAN client that
// lost a segment keeps its slot, and short beside a request's deadline
// (--timeout, 30 s by default). A body that pauses longer (a WAN client
// waiting on its window, a client that stalled) goes on in the server's
// memory: one copy more, its answer copied too, never wrong. The
// deadline is set when the slot is lent and again only once it passes
// (idled), not for every read: a body that gives its slot back brought
// no byte for slotIdle to twice that.
const slotIdle = 250 * time.Millisecond

// errSlotIdle ends a read of a body whose slot's deadline (arm) passed
// with no byte read since it was set: the body gives its slot back
// (giveBack) and goes on. Never a client's error: neither the request's
// deadline (504) nor the read timeout (408).
var errSlotIdle = errors.New("httpapi: the body brought no byte for the slot's idle time")

// slotLend lends a raw invoke's body the slot its function's worker reads
// it from (the front door's Land), so that the body lands where the device
// reads it and the answer is written from where the run left it. A
// worker lends a few dozen slots (its pool), and a slot lent is the
// request's until its answer is written: lent before the body came, a
// client that sent its headers and nothing more (a chunked body, or one
// that expects 100-continue) held one for up to the read timeout, and 32
// such connections left the function's other requests none (each then
// copied its body and its answer: 8 MiB copied for a 4 MiB echo). So a
// slot is lent only once the body is arriving: where the socket can be
// waited on and the rest of the body cannot all be in fasthttp's read
// buffer, once the socket has bytes, before any is read (nothing
// copied); otherwise once a read past the pre-read brought some, which
// are copied into it with what was read before (at most the pre-read and
// one read of readBuffer bytes). A body all read with the headers, or
// none, is lent one after it is read (invokeRaw), for the answer, and so
// is a chunked body, read into memory (lendFor). A body that stops
// arriving gives its slot back after slotIdle (giveBack) and goes on in
// memory, as one lent none.
type slotLend struct {
	s      *Server
	fn     string
	land   call.Landing // the slot lent; nil: none yet, or none to lend
	asked  bool         // Land was asked: land is its answer
	pre    int          // the body's bytes fasthttp read with the headers (bodyReader.pre)
	copied int64        // body bytes read before the slot was lent, copied into it; given back, all copied into it and out
}

// lendInto asks for the slot, once, and returns where the body goes on:
// the slot's input, got copied to its start, or got itself where no slot
// is lent, or got or the body's announced size (0, -1: unknown) does not
// fit in it (the copy path, as a body past the slot's size always took:
// lent, it would grow out of the slot into memory, and a pause would copy
// it again for nothing).
func (l *slotLend) lendInto(got []byte, size int) []byte {
	if l.asked {
		return got
	}
	l.asked = true
	land := l.s.door.Land(l.fn)
	if land == nil {
		return got
	}
	in := land.Input()
	if max(len(got), size) > len(in) {
		land.Release()
		return got
	}
	l.land = land
	l.copied += int64(copy(in, got))
	return in[:len(got)]
}

// lendFor decides when the body's reads lend sl's slot, for a body of
// length cl (-1: chunked): at once where the socket can be waited on and
// more of the body is to come than fasthttp's read buffer holds, once the
// socket has bytes (a client that expects 100-continue is told to send
// first), holding nothing meanwhile; a wait bounded by the request's
// deadline as the reads after it are (bound, cut). Otherwise after the
// first read past the pre-read that brings bytes (readAll): TLS (whose
// records the socket's readiness says nothing of), and a body whose rest
// may all be in fasthttp's buffer already, its socket never to be
// readable. A body all read with the headers lends nothing here, nor
// does a chunked body: one that pauses could not give its slot back
// (arm), so it is read into memory and lent its slot once read
// (invokeRaw), for one copy of it.
func (b *bodyReader) lendFor(sl *slotLend, cl int) error {
	if sl == nil {
		return nil
	}
	sl.pre = b.pre
	switch {
	case cl < 0:
		return nil // chunked: in memory, lent once read
	case cl <= b.pre:
		return nil // all in memory: invokeRaw lends once it is read
	case cl-b.pre > readBuffer && ioshare.Waitable(b.conn):
		if d := drainOf(b.conn); d != nil {
			if err := d.sayContinue(); err != nil {
				return err
			}
		}
		b.bound()
		if err := ioshare.WaitReadable(b.conn); err != nil {
			return b.cut(err)
		}
		b.lent(sl, nil, cl)
		return nil
	}
	b.lend = sl
	return nil
}

// readPiece reads into p. fasthttp read the body's first bytes with the
// headers, and its read buffer (readBuffer bytes) may hold a few more:
// those are read as they come, and with them the buffer is drained. Past
// them, with turns, each read is a piece: its socket waited for until it
// has bytes, holding no turn, then read in turn, so that a client that
// trickles holds no turn, and one that sends fast waits for its share.
// Every read past the pre-read, whichever way it goes, is bounded by the
// request's deadline (bound), and one it cuts is the deadline's 504.
func (b *bodyReader) readPiece(p []byte) (int, error) {
	if b.read < b.pre {
		return b.count(b.r.Read(p))
	}
	b.bound()
	b.fresh()
	n, err := b.count(b.readPast(p))
	if b.armed && err != nil && timedOut(err) {
		return n, b.idled()
	}
	return n, b.cut(err)
}

// lent lends sl's slot to the body (slotLend.lendInto: got is what was
// read before it, copied into it), counts it and, for a body of known
// length, sets the slot's read deadline (arm).
func (b *bodyReader) lent(sl *slotLend, got []byte, size int) []byte {
	got = sl.lendInto(got, size)
	if sl.land == nil {
		return got
	}
	b.sl, b.landed = sl, true
	b.t.fl.Landed(1)
	b.arm()
	return got
}

// arm bounds the body's reads while it holds its slot: the connection's
// read deadline slotIdle from now, unless the request's deadline (or the
// read timeout, where it comes first: back) comes before that, which then
// stands and cuts the body with its own 504 or 408. A body that holds a
// slot has a known length (lendFor): its read resumes where the timeout
// left it: on a socket, a wait or a read that found nothing consumed
// nothing; fasthttp's reader (a bufio.Reader, the length counted in its
// stream) keeps its place; under TLS, crypto/tls keeps a partly read
// record for the next read and does not take a timeout (a temporary
// net.Error) for the connection's end (TestSlotGivenBackWhenTheBodyPauses
// resumes after such a timeout mid-record). A chunked body's would not:
// a read that blocks in fasthttp's chunk parser and times out may lose
// its place in a chunk's size line or in the CRLF after its data
// (parseChunkSize and readCrLf consume what they read before the error),
// which is why such a body is lent no slot while it arrives.
func (b *bodyReader) arm() {
	if b.conn == nil {
		return
	}
	if b.back.IsZero() {
		b.back = b.t.deadline // the request's (bound), or the read timeout's where it comes first
		if b.back.IsZero() {  // no deadline of the request's: fasthttp's read timeout, as it set it
			b.back = readDeadline(b.conn, time.Now(), b.s.readTimeout())
		}
	}
	by := time.Now().Add(slotIdle)
	if !by.Before(b.back) {
		if b.armed {
			b.armed = false
			b.conn.SetReadDeadline(b.back)
		}
		return
	}
	b.armed, b.armedAt, b.due = true, b.read, by
	b.conn.SetReadDeadline(by)
}

// fresh sets the slot's deadline (arm) anew where it passed while the
// server, not the client, kept the body waiting (for room in the body
// budget, for its I/O turn): only the client's silence gives a slot back,
// and a deadline already passed would fail the next read at once, bytes
// waiting or not. Before each read past the pre-read and as its turn
// comes: one clock read each while a slot is held.
func (b *bodyReader) fresh() {
	if b.armed && !time.Now().Before(b.due) {
		b.arm()
	}
}

// idled is what ends a read that the slot's deadline cut (arm): nil where
// the body brought bytes since it was set, which is set again (or the
// request's deadline alone where that comes first), and the read is tried
// again; errSlotIdle where none came, and the slot is given back.
func (b *bodyReader) idled() error {
	if b.read > b.armedAt {
		b.arm()
		return nil
	}
	return errSlotIdle
}

// giveBack gives back the slot of a body that paused (errSlotIdle): what
// came of it so far (dst, in the slot) is copied into ordinary memory,
// the pooled exchange's (spare), grown as the copy path grows it as more
// comes, never to what the Content-Length announces (a client that sends
// a little and pauses must not make the server allocate what it
// announced); its budget was taken as it came. The slot is released at
// once: no worker has it, the run comes once the body is read. The
// request goes on as one that found no slot (slotLend: asked, land nil)
// under the deadline its reads had before (back), and is never lent one
// again: a client that paused may pause again, and a slot lent each time
// it resumed would be held for slotIdle at every pause. What the body
// copied into the slot (the slot path's count: the pre-read, and what
// was read before it was lent) and out of it is its copied bytes
// (slotLend.copied; invokeRaw).
func (b *bodyReader) giveBack(dst []byte) []byte {
	sl := b.sl
	body := append(b.spare[:0], dst...)
	sl.copied += int64(min(len(dst), sl.pre) + len(dst))
	land := sl.land
	sl.land, b.sl = nil, nil
	b.landed = false
	b.t.fl.Landed(-1)
	b.armed = false
	b.conn.SetReadDeadline(b.back)
	land.Release()
	return body
}

// cut is err, the error of a read past the pre-read, as the deadline's
// 504 where the request's deadline bounds the read (bound) and cut it:
// the read timeout's 408 otherwise. Every such read maps its error here,
// so that none that the deadline cut is taken for the read timeout.
func (b *bodyReader) cut(err error) error {
	if b.bounded && timedOut(err) {
		return errdefs.New(errdefs.KindTimeout, err, "the request's deadline (X-Plover-Timeout-Ms, or the server's --timeout) passed while its body was still arriving, after %d bytes", b.read)
	}
	return err
}

// bound sets the request's deadline on the connection before its first
// read past what fasthttp read with the headers: the read timeout
// fasthttp set bounds those reads otherwise, and a body that stops (at
// the pre-read's end, in a chunk, under TLS) would wait for it, holding
// its budget and, in turn, its I/O turn. Where the read timeout comes
// first (readOut) fasthttp's deadline stands. fasthttp sets the
// connection's deadline anew for its next request, and a body cut here
// closes the connection (readBody), its unread bytes no request.
func (b *bodyReader) bound() {
	if b.bounded || b.t.readOut > 0 || b.t.deadline.IsZero() || b.conn == nil {
		return
	}
	b.bounded = true
	b.conn.SetReadDeadline(b.t.deadline)
}

// readPast is a read past the pre-read: straight from the stream without
// turns; with them, first a read that drains fasthttp's buffer, then each
// a piece in turn.
func (b *bodyReader) readPast(p []byte) (int, error) {
	switch {
	case b.t.fl == nil:
		return b.r.Read(p)
	case !b.drained && !b.chunked:
		// At most a buffer's worth: what the buffer holds, or, empty,
		// a read straight from the socket that leaves it empty.
		b.drained = true
		return b.r.Read(p[:min(len(p), readBuffer)])
	case !b.chunked: // a chunked body may wait in fasthttp's buffer: no socket to wait on
		if err := ioshare.WaitReadable(b.conn); err != nil {
			return 0, err
		}
	}
	return b.t.move(b.chunked || !ioshare.Waitable(b.conn), func(piece int) (int, error) {
		b.fresh()
		return b.r.Read(p[:min(len(p), piece)])
	})
}

func (b *bodyReader) count(n int, err error) (int, error) {
	b.read += n
	return n, err
}

// readAll appends the body to dst, growing it (doubling) as bytes arrive,
// never beyond the announced length (-1: chunked, unknown).
func (b *bodyReader) readAll(dst []byte, limit, announced int) ([]byte, error) {
	budget := b.s.opts.BodyBudget != nil
	win := readWindow
	for {
		if announced >= 0 && len(dst) == announced {
			return dst, nil
		}
		if len(dst) == cap(dst) && announced < 0 && len(dst) >= limit {
			// Full at the limit, the length unknown: one byte tells the
			// body's end from one too long, where growing would double
			// the memory of a body that fits.
			return b.atLimit(dst)
		}
		// Never room for more than one byte past the limit: a body for a
		// function with small inputs holds no more of the budget (or of
		// memory) than the function's bound, however slowly it comes.
		room := limit + 1 - len(dst)
		if announced >= 0 {
			room = announced - len(dst)
		}
		// A read of less than fasthttp's read buffer, and less than the
		// rest of a body of known length, would let its buffer read ahead
		// and keep body bytes that no socket wait would then see
		// (readPiece): grow first. A chunked body waits on no socket, and
		// grows only when full.
		switch {
		case announced >= 0 && cap(dst)-len(dst) < min(readBuffer, room):
			dst = slices.Grow(dst, min(max(cap(dst), readBuffer), room))
		case len(dst) == cap(dst):
			dst = slices.Grow(dst, min(max(cap(dst), readBuffer), room))
		}
		end := min(cap(dst), len(dst)+win, len(dst)+room)
		if b.lend != nil && b.read >= b.pre {
			// The read that lends the slot (below): what it brings is
			// copied into the slot, so a buffer's worth at most.
			end = min(end, len(dst)+readBuffer)
		}
		if m := b.s.opts.BodyBudget; budget && m.Max() > 0 {
			end = min(end, len(dst)+int(m.Max())) // room may come, a window at a time
		}
		window := int64(end - len(dst))
		if budget {
			if err := b.hold(int64(len(dst)) + window); err != nil {
				return nil, err
			}
		}
		n, err := b.readPiece(dst[len(dst):end])
		dst = dst[:len(dst)+n]
		if err == errSlotIdle {
			dst, err = b.giveBack(dst), nil
		}
		if b.lend != nil && n > 0 && b.read > b.pre {
			// The body is arriving past what came with the headers: its
			// slot is lent now, and the rest read into it.
			dst, b.lend = b.lent(b.lend, dst, announced), nil
		}
		if int64(n) == window && win < maxReadWindow && len(dst) >= maxReadWindow/4 {
			win *= 2 // a large body whose bytes were waiting: read more at once
		}
		if budget { // keep only what arrived
			b.holdOnly(int64(len(dst)))
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

// atLimit is dst if the body ends here, errTooLarge if a byte follows.
// Its read is past the pre-read (a chunked body has none), bounded by the
// request's deadline as readPiece's are.
func (b *bodyReader) atLimit(dst []byte) ([]byte, error) {
	var one [1]byte
	b.bound()
	for {
		n, err := b.r.Read(one[:])
		switch {
		case n > 0:
			return nil, errTooLarge
		case err == io.EOF:
			return dst, nil
		case err != nil:
			return nil, b.cut(err)
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
// request on the connection. The close lingers (netguard.Linger), so that
// a client still sending the body reads the answer rather than a reset.
func closeIfUnread(ctx *fasthttp.RequestCtx) {
	if read, _ := ctx.UserValue(bodyReadKey{}).(bool); !read {
		leaveBody(ctx)
	}
}

// leaveBody leaves ctx's request body, if it has one, unread: its
// connection is closed after the response (closeIfUnread), and reports
// whether there was one.
func leaveBody(ctx *fasthttp.RequestCtx) bool {
	if ctx.Request.Header.ContentLength() == 0 || ctx.RequestBodyStream() == nil {
		return false
	}
	ctx.SetConnectionClose()
	netguard.Linger(ctx.Conn())
	return true
}

// timedOut reports a read that ended at the connection's deadline.
func timedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}
