package httpapi

import (
	"crypto/tls"
	"net"
	"testing"
	"time"

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
			client, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			c, err := dl.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
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
