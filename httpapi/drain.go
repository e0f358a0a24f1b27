package httpapi

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/plover-run/plover/netguard"
)

// connSet follows a fasthttp server's connections for its drain.
// fasthttp's Shutdown waits for every connection that is not idle after a
// request, and it counts one as busy from its accept on: a connection
// opened and left silent (a browser's preconnect, a balancer's pool, a
// client that never finishes its TLS handshake) held a shutdown until the
// read timeout, past any grace, as if a request still ran. The drain ends
// the connections that wait for a request, no byte of one come, and tells
// a grace that ran out with requests in handlers from one that ran out on
// connections alone.
type connSet struct {
	conns sync.Map // *drainConn -> struct{}
	// handlers counts the requests in a handler now; answers the answers
	// from a worker's slot written after their handler returned
	// (answerBody), until closed: the slot is read until then.
	handlers, answers atomic.Int64
	// draining: every answer closes its connection (Connection: close).
	// fasthttp's CloseOnShutdown does so only until its Shutdown's
	// context ends, and the answers written after it (requests refused at
	// the end of the grace as not started) kept theirs open.
	draining atomic.Bool
	// mu orders a drain's cut with a handler starting on a cut
	// connection: the handler's read deadline must be the last set.
	mu sync.Mutex
	// readTimeout is the deadline a request's reads have from its start.
	readTimeout time.Duration
	// expect holds the requests that expect 100-continue, over those
	// whose Content-Length is over maxBody, --max-body (continue.go).
	expect, over headerSet
	maxBody      int
	// byHeader maps a connection's request header to the connection, for
	// HeaderReceived, which sees only the header (continue.go).
	byHeader sync.Map
	// panicked records a panic in what fasthttp calls of the listener
	// and the connections outside a handler, recovering nothing, and
	// closes c unless c is nil: Server.connPanicked, set by New for both
	// of a server's sets. A set without it (an internal test's) turns a
	// recovered panic into a nil func's.
	panicked func(c net.Conn, v any)
}

// A connection's state: waiting for a request (no byte of one read, none
// in a handler, no answer being written), reading one, busy with one (in
// its handler or writing its answer), or cut by the drain (its reads end
// at once; a request not yet whole is answered 503).
const (
	connWaiting int32 = iota
	connReading
	connBusy
	connCut
)

// closeWait is how long a drain whose grace ran out waits, once it closed
// the connections left, for the handlers blocked on them to return.
const closeWait = time.Second

// longAgo is a read deadline already past.
var longAgo = time.Unix(1, 0)

// listener wraps ln so that cs follows its connections. A panic in ln's
// Accept (netguard's, the TLS listener's, and what is under them) is
// recorded and accepting goes on (netguard.Recovered); drainListener's
// own Accept, outside that recovery, has nothing that panics.
func (cs *connSet) listener(ln net.Listener) net.Listener {
	return drainListener{netguard.Recovered(ln, func(v any) { cs.panicked(nil, v) }), cs}
}

type drainListener struct {
	net.Listener
	cs *connSet
}

// Accept wraps the connection in a type that keeps what the server looks
// for in it: the TLS connection's methods under TLS (fasthttp's IsTLS;
// NetConn for the socket under it), else the socket (syscall.Conn).
func (l drainListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	d := &drainConn{Conn: c, cs: l.cs}
	l.cs.conns.Store(d, struct{}{})
	if tc, ok := c.(*tls.Conn); ok {
		return drainTLS{d, tc}, nil
	}
	if _, ok := c.(syscall.Conn); ok {
		return drainSys{d}, nil
	}
	return d, nil
}

// drainConn is a connection of a connSet.
type drainConn struct {
	net.Conn
	cs     *connSet
	state  atomic.Int32
	owe100 atomic.Bool // a 100 Continue, said before the next read (continue.go)
	// reads counts Reads; ended is reads when the last handler returned:
	// equal, the request came from fasthttp's buffer, pipelined, with the
	// last answer perhaps still unflushed (continue.go).
	reads, ended atomic.Uint64
	// ctx is the context fasthttp reads this connection's requests into
	// (one context serves a connection); its header is c's key in
	// connSet.byHeader.
	ctx atomic.Pointer[fasthttp.RequestCtx]
	// readPanicked: a read outside a handler panicked (Read).
	readPanicked atomic.Bool
	// readBy is the read deadline last set (SetReadDeadline), in Unix
	// nanoseconds; 0: none set yet, noReadDeadline: none. fasthttp sets
	// the read timeout before a request's headers, which the handler does
	// not see: a body's reads are bounded by it (readDeadline).
	readBy atomic.Int64
}

