// Package netguard keeps a server up against hostile clients: a cap on open
// connections, accept errors that never end the server, and a budget for the
// request bytes held in memory.
//
// A fasthttp (or net/http) server ends its Serve loop on any accept error
// that is not a timeout, so a flood of idle connections that exhausts the
// process's descriptors (accept4: too many open files) takes the whole
// server down. Listener caps the connections open at once and turns the
// resource errors of accept into a retry with back-off. Budget bounds the
// bytes of request bodies a server holds at once, so that requests
// announcing a large Content-Length cannot reserve unbounded memory.
package netguard

import (
	"errors"
	"io"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Back-off between retries of a failed accept: it starts at minBackoff,
// doubles on each consecutive failure up to maxBackoff and starts over after
// an accept succeeds.
const (
	minBackoff = 5 * time.Millisecond
	maxBackoff = time.Second
)

// rejectWriteTimeout bounds writing Listener.Reject to a connection over the
// cap, so that a client that does not read cannot stall Accept. A fresh
// socket's send buffer is empty, so a short canned response is normally
// written at once.
const rejectWriteTimeout = 10 * time.Millisecond

// Listener wraps a net.Listener to keep a server's accept loop alive:
//
//   - At most Max connections are open at once (Max <= 0: no cap). A
//     connection accepted past the cap is closed at once, after writing
//     Reject to it when Reject is not empty (e.g. a canned
//     "HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n\r\n"),
//     under a short write deadline. It is counted in Rejected, OnReject is
//     called and Accept goes on to the next connection. Delivery of Reject
//     is best effort: a client that already sent data may see a reset
//     instead.
//   - Accept never returns a temporary resource error. On EMFILE, ENFILE,
//     ENOBUFS, ENOMEM, ECONNABORTED, EPERM (a firewall dropping the
//     connection) and EPROTO it calls OnError, counts the error in Retried
//     and retries after a back-off that starts at 5 ms, doubles up to 1 s
//     and starts over after a success. With EMFILE the kernel keeps the
//     pending connection in the listen backlog, so waiting (not a busy
//     loop) is what lets the server recover once descriptors free up.
//     Accept returns only when the listener is closed (net.ErrClosed) or on
//     any other error.
//   - Each accepted connection is wrapped so that closing it frees its slot
//     exactly once, however many times Close is called. The wrapper exposes
//     the inner connection with Unwrap, implements syscall.Conn when the
//     inner connection does, and forwards io.ReaderFrom (so sendfile still
//     applies to a *net.TCPConn).
//   - A panic in Accept once a connection is accepted (a bug in OnReject)
//     closes that connection and gives back its slot as it goes on, for
//     a server that recovers it. One in OnError keeps the back-off for
//     the next Accept.
//
// Set the exported fields before the first Accept and leave them alone
// afterwards. A Listener built as a struct literal around a listener works
// like one from NewListener. One goroutine accepts on it (fasthttp's and
// gRPC's servers each run one loop): the back-off a failed accept sets
// holds its next Accept, whoever calls it.
type Listener struct {
	net.Listener

	// Max is the most connections open at once; <= 0 means no cap.
	Max int
	// PerClient is the most connections open at once from one client
	// address (so that one client cannot hold every slot of Max); <= 0
	// means no cap. Behind a proxy every connection is the proxy's.
	PerClient int
	// Reject, if not empty, is written to a connection closed for the cap.
	Reject []byte
	// Refuse, if set, is handed each connection over a cap instead of
	// Reject being written: on a goroutine of its own, so that a refusal
	// that must speak a protocol first (a TLS handshake, HTTP/2's
	// preface) to say why does not hold Accept. At most MaxRefusing run
	// at once, one a client (ClientKey): a connection past them is closed
	// at once, so that one client refused again and again cannot take
	// every refusal's place, and the CPU of as many handshakes. Refuse
	// must close c and end within a bound of its own (a second or two): a
	// refused client holds a descriptor, outside Max, while it runs.
	Refuse func(c net.Conn)
	// OnError, if set, is called with each accept error being retried. It
	// runs on the accepting goroutine; rate-limit any logging in it.
	OnError func(err error)
	// OnReject, if set, is called for each connection closed for the cap.
	OnReject func()
	// Share, if set, is another Listener whose cap and counts this one
	// uses instead of its own (Max and PerClient here are then ignored):
	// one server's listeners (HTTP and gRPC) under one --max-conns.
	Share *Listener

	open     atomic.Int64
	rejected atomic.Uint64
	retried  atomic.Uint64
	backoff  atomic.Int64 // the accept back-off in progress (Accept)

	mu     sync.Mutex
	done   chan struct{} // closed by Close; ends a back-off early
	closed bool
	byIP   map[string]int // open connections per client address, with PerClient
	// refusing: the clients with a Refuse under way
	refusing map[string]bool
}

// NewListener wraps inner with a cap of max connections open at once
// (max <= 0: no cap).
func NewListener(inner net.Listener, max int) *Listener {
	return &Listener{Listener: inner, Max: max}
}

// Accept waits for and returns the next connection under the cap. See
// Listener for the errors it retries rather than returns.
func (l *Listener) Accept() (net.Conn, error) {
	// A back-off a panic in OnError cut short, recovered by the server
	// (Recovered), is kept: else every panic started it over, and a
	// descriptor shortage was retried at each recovery's pause.
	delay := time.Duration(l.backoff.Load())
	if delay > 0 && !pause(delay, l.doneChan()) {
		return nil, closedErr(l.Addr())
	}
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if !retryable(err) {
				return nil, err
			}
			l.retried.Add(1)
			delay = min(max(2*delay, minBackoff), maxBackoff)
			l.backoff.Store(int64(delay))
			if l.OnError != nil {
				l.OnError(err)
			}
			if !pause(delay, l.doneChan()) {
				return nil, closedErr(l.Addr())
			}
			continue
		}
		if delay > 0 {
			delay = 0
			l.backoff.Store(0)
		}
		if w := l.admit(c); w != nil {
			return w, nil
		}
	}
}

