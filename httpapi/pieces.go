package httpapi

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/plover-run/plover/apierr"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/gate"
	"github.com/plover-run/plover/ioshare"
	"github.com/plover-run/plover/sched"
)

// A request's bytes move in its function's turns (package ioshare): its
// body past what fasthttp read with the headers, and an answer of more than
// bigAnswer bytes, a piece at a time, each piece waited for holding no
// turn (its socket readable, or with room) and then moved at once in the
// turn. Small bodies and answers move as they come: they cost less than a
// turn's bookkeeping would save.

// bigAnswer is the smallest answer written a piece at a time.
const bigAnswer = 64 << 10

// turns is what moving a request's bytes in turn needs: its function's
// flow (nil: they move as they come), and the request's deadline and
// client check while it waits.
type turns struct {
	fl       *ioshare.Flow
	deadline time.Time
	gone     func() bool
	readOut  time.Duration // not 0: deadline is the read timeout's (this long), waiting past it a 408
	writeOut bool          // deadline is the write timeout's (an answer's)
}

// turnsOf is the turns of r, a request to name begun at the door on
// ctx: a name the node has no record of has none (its request fails
// before its body matters). A body must arrive within the read timeout,
// its turns' waits included. The read timeout runs from where fasthttp
// set it, before the headers: measured from r.Began, after them, a
// deadline after the read timeout's real end but before Began's would
// have pushed it back (bound), and made its 408 a 504.
func (s *Server) turnsOf(ctx *fasthttp.RequestCtx, name string, r *call.Request) turns {
	t := turns{fl: s.door.IO(name), deadline: r.Deadline, gone: r.Gone}
	if rt := readDeadline(ctx.Conn(), r.Began, s.readTimeout()); rt.Before(r.Deadline) {
		t.deadline, t.readOut = rt, s.readTimeout()
	}
	t.fl.Touch(r.Began) // a light function's small request is about too
	return t
}

// turn waits for the request's turn to move a piece; mayBlock: see
// ioshare.Flow.Turn.
func (t turns) turn(mayBlock bool) (ioshare.Turn, error) {
	tn, err := t.fl.Turn(context.Background(), t.deadline, t.gone, mayBlock)
	switch {
	case errors.Is(err, sched.ErrDeadline):
		return tn, t.late("its turns (its function's share of the server's I/O)")
	case errors.Is(err, sched.ErrGone):
		return tn, errdefs.New(errdefs.KindGone, nil, "%sthe client went away while the request's bytes waited for their turn", t.function())
	}
	return tn, err
}

// late is the error of a wait for what that t's deadline ended: the read
// timeout's 408 where that came first, the write timeout's for an answer
// (for the log: its status is out), else the request's deadline's 504.
func (t turns) late(what string) error {
	fn := t.function()
	switch {
	case t.readOut > 0:
		return &apierr.Error{Status: apierr.RequestTimeout,
			Msg: fn + "the request body did not arrive within the server's read timeout of " + t.readOut.String() + ", its wait for " + what + " included"}
	case t.writeOut:
		return errdefs.New(errdefs.KindTimeout, nil, "%sthe answer was not written within the server's write timeout, its wait for %s included", fn, what)
	}
	return errdefs.New(errdefs.KindTimeout, nil, "%sthe request's deadline (X-Plover-Timeout-Ms, or the server's --timeout) passed while its bytes waited for %s", fn, what)
}

// function names t's function for a message ("" without a flow): the
// flow's own string, no request bytes.
func (t turns) function() string {
	if t.fl == nil {
		return ""
	}
	return "function " + t.fl.Name() + ": "
}

// move moves one piece in the request's turn (turn): move is given the
// most bytes the turn moves and returns how many it moved. The turn ends
// in a defer: a panic in move (recovered by the transport) must not leave
// the server's thread at the function's CPU weight and locked to its
// goroutine, fasthttp's, which goes on to serve every tenant's requests,
// nor the turn counted as moving.
func (t turns) move(mayBlock bool, move func(piece int) (int, error)) (int, error) {
	tn, err := t.turn(mayBlock)
	if err != nil {
		return 0, err
	}
	n := -1
	defer func() { tn.DoneMoved(n) }()
	n, err = move(tn.Piece())
	return n, err
}

// answerBody is a response of more than bigAnswer bytes (or one in a
// slot: land), written once fasthttp writes the response: a piece at a
// time in its function's turns when it has a flow, from the slot its
// output is in when it has one (released once written or dropped).
type answerBody struct {
	land call.Landing
	b    []byte
	t    turns
	conn net.Conn
	s    *Server
	ctx  *fasthttp.RequestCtx // its request, for a panic's log line
	// tk is its request's place in its token's concurrency, handed over
	// as the handler returns (holdTicket) and given back as the last
	// piece starts (letGo): given back with the handler's return, a token
	// of concurrency 1 had any number of large answers being written to
	// clients that read them slowly, each holding its bytes. Not after the
	// last piece: a client calling one at a time, its next request sent
	// on another connection as the answer's end arrives, must find the
	// place free.
	tk gate.Ticket
}

// holdTicket gives tk to the answer ctx's response is, if it is one
// written after the handler returns (answer), to give back once written;
// else it gives tk back now.
func holdTicket(ctx *fasthttp.RequestCtx, tk gate.Ticket) {
	if ctx.Response.IsBodyStream() {
		if ab, ok := ctx.Response.BodyStream().(*answerBody); ok {
			ab.tk = tk
			return
		}
	}
	tk.Done()
}