// noReadDeadline is readBy for a deadline cleared.
const noReadDeadline = math.MaxInt64

// SetReadDeadline records t for readDeadline, then sets it.
func (c *drainConn) SetReadDeadline(t time.Time) error {
	c.readBy.Store(deadlineNs(t))
	return c.Conn.SetReadDeadline(t)
}

// SetDeadline records t as SetReadDeadline does.
func (c *drainConn) SetDeadline(t time.Time) error {
	c.readBy.Store(deadlineNs(t))
	return c.Conn.SetDeadline(t)
}

func deadlineNs(t time.Time) int64 {
	if t.IsZero() {
		return noReadDeadline
	}
	return max(t.UnixNano(), 1) // 0 is "none set yet"
}

// readDeadline is when c's reads end by the read deadline set on it:
// fasthttp's read timeout, from before the request's headers (from the
// connection's start for its first request) when it set one, else the
// read timeout from began, the request's start after its headers (a
// connection Serve did not accept: an in-process benchmark's).
func readDeadline(c net.Conn, began time.Time, readTimeout time.Duration) time.Time {
	if d := drainOf(c); d != nil {
		if ns := d.readBy.Load(); ns != 0 {
			return time.Unix(0, ns)
		}
	}
	return began.Add(readTimeout)
}

// errReadPanicked is every read's error once one outside a handler
// panicked.
var errReadPanicked = errors.New("httpapi: reading the connection panicked (logged as request panicked)")

// Read marks the connection reading a request once a byte of it comes.
// Outside a handler (fasthttp reading a request's headers, or what it
// reads of a body before the handler), a panic in it is recovered, for
// nothing else would, and recorded. The connection is not closed at once:
// fasthttp may still buffer the answer of a request pipelined before; it
// answers the read's error (errorRecovered: 500), flushing both, and
// closes it; but not for a kept-alive connection's next request not a
// byte of which fasthttp had: it takes that for an idle close and closes
// the connection unanswered. In a handler, the handler's recovery answers
// it, knowing its route.
func (c *drainConn) Read(b []byte) (n int, err error) {
	defer func() {
		if c.state.Load() != connBusy {
			if v := recover(); v != nil {
				c.cs.panicked(nil, v)
				c.readPanicked.Store(true)
				n, err = 0, errReadPanicked
			}
		}
	}()
	if c.readPanicked.Load() {
		return 0, errReadPanicked
	}
	if c.owe100.Load() {
		if err := c.sayContinue(); err != nil {
			return 0, err
		}
	}
	c.reads.Add(1)
	n, err = c.Conn.Read(b)
	if n > 0 {
		switch c.state.Load() { // a load: most reads find it reading or busy
		case connWaiting:
			c.state.CompareAndSwap(connWaiting, connReading)
		case connCut:
			c.uncut()
		}
	}
	return n, err
}

// uncut serves the request whose first bytes a read took as the drain cut
// its connection: the cut's peek found the socket empty, the bytes just
// read, so it took the connection for one waiting. A read under a cut
// already made takes nothing (its deadline is past), so these bytes had
// come by the cut, and the request is served, as one whose bytes were
// still in the socket is; else its next read ended at the cut's deadline
// and it was answered 503. Under TLS the bytes may be plaintext the TLS
// connection held from before: they had come too.
func (c *drainConn) uncut() {
	c.cs.mu.Lock()
	defer c.cs.mu.Unlock()
	if !c.state.CompareAndSwap(connCut, connReading) {
		return
	}
	by := time.Now().Add(c.cs.readTimeout) // fasthttp set none: bounded all the same
	if ns := c.readBy.Load(); ns != 0 && ns != noReadDeadline {
		by = time.Unix(0, ns) // fasthttp's own, which the cut did not record
	}
	c.Conn.SetReadDeadline(by)
}