// pause waits d and reports whether done is still open.
func pause(d time.Duration, done <-chan struct{}) bool {
	select {
	case <-done: // first: a timer fired too must not win over it
		return false
	default:
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-done:
		return false
	}
}

// closedErr is Accept's error on a listener at a that was closed.
func closedErr(a net.Addr) error {
	return &net.OpError{Op: "accept", Net: a.Network(), Addr: a, Err: net.ErrClosed}
}

// admit counts c, just accepted, in the open connections and returns it
// wrapped, or nil when it was over a cap (rejected). A panic in it (a bug
// in ClientKey, OnReject) closes c and gives back its slot before going
// on: a server that recovers it would otherwise lose a slot, and hold a
// socket, each time, until every client was refused.
func (l *Listener) admit(c net.Conn) net.Conn {
	slots := l.slots()
	held, done := false, false // held: c's open slot taken
	defer func() {
		if !done { // panicking: not recovered here, its stack kept
			if held { // first: a panic in c's Close would lose it
				slots.open.Add(-1)
			}
			c.Close()
		}
	}()
	held = true
	ip, ok := "", slots.open.Add(1) <= int64(slots.Max) || slots.Max <= 0
	if ok {
		ip, ok = slots.admitClient(c)
	}
	if !ok {
		slots.open.Add(-1)
		held = false
		l.reject(c)
		done = true
		return nil
	}
	done = true
	return slots.wrap(c, ip)
}

// slots is the Listener whose cap and counts l's connections take.
func (l *Listener) slots() *Listener {
	if l.Share != nil {
		return l.Share
	}
	return l
}

// MaxRefusing is the most Refuse calls a Listener runs at once.
const MaxRefusing = 32

// reject closes c, which is over the cap, after writing Reject to it, or
// hands it to Refuse.
func (l *Listener) reject(c net.Conn) {
	// Counted first: a refusal on its own goroutine may end before this
	// one goes on.
	l.rejected.Add(1)
	if l.OnReject != nil {
		l.OnReject()
	}
	switch {
	case l.Refuse != nil:
		if key := ClientKey(c.RemoteAddr()); l.startRefusal(key) {
			go l.refuse(c, key)
		} else {
			c.Close()
		}
	default:
		if len(l.Reject) > 0 && c.SetWriteDeadline(time.Now().Add(rejectWriteTimeout)) == nil {
			c.Write(l.Reject)
		}
		c.Close()
	}
}

