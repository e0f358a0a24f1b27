package httpapi

import (
	"net"
	"syscall"
)

// connGone reports whether the client at the other end of conn closed it
// (exchange.gone; a followed log stream).
func connGone(conn net.Conn) bool { return peek(conn) == peekClosed }

// What a peek at a connection's socket finds.
const (
	peekNothing = iota // open, nothing to read yet (or no socket to look at)
	peekBytes          // bytes the server has not read yet
	peekClosed         // the client closed it, or the socket is closed
)

// peek looks at the socket under conn (under TLS and Serve's wrapper)
// without consuming anything: a pipelined next request stays readable for
// fasthttp.
func peek(conn net.Conn) int {
	for {
		u, ok := conn.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		conn = u.NetConn()
	}
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return peekNothing
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return peekNothing
	}
	found := peekNothing
	if err := rc.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case n > 0:
			found = peekBytes
		case (n == 0 && err == nil) || err == syscall.ECONNRESET:
			found = peekClosed
		}
	}); err != nil {
		return peekClosed
	}
	return found
}