// Close closes the connection. A panic in the listener's connection under
// it (netguard's: its slot given back, a lingering close) is recovered:
// fasthttp, which closes it once done with it, recovers nothing. The
// close is tried once more, for a panic before the socket was closed, its
// descriptor else held for good (netguard's second Close closes the
// socket alone).
func (c *drainConn) Close() (err error) {
	defer func() {
		if v := recover(); v != nil {
			c.cs.panicked(nil, v)
			err = c.closeAgain()
		}
	}()
	return c.Conn.Close()
}

// closeAgain is Close's second try, a panic in it dropped: the first is
// recorded. A TLS connection's socket is closed under it: a TLS
// connection closed once returns at once from a second Close, the socket
// untouched.
func (c *drainConn) closeAgain() (err error) {
	defer func() {
		if recover() != nil {
			err = net.ErrClosed
		}
	}()
	if tc, ok := c.Conn.(*tls.Conn); ok {
		tc.NetConn().Close()
	} else {
		c.Conn.Close()
	}
	return net.ErrClosed
}

// NetConn returns the connection as accepted (netguard.Linger, connGone).
func (c *drainConn) NetConn() net.Conn { return c.Conn }

// ReadFrom forwards to the socket's io.ReaderFrom (sendfile); TLS has none.
func (c drainSys) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{c.Conn}, r)
}

func (c *drainConn) drain() *drainConn { return c }

type drainSys struct{ *drainConn }

func (c drainSys) SyscallConn() (syscall.RawConn, error) {
	return c.Conn.(syscall.Conn).SyscallConn()
}

type drainTLS struct {
	*drainConn
	tc *tls.Conn
}

// Handshake recovers a panic in the handshake's reads (the socket's, and
// the TLS config's callbacks: GetCertificate) as Read does: fasthttp
// calls it directly, outside Read, recovering nothing.
func (c drainTLS) Handshake() (err error) {
	defer func() {
		if v := recover(); v != nil {
			c.cs.panicked(c.drainConn, v)
			err = net.ErrClosed
		}
	}()
	return c.tc.Handshake()
}

func (c drainTLS) ConnectionState() tls.ConnectionState { return c.tc.ConnectionState() }

// drainOf is c's drainConn, or nil for a connection Serve did not accept
// (an in-process benchmark's).
func drainOf(c net.Conn) *drainConn {
	if d, ok := c.(interface{ drain() *drainConn }); ok {
		return d.drain()
	}
	return nil
}

// state is the server's ConnState hook.
func (cs *connSet) state(c net.Conn, st fasthttp.ConnState) {
	d := drainOf(c)
	if d == nil {
		return
	}
	switch st {
	case fasthttp.StateIdle: // the answer is written
		d.state.CompareAndSwap(connBusy, connWaiting)
	case fasthttp.StateClosed, fasthttp.StateHijacked:
		cs.conns.Delete(d)
		if ctx := d.ctx.Load(); ctx != nil {
			// Only if still d's: fasthttp may have given the context
			// to a new connection already.
			cs.byHeader.CompareAndDelete(&ctx.Request.Header, d)
		}
	}
}

// handle wraps h to mark its connection busy while it runs and until its
// answer is written.
func (cs *connSet) handle(h fasthttp.RequestHandler) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		cs.handlers.Add(1)
		defer cs.handlers.Add(-1)
		if d := drainOf(ctx.Conn()); d != nil && !d.state.CompareAndSwap(connReading, connBusy) &&
			!d.state.CompareAndSwap(connWaiting, connBusy) && d.state.Load() == connCut {
			// The whole request came as the drain cut its connection
			// (pipelined behind the last): it is served, its reads
			// given back their time.
			cs.mu.Lock()
			d.state.Store(connBusy)
			ctx.Conn().SetReadDeadline(time.Now().Add(cs.readTimeout))
			cs.mu.Unlock()
		}
		if cs.expect.n.Load() > 0 && cs.expecting(ctx) {
			defer answered(ctx)
		}
		if cs.over.n.Load() > 0 {
			cs.unhold(ctx)
		}
		if d := drainOf(ctx.Conn()); d != nil {
			if d.ctx.Load() != ctx {
				d.ctx.Store(ctx)
				cs.byHeader.Store(&ctx.Request.Header, d)
			}
			defer func() { d.ended.Store(d.reads.Load()) }()
		}
		h(ctx)
		if cs.draining.Load() {
			ctx.SetConnectionClose()
		}
	}
}