// refuse runs Refuse on c; a panic in it closes c and is dropped: no
// server recovers this goroutine, and a refusal is best effort.
func (l *Listener) refuse(c net.Conn, client string) {
	defer func() {
		if recover() != nil {
			c.Close()
		}
		l.mu.Lock()
		delete(l.refusing, client)
		l.mu.Unlock()
	}()
	l.Refuse(c)
}

// startRefusal takes a place for a Refuse of client's connection: false
// where client has one under way, or MaxRefusing are.
func (l *Listener) startRefusal(client string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.refusing[client] || len(l.refusing) >= MaxRefusing {
		return false
	}
	if l.refusing == nil {
		l.refusing = map[string]bool{}
	}
	l.refusing[client] = true
	return true
}

// Refusing is how many Refuse calls are under way.
func (l *Listener) Refusing() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.refusing)
}

// Close closes the inner listener and ends a back-off in progress: Accept
// then returns an error wrapping net.ErrClosed. Connections already accepted
// stay open.
func (l *Listener) Close() error {
	l.mu.Lock()
	if !l.closed {
		l.closed = true
		if l.done == nil {
			l.done = make(chan struct{})
		}
		close(l.done)
	}
	l.mu.Unlock()
	return l.Listener.Close()
}

func (l *Listener) doneChan() chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done == nil {
		l.done = make(chan struct{})
	}
	return l.done
}

// Open reports the connections accepted and not yet closed.
func (l *Listener) Open() int { return int(l.slots().open.Load()) }

// Rejected reports the connections closed for the cap.
func (l *Listener) Rejected() uint64 { return l.rejected.Load() }

// Retried reports the accept errors retried rather than returned.
func (l *Listener) Retried() uint64 { return l.retried.Load() }

// retryable reports whether an accept error is a temporary condition of
// this process, the system or one connection, that a later accept can get
// past.
func retryable(err error) bool {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return false
	}
	switch errno {
	case syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM,
		syscall.ECONNABORTED, syscall.EPERM, syscall.EPROTO,
		// accept(2): Linux passes a pending network error of the new
		// connection to accept; TCP's are to be retried like EAGAIN.
		syscall.ENETDOWN, syscall.ENOPROTOOPT, syscall.EHOSTDOWN, syscall.ENONET,
		syscall.EHOSTUNREACH, syscall.EOPNOTSUPP, syscall.ENETUNREACH:
		return true
	}
	return false
}

// admitClient counts c against its client address's cap; it returns the
// key to release on close ("" when there is no cap) and false when the
// client is at its cap.
func (l *Listener) admitClient(c net.Conn) (string, bool) {
	if l.PerClient <= 0 {
		return "", true
	}
	ip := ClientKey(c.RemoteAddr())
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byIP == nil {
		l.byIP = map[string]int{}
	}
	if l.byIP[ip] >= l.PerClient {
		return "", false
	}
	l.byIP[ip]++
	return ip, true
}

// releaseClient gives back a connection of client key ip.
func (l *Listener) releaseClient(ip string) {
	if ip == "" {
		return
	}
	l.mu.Lock()
	if l.byIP[ip]--; l.byIP[ip] <= 0 {
		delete(l.byIP, ip)
	}
	l.mu.Unlock()
}

// ClientKey is a connection's client, as every per-client bound counts
// it: its IPv4 address, or the /64 of its IPv6 address (one host holds a
// whole /64, so one address per connection would not bound it); the
// address as a string for anything else.
func ClientKey(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok {
		if ta == nil || len(ta.IP) == 0 {
			return "?" // with its port, each connection was a client of its own
		}
		if v4 := ta.IP.To4(); v4 != nil {
			return v4.String()
		}
		if v6 := ta.IP.To16(); v6 != nil {
			return v6.Mask(net.CIDRMask(64, 128)).String() + "/64"
		}
	}
	if a == nil {
		return "?"
	}
	if host, _, err := net.SplitHostPort(a.String()); err == nil && host != "" {
		return host
	}
	if s := a.String(); s != "" {
		return s
	}
	return "?" // never "": that is the key of no client at all
}

