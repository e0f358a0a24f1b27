package httpapi

import (
	"context"
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/plover-run/plover/internal/selfsigned"
	"github.com/plover-run/plover/ioshare"
)

// The drain's wrapper keeps what the server finds in a connection: the
// socket for the I/O shares on plain TCP (they wait on its readiness and
// write to it), and none under TLS, where a raw write would put plaintext
// on the wire (the shares' own *tls.Conn check no longer sees the TLS
// connection under the wrapper); and its close under TLS does not wait for
// a client that reads nothing.
func TestDrainWrapperKeepsTheSocketOnlyWithoutTLS(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	cfg := selfsigned.Config(t)
	for _, tc := range []struct {
		name     string
		tls      bool
		waitable bool
	}{{"plain", false, true}, {"TLS", true, false}} {
		t.Run(tc.name, func(t *testing.T) {
			var cs connSet
			ln := raw
			if tc.tls {
				ln = tls.NewListener(raw, cfg)
			}
			dl := cs.listener(ln)
			accepted := make(chan net.Conn, 1)
			go func() {
				c, err := dl.Accept()
				if err != nil {
					accepted <- nil
					return
				}
				if tc, ok := c.(interface{ Handshake() error }); ok {
					tc.Handshake()
				}
				accepted <- c
			}()
			var client net.Conn
			if tc.tls {
				client, err = tls.Dial("tcp", raw.Addr().String(), &tls.Config{InsecureSkipVerify: true})
			} else {
				client, err = net.Dial("tcp", raw.Addr().String())
			}
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			c := <-accepted
			if c == nil {
				t.Fatal("accept failed")
			}
			if got := ioshare.Waitable(c); got != tc.waitable {
				t.Fatalf("ioshare.Waitable on the server's %s connection: %v, want %v", tc.name, got, tc.waitable)
			}
			// Fill the socket's buffers, as a client that does not read
			// its answer does, with no write in progress (a piece of an
			// answer written, the next waiting for its turn): under TLS
			// on the socket below it, so that the TLS connection itself
			// has no failed write to remember.
			sock := c
			if d, ok := c.(drainTLS); ok {
				sock = d.tc.NetConn()
			}
			for stuck := 0; stuck < 3; { // until the buffers take nothing more, their growth done
				sock.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
				if n, _ := sock.Write(make([]byte, 64<<10)); n == 0 {
					stuck++
				} else {
					stuck = 0
				}
			}
			sock.SetWriteDeadline(time.Time{})
			start := time.Now()
			cs.closeAll()
			if d := time.Since(start); d > time.Second {
				t.Fatalf("closing a %s connection whose client reads nothing took %v", tc.name, d)
			}
		})
	}
}

// The drain cuts a connection that waits for a request only when nothing
// of one has come: a request whose first bytes reached the socket before
// the cut, but which its goroutine had not read yet (just accepted, not
// yet scheduled), is left to be read and served; a silent connection's
// reads end at once.
func TestDrainCutsOnlyConnectionsWithNothingSent(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for _, tc := range []struct {
		name  string
		sent  []byte
		state int32
	}{
		{"silent", nil, connCut},
		{"a request's first bytes", []byte("PUT /v1/functions/late HTTP/1.1\r\nHo"), connReading},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cs connSet
			dl := cs.listener(ln)
			client, c := connect(t, ln, dl)
			if tc.sent != nil {
				if _, err := client.Write(tc.sent); err != nil {
					t.Fatal(err)
				}
				// On loopback the bytes are in the server's socket once
				// a peek sees one (the write returned: they are sent).
				for end := time.Now().Add(5 * time.Second); peek(c) != peekBytes; time.Sleep(time.Millisecond) {
					if time.Now().After(end) {
						t.Fatal("the client's bytes never reached the server's socket")
					}
				}
			}
			cs.cutWaiting()
			d := drainOf(c)
			if got := d.state.Load(); got != tc.state {
				t.Fatalf("state after the cut: %d, want %d", got, tc.state)
			}
			if tc.state != connCut {
				c.SetReadDeadline(time.Now().Add(2 * time.Second)) // a bound for the read below
			}
			buf := make([]byte, 64)
			n, err := c.Read(buf)
			if tc.state == connCut {
				if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
					t.Fatalf("a cut connection's read: %d bytes, %v; want a timeout", n, err)
				}
				return
			}
			if string(buf[:n]) != string(tc.sent) {
				t.Fatalf("read %q (%v), want %q", buf[:n], err, tc.sent)
			}
		})
	}
}

// hookedConn runs after on each read that took bytes, before the read
// returns: where a drain's cut may land, between the socket's read and
// the connection's state noting it.
type hookedConn struct {
	net.Conn
	after func()
}

func (c hookedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 && c.after != nil {
		c.after()
	}
	return n, err
}