// cutWaiting ends the reads of the connections that wait for a request.
// Run again until the server is down: fasthttp sets a new connection's
// read deadline as it starts to read, over a cut made just before. A
// connection whose request's first bytes had come before the cut, not
// yet read by its goroutine (just accepted, or not yet scheduled), is
// reading one: it is served, as it would have been a moment earlier.
func (cs *connSet) cutWaiting() {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.conns.Range(func(k, _ any) bool {
		d := k.(*drainConn)
		if d.state.Load() == connWaiting && peek(d.Conn) == peekBytes {
			d.state.CompareAndSwap(connWaiting, connReading)
		}
		if d.state.CompareAndSwap(connWaiting, connCut) || d.state.Load() == connCut {
			// Not recorded in readBy: uncut gives fasthttp's back.
			d.Conn.SetReadDeadline(longAgo)
		}
		return true
	})
}

// closeAll closes every connection left: a client that does not read its
// answer, or sends its request a byte at a time, holds its connection
// past the grace. A TLS connection's socket is closed under it: closing
// the TLS connection sends a close_notify first, under a 5 s write
// deadline, which a client not reading its answer makes the drain wait
// for, connection after connection.
func (cs *connSet) closeAll() {
	cs.conns.Range(func(k, _ any) bool {
		d := k.(*drainConn)
		if tc, ok := d.Conn.(*tls.Conn); ok {
			tc.NetConn().Close()
		} else {
			d.Close()
		}
		return true
	})
}

// shutdown stops srv within ctx: it stops accepting, cuts the
// connections that wait for a request, lets the requests come and in
// handlers finish and, when ctx ends first, closes what is left. When
// ctx's deadline passed (the grace is over, not a stop at once) it calls
// refuse first, which fails the requests that have not started to run
// (nil: none), and when that says requests are in flight it gives their
// answers up to closeWait to be written. It returns ctx's error only when
// requests were still in handlers.
func (cs *connSet) shutdown(ctx context.Context, srv *fasthttp.Server, refuse func() bool) error {
	// From the start: the requests may be refused by another transport's
	// drain (gRPC's), at the same moment as this one's grace ends.
	cs.draining.Store(true)
	done := make(chan error, 1)
	go func() { done <- srv.ShutdownWithContext(ctx) }()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		cs.cutWaiting()
		select {
		case err := <-done:
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				return err
			}
			// One wait, for the answers and then for the handlers, so
			// that the exit comes as soon after the grace as before.
			end := time.Now().Add(closeWait)
			if refuse != nil && errors.Is(err, context.DeadlineExceeded) && refuse() {
				cs.awaitAnswers(end)
			}
			cs.closeAll()
			// A handler blocked on its connection, or an answer being
			// written from a slot (a client not reading it), ends once
			// it is closed: the node closes its workers only after.
			for ; cs.handlers.Load() > 0 || cs.answers.Load() > 0; time.Sleep(10 * time.Millisecond) {
				if time.Now().After(end) {
					return err
				}
			}
			return nil
		case <-tick.C:
		}
	}
}

// awaitAnswers waits until end, or until no connection is busy with a
// request: the answers of the requests refused at the end of the grace
// (503s) are written meanwhile, each connection closed after its answer
// (draining), where closeAll would have cut them bare. A request still
// running holds its connection until end.
func (cs *connSet) awaitAnswers(end time.Time) {
	for time.Now().Before(end) && cs.busy() {
		cs.cutWaiting()
		time.Sleep(10 * time.Millisecond)
	}
}

// busy reports whether a connection is busy with a request: in its
// handler, or writing its answer.
func (cs *connSet) busy() bool {
	found := false
	cs.conns.Range(func(k, _ any) bool {
		found = k.(*drainConn).state.Load() == connBusy
		return !found
	})
	return found
}

// callCtx is the context of the calls a request makes to the control
// plane: the request's values, and no end. fasthttp's request context
// ends every request's at once as Shutdown begins, so that a deploy,
// rollback or delete the drain was to finish failed with "context
// canceled"; and once Shutdown is over its Done turns nil after it was
// closed, which a context derived from it panics on.
func callCtx(ctx *fasthttp.RequestCtx) context.Context { return context.WithoutCancel(ctx) }
