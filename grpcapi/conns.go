package grpcapi

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/plover-run/plover/ioshare"
)

// A gRPC connection's bytes move in a function's I/O turns (package
// ioshare), as an HTTP request's body and answer do, once the connection
// has carried a large call (bigMessage or more) to that function, until a
// call to another function moves it (a large one to that function's
// turns, a small one out of any): its reads and writes are pieces of the
// flow it is in, each
// waited for holding no turn (the socket readable, or with room) and then
// moved in a turn at the function's CPU weight. gRPC-Go reads and writes a
// connection's frames itself, for every call on it at once, so the
// connection, not the call, is what can wait its turn: a connection that
// carries calls to several functions (a gateway's) moves them in the turns
// of the function of its last call, where that was large. A connection
// that has carried only small calls moves its bytes as they come: they
// cost less than a turn's bookkeeping would save. A reader alone on the
// server's I/O (ioshare.Turn.Alone) takes a whole piece in its turn and
// gives it to gRPC-Go's next reads without one, so that alone a flow
// reads at full speed.

// smallWrite is the largest write moved as it comes on a connection in
// turns: gRPC-Go's control frames (settings, pings, window updates,
// headers), which every call on the connection waits for.
const smallWrite = 4 << 10

// conns follows a gRPC listener's connections by their peer's address, for
// the calls on them to name the function whose turns they move in.
type conns struct {
	wait time.Duration // the most a piece waits for its turn before it moves as it comes
	m    sync.Map      // connKey -> *turnConn
	// inTurns counts the connections in a function's turns now: while
	// none is, a small call looks no connection up.
	inTurns atomic.Int64
}

// connKey is a connection's two ends: the peer's address alone may be two
// connections' (one client port to two of the server's addresses).
func connKey(local, remote net.Addr) string { return local.String() + "|" + remote.String() }

// Listener wraps ln so that the calls on its connections can put them in
// their functions' turns. It must be the listener nearest the sockets
// (under TLS and any other wrapper): a piece waits on the socket.
func (s *Server) Listener(ln net.Listener) net.Listener { return &turnListener{ln, &s.conns} }

type turnListener struct {
	net.Listener
	c *conns
}

func (l *turnListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil || !ioshare.Waitable(c) || c.RemoteAddr() == nil {
		return c, err // no socket to wait on: its bytes move as they come
	}
	tc := &turnConn{Conn: c, c: l.c, key: connKey(c.LocalAddr(), c.RemoteAddr())}
	if _, taken := l.c.m.LoadOrStore(tc.key, tc); taken {
		return c, nil // not followed: another connection has its ends (cannot be, but is not mistaken for it)
	}
	return tc, nil
}

// called says a call to fl's function was admitted on the connection
// whose ends are local and remote (the call's peer), large or not: a
// large call puts the connection in fl's turns; a small call to another
// function takes it out of the turns it is in, so that a client's small
// calls do not move in the turns of a function it called once (a batch
// function's, or one it would have pay for them). A nil fl is a call
// refused before it was admitted (an unknown model, a token's refusal, a
// message over the bound): it takes the connection out of its turns too,
// or every refused call after one large call to a function was read in
// that function's turns and charged to it, which README promises no one
// pays.
func (c *conns) called(local, remote net.Addr, fl *ioshare.Flow, large bool) {
	if (fl == nil || !large) && c.inTurns.Load() == 0 {
		return
	}
	tc := c.find(local, remote)
	if tc == nil {
		return
	}
	switch was := tc.fl.Load(); {
	case fl != nil && large && was != fl:
		tc.setFlow(was, fl)
	case (fl == nil || !large) && was != nil && was != fl:
		tc.setFlow(was, nil)
	}
}

// find is the connection whose ends are local and remote, or nil where
// it is not followed.
func (c *conns) find(local, remote net.Addr) *turnConn {
	if local == nil || remote == nil {
		return nil
	}
	if v, ok := c.m.Load(connKey(local, remote)); ok {
		return v.(*turnConn)
	}
	return nil
}

// turnConn is a connection whose bytes move in its function's turns once
// a call put it in them. Read is gRPC-Go's reader's alone; Write may be
// called by more than one of its goroutines, and keeps no state.
type turnConn struct {
	net.Conn
	c      *conns
	key    string
	fl     atomic.Pointer[ioshare.Flow]
	closed atomic.Bool
	// answers is how many answers bounded by the write timeout (written
	// from their slots, or large copies: io.go's hold) the connection's
	// streams may still hold, and collecting whether, closed with some
	// held, the server waits for them (heldSlots).
	answers    atomic.Int32
	collecting atomic.Bool

	// places are those in their tokens' concurrency of the answers held
	// on the connection (hold), given back as it closes, if not before:
	// an answer there will never be written, and what gRPC-Go dropped
	// with it may not be collected for long (an idle stream worker of
	// gRPC-Go's was seen to keep the last stream it ran, and its
	// transport, until it ran another), while its token's own calls,
	// refused before any worker runs them, would wait for it. placesShut
	// says it closed.
	placesMu   sync.Mutex
	places     map[*place]struct{}
	placesShut bool

	ahead []byte // read in an earlier turn, not given yet
	buf   *[]byte
}