// A request whose first bytes a read took just as the drain cut its
// connection (the cut's peek found the socket empty, the bytes read) is
// served, as one whose bytes were still in the socket is: before, the
// cut's past deadline ended its next read and it was answered 503.
func TestDrainServesARequestReadAsTheCutCame(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cs := connSet{readTimeout: 5 * time.Second}
	cut := false
	dl := cs.listener(hookedListener{ln, func() {
		if !cut {
			cut = true
			cs.cutWaiting()
		}
	}})
	client, c := connect(t, ln, dl)
	d := drainOf(c)
	head, rest := "PUT /v1/functions/late HTTP/1.1\r\nHo", "st: x\r\n\r\n"
	if _, err := client.Write([]byte(head)); err != nil {
		t.Fatal(err)
	}
	fasthttpsBy := time.Now().Add(3 * time.Second)
	c.SetReadDeadline(fasthttpsBy) // as fasthttp sets before a request's headers
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if !cut || string(buf[:n]) != head {
		t.Fatalf("first read %q (%v), cut %v; want %q read as the cut came", buf[:n], err, cut, head)
	}
	if got := d.state.Load(); got != connReading {
		t.Fatalf("state after a read that took a request's first bytes as the cut came: %d, want reading (%d)", got, connReading)
	}
	if got := readDeadline(c, time.Now(), time.Minute); !got.Equal(time.Unix(0, fasthttpsBy.UnixNano())) {
		t.Fatalf("read deadline after the cut was undone: %v, want fasthttp's %v", got, fasthttpsBy)
	}
	if _, err := client.Write([]byte(rest)); err != nil {
		t.Fatal(err)
	}
	n, err = c.Read(buf)
	if string(buf[:n]) != rest {
		t.Fatalf("the request's next read: %q (%v), want %q", buf[:n], err, rest)
	}
	// A later pass of the drain leaves it be: it is reading a request.
	cs.cutWaiting()
	if got := d.state.Load(); got != connReading {
		t.Fatalf("state after the next pass: %d, want reading (%d)", got, connReading)
	}
}

// hookedListener accepts hookedConns.
type hookedListener struct {
	net.Listener
	after func()
}

func (l hookedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return hookedConn{c, l.after}, nil
}

// blockedLanding is a slot whose Release waits for its test.
type blockedLanding struct {
	out      []byte
	released chan struct{} // Release began
	proceed  chan struct{} // Release may return
}

func (l *blockedLanding) Input() []byte  { return nil }
func (l *blockedLanding) Output() []byte { return l.out }
func (l *blockedLanding) Release()       { close(l.released); <-l.proceed }
func (l *blockedLanding) Discard()       { l.Release() }

// A drain whose grace ran out waits, after it closed the connections
// left, for the answers still being written from a worker's slot to give
// their slot back, as it does for handlers: the node then closes its
// workers and devices, and an answer still read from a slot (after its
// handler returned, to a client that does not read it) was read from
// memory being unmapped.
func TestDrainWaitsForAnswersBeingWritten(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	s := &Server{}
	land := &blockedLanding{out: make([]byte, 16<<20), released: make(chan struct{}), proceed: make(chan struct{})}
	s.srv = &fasthttp.Server{
		Handler:      s.conns.handle(func(ctx *fasthttp.RequestCtx) { s.answer(ctx, land.out, land, turns{}) }),
		ConnState:    s.conns.state,
		WriteTimeout: time.Minute,
	}
	go s.srv.Serve(s.conns.listener(ln))
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	client.(*net.TCPConn).SetReadBuffer(4 << 10)
	if _, err := client.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	// Its handler returned, its answer being written to a client that
	// reads none of it.
	for end := time.Now().Add(10 * time.Second); s.conns.answers.Load() != 1 || s.conns.handlers.Load() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("answers %d, handlers %d: want one answer being written, no handler", s.conns.answers.Load(), s.conns.handlers.Load())
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.conns.shutdown(ctx, s.srv, nil) }()
	<-land.released // the connection closed, its write failed: the slot is being given back
	select {
	case err := <-done:
		t.Fatalf("the drain ended (%v) while an answer's slot was still being given back", err)
	case <-time.After(closeWait / 3): // a while, well inside the drain's wait
	}
	close(land.proceed)
	if err := <-done; err != nil {
		t.Fatalf("a drain whose last answer ended within its wait: %v, want none (nothing cut)", err)
	}
	if n := s.conns.answers.Load(); n != 0 {
		t.Fatalf("answers being written as the drain ended: %d", n)
	}
}

// connect dials ln and accepts the connection through dl (ln's wrapper),
// both closed as the test ends.
func connect(t *testing.T, ln, dl net.Listener) (client, server net.Conn) {
	t.Helper()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	server, err = dl.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close() })
	return client, server
}
