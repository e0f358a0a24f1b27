package ioshare

import (
	"crypto/tls"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Moving a piece in turn without holding the turn while nothing moves: a
// body's next piece is read only once its socket has bytes, and an
// answer's next piece written only once its socket has room, both waited
// for in the runtime's poller holding no turn; the piece itself then moves
// at once (a single non-blocking write). Under TLS the socket's readiness
// says nothing about a record, so pieces there are read and written in
// turn as they come, Config.Hold bounding what one holds.

// socket is the socket under conn the server may wait on itself (TCP, or
// a wrapper that exposes it), or nil (TLS, a pipe).
func socket(conn net.Conn) syscall.RawConn {
	if _, ok := conn.(*tls.Conn); ok {
		return nil
	}
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}

// Waitable reports whether conn's readiness can be waited on (WaitReadable,
// WaitWritable and WriteSome do something).
func Waitable(conn net.Conn) bool { return socket(conn) != nil }

// WaitReadable waits, holding no turn, until conn's socket has something
// to read: bytes, its end or an error (the read then says which). The
// connection's read deadline bounds the wait (its error). Where conn has
// no socket to wait on, it returns at once.
func WaitReadable(conn net.Conn) error {
	rc := socket(conn)
	if rc == nil {
		return nil
	}
	return rc.Read(func(fd uintptr) bool {
		var b [1]byte
		_, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		return err != unix.EAGAIN && err != unix.EINTR
	})
}

// WaitWritable waits, holding no turn, until conn's socket has room to
// write (or an error: the write then says which), bounded by the
// connection's write deadline. Where conn has no socket, it returns at
// once.
func WaitWritable(conn net.Conn) error {
	rc := socket(conn)
	if rc == nil {
		return nil
	}
	return rc.Write(func(fd uintptr) bool {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		for {
			// Asked again on EINTR: parked on the poller, a socket
			// with room already would wait for an edge that may not come.
			n, err := unix.Poll(pfd, 0)
			if err != unix.EINTR {
				return n > 0 || err != nil
			}
		}
	})
}

// WaitWritableAfter is WaitWritable for a writer whose last write of a
// piece took nothing (stalled) although the socket said it had room (the
// kernel's TCP memory short, say): it pauses a moment first, holding no
// turn, where a writer would otherwise take a turn a pass, and be charged
// for it, until the pressure ends.
func WaitWritableAfter(conn net.Conn, stalled bool) error {
	if stalled {
		time.Sleep(stallPause)
	}
	return WaitWritable(conn)
}

// stallPause is WaitWritableAfter's pause.
const stallPause = time.Millisecond

// WriteSome writes what conn's socket takes of p now, without waiting: n
// may be 0 (no room) with no error. Only for a Waitable conn.
func WriteSome(conn net.Conn, p []byte) (int, error) {
	rc := socket(conn)
	if rc == nil {
		return 0, syscall.EINVAL
	}
	var n int
	var werr error
	if err := rc.Write(func(fd uintptr) bool {
		for {
			n, werr = unix.Write(int(fd), p)
			if werr != unix.EINTR {
				return true // one attempt: no room is the caller's to wait for
			}
		}
	}); err != nil {
		return 0, err
	}
	if werr == unix.EAGAIN {
		return 0, nil
	}
	return max(n, 0), werr
}