// wrap returns c counted in l's open connections, as a type that implements
// syscall.Conn exactly when c does.
func (l *Listener) wrap(c net.Conn, ip string) net.Conn {
	w := &conn{Conn: c, l: l, ip: ip}
	if _, ok := c.(syscall.Conn); ok {
		return sysConn{w}
	}
	return w
}

// conn is an accepted connection that frees its Listener slot when closed.
type conn struct {
	net.Conn
	l      *Listener
	ip     string // its client's key with PerClient, else ""
	closed atomic.Bool
	linger atomic.Bool
}

// Close closes the connection; the first call frees its slots. A
// connection marked by Linger is closed in the background after a
// lingering close, and its slots are freed once that ends. A panic in
// the first call (the inner connection's Close or CloseWrite) still frees
// them: a later call, a server's recovery trying again, sees the
// connection closed and closes the socket alone, the slot else lost for
// good.
func (c *conn) Close() error {
	if !c.closed.CompareAndSwap(false, true) {
		return c.Conn.Close()
	}
	released := false // freed here, or left to the lingering close
	defer func() {
		if !released { // panicking: not recovered here, its stack kept
			c.release(nil)
		}
	}()
	if c.linger.Load() {
		if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
			released = true
			go c.drainAndClose()
			return nil
		}
	}
	err := c.Conn.Close()
	released = true
	return c.release(err)
}

func (c *conn) release(err error) error {
	c.l.open.Add(-1)
	c.l.releaseClient(c.ip)
	return err
}

// Lingering close bounds: the client's unsent bytes are read and dropped
// for at most lingerTotal, and for at most lingerIdle after the last
// bytes arrived (nginx's lingering_time and lingering_timeout play the
// same part).
const (
	lingerTotal = 5 * time.Second
	lingerIdle  = time.Second
)

// lingerBufs hold what lingering closes read and drop: a flood of early
// answers (404s, 413s) should not allocate a buffer each.
var lingerBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// drainAndClose reads and drops what the client still sends after the
// write side was shut, until it closes its side or the bounds run out,
// then closes the connection.
func (c *conn) drainAndClose() {
	end := time.Now().Add(lingerTotal)
	bp := lingerBufs.Get().(*[]byte)
	defer lingerBufs.Put(bp)
	buf := *bp
	for {
		d := time.Now().Add(lingerIdle)
		if d.After(end) {
			d = end
		}
		if c.Conn.SetReadDeadline(d) != nil {
			break
		}
		if _, err := c.Conn.Read(buf); err != nil {
			break
		}
	}
	c.release(c.Conn.Close())
}

// Linger marks c, a connection from a Listener (or a *tls.Conn over one),
// for a lingering close: when the server closes it, its write side is shut
// first and what the client still sends is read and dropped for a few
// seconds before the socket is closed. A server that answers before it
// read a request's whole body (a 404, a 413) marks the connection so: a
// socket closed with unread bytes is reset, and a reset reaching the
// client while it still writes the body discards the answer waiting in
// its receive buffer, so the client sees "connection reset" instead of
// the 404. Linger reports whether c was marked; any other connection is
// left alone.
func Linger(c net.Conn) bool {
	for c != nil {
		switch v := c.(type) {
		case *conn:
			v.linger.Store(true)
			return true
		case sysConn:
			v.linger.Store(true)
			return true
		case interface{ NetConn() net.Conn }: // *tls.Conn
			c = v.NetConn()
		default:
			return false
		}
	}
	return false
}

// CloseLingering closes c, an answer written to it, as a lingering close
// does, in the caller's goroutine: it shuts c's write side and reads rest
// (c, or a reader over it) until the client closes, 64 KiB were read or
// c's deadline passes. Closed with bytes unread, a socket is reset, and a
// reset can discard the answer before the client reads it. A c that
// cannot shut its write side alone is just closed.
func CloseLingering(c net.Conn, rest io.Reader) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
		io.Copy(io.Discard, io.LimitReader(rest, 64<<10))
	}
	c.Close()
}

// Unwrap returns the connection as accepted by the inner listener.
func (c *conn) Unwrap() net.Conn { return c.Conn }