// setFlow moves the connection from the turns of was to those of fl (nil:
// none), unless another call moved it meanwhile.
func (t *turnConn) setFlow(was, fl *ioshare.Flow) {
	if !t.fl.CompareAndSwap(was, fl) {
		return
	}
	switch {
	case was == nil && fl != nil:
		t.c.inTurns.Add(1)
	case was != nil && fl == nil:
		t.c.inTurns.Add(-1)
	}
	// close may have taken the connection out of its turns before this
	// call put it back in (it found the connection open): close sets
	// closed before it swaps, so one of the two takes it out again.
	if fl != nil && t.closed.Load() && t.fl.Swap(nil) != nil {
		t.c.inTurns.Add(-1)
	}
}

// flow is the flow the connection's bytes move in now, or nil.
func (t *turnConn) flow() *ioshare.Flow {
	fl := t.fl.Load()
	if fl == nil || fl.Forgotten() {
		return nil
	}
	return fl
}

// turn waits for fl's turn; a turn not had (the wait bounded by
// conns.wait, or the connection closed) moves the piece as it comes, with
// no turn: gRPC-Go ends the whole connection on an error, every call on
// it.
func (t *turnConn) turn(fl *ioshare.Flow) ioshare.Turn {
	tn, err := fl.Turn(context.Background(), time.Now().Add(t.c.wait), t.closed.Load, false)
	if err != nil {
		return ioshare.Turn{}
	}
	return tn
}

var aheadBufs = sync.Pool{New: func() any { return new([]byte) }}

func (t *turnConn) Read(p []byte) (int, error) {
	if len(t.ahead) > 0 {
		n := copy(p, t.ahead)
		if t.ahead = t.ahead[n:]; len(t.ahead) == 0 {
			aheadBufs.Put(t.buf)
			t.ahead, t.buf = nil, nil
		}
		return n, nil
	}
	fl := t.flow()
	if fl == nil || len(p) == 0 {
		return t.Conn.Read(p)
	}
	if err := ioshare.WaitReadable(t.Conn); err != nil {
		return 0, err
	}
	if fl = t.flow(); fl == nil {
		// Taken out of its turns while it waited (a refused call's,
		// or a small one's to another function): the bytes now
		// readable are the next call's.
		return t.Conn.Read(p)
	}
	tn := t.turn(fl)
	defer tn.Done() // a panic must not leave the reader's thread at the function's weight
	piece := tn.Piece()
	switch {
	case piece <= 0: // no turn had: as it comes
		return t.Conn.Read(p)
	case !tn.Alone() || len(p) >= piece:
		return t.Conn.Read(p[:min(len(p), piece)])
	}
	buf := aheadBufs.Get().(*[]byte)
	if cap(*buf) < piece {
		*buf = make([]byte, piece)
	}
	n, err := t.Conn.Read((*buf)[:piece])
	m := copy(p, (*buf)[:n])
	if m < n {
		t.ahead, t.buf = (*buf)[m:n], buf
	} else {
		aheadBufs.Put(buf)
	}
	return m, err
}

func (t *turnConn) Write(p []byte) (int, error) {
	fl := t.flow()
	if fl == nil || len(p) <= smallWrite {
		return t.Conn.Write(p)
	}
	n := 0
	for stalled := false; n < len(p); {
		if err := ioshare.WaitWritableAfter(t.Conn, stalled); err != nil {
			return n, err
		}
		m, err := t.writePiece(fl, p[n:])
		n += m
		if err != nil {
			return n, err
		}
		stalled = m == 0
	}
	return n, nil
}

// writePiece writes what the socket takes of p now, at most a piece, in
// fl's turn (ended in a defer: see Read).
func (t *turnConn) writePiece(fl *ioshare.Flow, p []byte) (int, error) {
	tn := t.turn(fl)
	defer tn.Done()
	piece := tn.Piece()
	if piece <= 0 { // no turn had: as it comes
		return t.Conn.Write(p)
	}
	return ioshare.WriteSome(t.Conn, p[:min(len(p), piece)])
}

func (t *turnConn) Close() error {
	_, err := t.close()
	return err
}

// close closes the connection, giving back the places its answers held;
// first says whether this call did.
func (t *turnConn) close() (first bool, err error) {
	if first = !t.closed.Swap(true); first {
		t.c.m.CompareAndDelete(t.key, t)
		if t.fl.Swap(nil) != nil {
			t.c.inTurns.Add(-1)
		}
		t.placesMu.Lock()
		places := t.places
		t.places, t.placesShut = nil, true
		t.placesMu.Unlock()
		for pl := range places {
			pl.giveBack()
		}
	}
	return first, t.Conn.Close()
}

// holdPlace has the connection give pl back should it close before the
// answer holding pl is given back (letPlace); on a connection closed
// already, now.
func (t *turnConn) holdPlace(pl *place) {
	if pl == nil {
		return
	}
	t.placesMu.Lock()
	if !t.placesShut {
		if t.places == nil {
			t.places = map[*place]struct{}{}
		}
		t.places[pl] = struct{}{}
		t.placesMu.Unlock()
		return
	}
	t.placesMu.Unlock()
	pl.giveBack()
}

// letPlace gives back pl, the place of an answer held on the connection
// and given back (heldSlot.collected).
func (t *turnConn) letPlace(pl *place) {
	if pl == nil {
		return
	}
	t.placesMu.Lock()
	delete(t.places, pl)
	t.placesMu.Unlock()
	pl.giveBack()
}
