package grpcapi

import (
	"net"
	"sync"
	"time"
)

// Handshakes follows a gRPC listener's connections until their handshake
// (TLS, the HTTP/2 preface and settings) is over, so that a drain can end
// those still in it. gRPC-Go's GracefulStop and Stop both wait for every
// handshake in progress, up to its connection timeout (two minutes by
// default; the server sets it to --read-timeout),
// before they tell the served clients to go away or close anything: one
// connection left silent held a server's exit past any grace, its served
// clients' calls going on until cut.
//
// gRPC-Go puts a deadline on a connection for its handshake and clears it
// once the handshake is over (SetDeadline with the zero time): a
// connection is in its handshake from a SetDeadline with a time until one
// with none.
type Handshakes struct {
	mu     sync.Mutex
	open   map[*shakeConn]struct{} // in their handshake
	ending bool                    // End was called: connections accepted from now on are closed at once
}

// Listener wraps ln so that its connections are followed.
func (h *Handshakes) Listener(ln net.Listener) net.Listener { return &shakeListener{ln, h} }

// End closes the connections in their handshake, and every connection
// accepted from now on: the server is going down.
func (h *Handshakes) End() {
	h.mu.Lock()
	h.ending = true
	shaking := h.open
	h.open = nil
	h.mu.Unlock()
	for c := range shaking {
		c.Conn.Close()
	}
}

type shakeListener struct {
	net.Listener
	h *Handshakes
}

func (l *shakeListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.h.mu.Lock()
	ending := l.h.ending
	l.h.mu.Unlock()
	if ending {
		c.Close() // gRPC-Go's handshake on it fails at once
	}
	return &shakeConn{Conn: c, h: l.h}, nil
}

// shakeConn is a connection whose handshake Handshakes follows.
type shakeConn struct {
	net.Conn
	h *Handshakes
}

func (c *shakeConn) SetDeadline(t time.Time) error {
	c.h.mu.Lock()
	switch {
	case t.IsZero():
		delete(c.h.open, c)
	case c.h.ending:
		c.h.mu.Unlock()
		c.Conn.Close()
		return net.ErrClosed
	default:
		if c.h.open == nil {
			c.h.open = map[*shakeConn]struct{}{}
		}
		c.h.open[c] = struct{}{}
	}
	c.h.mu.Unlock()
	return c.Conn.SetDeadline(t)
}

func (c *shakeConn) Close() error {
	c.h.mu.Lock()
	delete(c.h.open, c)
	c.h.mu.Unlock()
	return c.Conn.Close()
}