// letGo gives the answer's ticket back, once.
func (ab *answerBody) letGo() {
	ab.tk.Done()
	ab.tk = gate.Ticket{}
}

var answerBodies = sync.Pool{New: func() any { return new(answerBody) }}

// answer makes ctx's response b, released with land once written. Its
// turns wait until the write timeout, not the request's deadline: the
// answer is made, and is owed to the client.
func (s *Server) answer(ctx *fasthttp.RequestCtx, b []byte, land call.Landing, t turns) {
	ab := answerBodies.Get().(*answerBody)
	ab.land, ab.b, ab.conn, ab.s, ab.ctx = land, b, ctx.Conn(), s, ctx
	if land != nil {
		s.conns.answers.Add(1) // until Close: the drain waits for the slot's release
	}
	if t.fl != nil {
		ab.t = turns{fl: t.fl, deadline: time.Now().Add(s.srv.WriteTimeout), writeOut: true}
	}
	ctx.Response.SetBodyStream(ab, len(b))
}

// pieceAnswer turns a response fasthttp holds in memory, when it is large,
// into an answer written after the handler returns: in its request's
// turns where it has them, and in any case holding its token's place until
// its last piece (a name's first request on a node has no turns yet).
func (s *Server) pieceAnswer(ctx *fasthttp.RequestCtx, t turns) {
	// IsBodyStream first: Body() would read a stream to its end.
	if ctx.Response.IsBodyStream() || len(ctx.Response.Body()) < bigAnswer {
		return
	}
	s.answer(ctx, ctx.Response.SwapBody(nil), nil, t)
}

// Read serves a writer that does not take WriteTo (none of fasthttp's).
func (ab *answerBody) Read(p []byte) (int, error) {
	if len(ab.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, ab.b)
	ab.b = ab.b[n:]
	return n, nil
}

// WriteTo writes the answer to the connection's buffered writer w. Without
// turns (or a small answer, or a writer that is not the connection's) in
// one call: past w's buffer, bufio writes straight from the bytes to the
// socket. With them, a piece at a time: where the socket can be waited on,
// each piece once it has room and in one non-blocking write in turn; under
// TLS through w, in turn. A panic here is recovered as a handler's is
// (fasthttp's own recovery made it a debug line, uncounted): the status
// is out, so the connection is cut.
func (ab *answerBody) WriteTo(w io.Writer) (written int64, err error) {
	defer func() {
		if v := recover(); v != nil {
			ab.s.cut(ab.ctx, ab.conn, v)
			err = errAnswerCut
		}
	}()
	return ab.write(w)
}

// errAnswerCut ends the write of an answer whose writer panicked.
var errAnswerCut = errors.New("httpapi: the answer's writer panicked (logged as request panicked); its connection is closed")

// write is WriteTo's.
func (ab *answerBody) write(w io.Writer) (int64, error) {
	bw, ok := w.(*bufio.Writer) // fasthttp's, over the connection
	if ab.t.fl == nil || len(ab.b) < bigAnswer || !ok {
		// In two writes where it is large (a name's first request on a
		// node has no flow yet): the ticket is let go before the last.
		var n1 int
		if len(ab.b) > bigAnswer {
			var err error
			if n1, err = w.Write(ab.b[:len(ab.b)-bigAnswer]); err != nil {
				ab.b = ab.b[n1:]
				return int64(n1), err
			}
			ab.b = ab.b[n1:]
		}
		ab.letGo()
		n, err := w.Write(ab.b)
		ab.b = ab.b[n:]
		return int64(n1 + n), err
	}
	raw := ioshare.Waitable(ab.conn)
	if raw {
		if err := bw.Flush(); err != nil { // the headers, ahead of the pieces
			return 0, err
		}
	}
	var total int64
	for stalled := false; len(ab.b) > 0; {
		if raw {
			if err := ioshare.WaitWritableAfter(ab.conn, stalled); err != nil {
				return total, err
			}
		}
		n, err := ab.t.move(!raw, func(max int) (n int, err error) {
			piece := ab.b[:min(len(ab.b), max)]
			if len(piece) == len(ab.b) {
				ab.letGo()
			}
			if raw {
				return ioshare.WriteSome(ab.conn, piece)
			}
			if n, err = bw.Write(piece); err == nil {
				err = bw.Flush()
			}
			return n, err
		})
		ab.b = ab.b[n:]
		total += int64(n)
		if err != nil {
			return total, err
		}
		stalled = n == 0
	}
	return total, nil
}

// Close releases the slot, if any, and the ticket: the response is out
// (or will never be).
func (ab *answerBody) Close() error {
	ab.letGo()
	if ab.land != nil {
		defer ab.s.conns.answers.Add(-1) // after the release: the slot is given back (ab.s read now)
	}
	if ab.land != nil && !ab.release() {
		return nil // not pooled: its state is the panic's
	}
	*ab = answerBody{}
	answerBodies.Put(ab)
	return nil
}

// release releases the slot, and reports whether that did not panic. A
// panic there (a bug in giving the worker's slot back) is recorded as a
// request's: fasthttp calls Close outside the handler, once it wrote the
// answer (its recovery made the panic an error, the answer left
// unflushed, and the context's reset closed the body again, unrecovered:
// the process ended) or as it resets the context. The answer, written,
// goes out.
func (ab *answerBody) release() (ok bool) {
	defer func() {
		if v := recover(); v != nil {
			ab.s.cut(ab.ctx, nil, v)
		}
	}()
	ab.land.Release()
	return true
}