// ReadFrom forwards to the inner connection's io.ReaderFrom (sendfile and
// splice for a *net.TCPConn) and copies otherwise.
func (c *conn) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{c.Conn}, r)
}

// sysConn is a conn whose inner connection implements syscall.Conn.
type sysConn struct{ *conn }

// SyscallConn returns the inner connection's raw connection.
func (c sysConn) SyscallConn() (syscall.RawConn, error) {
	return c.Conn.(syscall.Conn).SyscallConn()
}

// Recovered wraps ln so that a panic in its Accept (a bug in it or in a
// listener under it: Listener's ClientKey, OnReject) is given to
// panicked, and Accept tries again after acceptPanicPause: a server's
// accept loop (fasthttp's, gRPC-Go's) recovers nothing, and the process
// ended. Returned as a timeout instead, fasthttp would wait a second
// before it accepts again, every client with it. Once Close was called, a
// panicked Accept returns net.ErrClosed: one that panics before the inner
// accept would never see the listener closed, and gRPC-Go's Stop waits
// for Serve to return.
func Recovered(ln net.Listener, panicked func(v any)) net.Listener {
	return &recovered{Listener: ln, panicked: panicked, done: make(chan struct{})}
}

// acceptPanicPause keeps a listener that panics at each call from being
// spun on.
const acceptPanicPause = 10 * time.Millisecond

type recovered struct {
	net.Listener
	panicked func(v any)
	done     chan struct{} // closed by Close
	once     sync.Once
}

func (l *recovered) Accept() (net.Conn, error) {
	for {
		if c, ok, err := l.accept(); ok {
			return c, err
		}
		if !pause(acceptPanicPause, l.done) {
			return nil, closedErr(l.Addr())
		}
	}
}

// Close closes the inner listener and ends Accept's retries of panics.
func (l *recovered) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// accept is one Accept; ok is false when it panicked.
func (l *recovered) accept() (c net.Conn, ok bool, err error) {
	defer func() {
		if v := recover(); v != nil {
			l.panicked(v)
		}
	}()
	c, err = l.Listener.Accept()
	return c, true, err
}

// RaiseNoFileLimit raises the soft RLIMIT_NOFILE to the hard limit and
// returns the resulting soft limit, the most descriptors this process may
// hold open.
//
// Go already raises the soft limit at start on Linux, to one below the hard
// limit, and remembers the original soft limit to restore it in child
// processes (for programs that still use select). Setting the limit again
// would make children inherit the raised limit instead, so a soft limit
// already within one of the hard limit is left as it is and returned.
func RaiseNoFileLimit() (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	if lim.Cur >= lim.Max || lim.Cur == lim.Max-1 {
		return uint64(lim.Cur), nil
	}
	raised := lim
	raised.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err != nil {
		return uint64(lim.Cur), err
	}
	return uint64(raised.Cur), nil
}

// DefaultMaxConns derives a cap on client connections from the descriptor
// limit nofile, leaving room for everything else a server holds open
// (worker processes' sockets and memfds, bundle files, the store):
//
//	nofile - max(1024, nofile/4), and at least 64
//
// so 65536 descriptors give 49152 connections, 1048576 give 786432, and a
// limit of 1088 or less gives 64.
func DefaultMaxConns(nofile uint64) int {
	return connsUnder(nofile, max(ConnsReserve, nofile/4))
}

// ConnsReserve is the descriptors a server keeps beside its client
// connections at the least: its workers' sockets and memfds, bundle files,
// the store's connections.
const ConnsReserve = 1024

// MostConns is the most client connections a server whose descriptor
// limit is nofile may be given (plover serve --max-conns): nofile less
// ConnsReserve, and at least DefaultMaxConns's 64. More would let the
// connections take the descriptors the server's other work needs, while
// the guard that should keep them from it counts to a number never
// reached.
func MostConns(nofile uint64) int { return connsUnder(nofile, ConnsReserve) }

// connsUnder is nofile less reserve, at least 64 and at most math.MaxInt.
func connsUnder(nofile, reserve uint64) int {
	const floor = 64
	if nofile <= reserve || nofile-reserve < floor {
		return floor
	}
	n := nofile - reserve
	if n > math.MaxInt {
		return math.MaxInt
	}
	return int(n)
}
