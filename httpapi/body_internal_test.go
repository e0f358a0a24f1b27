package httpapi

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"testing/iotest"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/plover-run/plover/apierr"
	"github.com/plover-run/plover/errdefs"
)

// A chunked body read into a buffer the size of its limit (a worker's
// slot): one that fills it exactly stays in it, one a byte longer is over
// the limit, one shorter is read as it is.
func TestChunkedBodyAtTheLimit(t *testing.T) {
	const limit = 4096
	for _, tc := range []struct {
		name    string
		n       int
		tooLong bool
	}{{"exactly the limit", limit, false}, {"a byte over", limit + 1, true}, {"shorter", limit - 10, false}} {
		t.Run(tc.name, func(t *testing.T) {
			slot := make([]byte, 0, limit)
			body := bytes.Repeat([]byte{7}, tc.n)
			r := bodyReader{s: &Server{}, r: iotest.OneByteReader(bytes.NewReader(body))}
			got, err := r.readAll(slot, limit, -1)
			if tc.tooLong {
				if !errors.Is(err, errTooLarge) {
					t.Fatalf("%d bytes: %v, want errTooLarge", tc.n, err)
				}
				return
			}
			if err != nil || !bytes.Equal(got, body) {
				t.Fatalf("%d bytes: %d read, %v", tc.n, len(got), err)
			}
			if &got[:1][0] != &slot[:1][0] {
				t.Fatal("the body left the buffer it was read into")
			}
		})
	}
}

// A chunked body that fills a buffer of its limit exactly (a worker's
// slot) ends in atLimit's one-byte read, which tells its end from a byte
// too many. The request's deadline bounds that read as it does the others
// (bound), and a read it cuts is the deadline's (KindTimeout: 504), not
// the read timeout's 408.
func TestAtLimitReadCutByTheDeadlineIsTheDeadlines(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cli, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	srvConn, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer srvConn.Close()
	const limit = 16 << 10
	if _, err := cli.Write(bytes.Repeat([]byte{7}, limit)); err != nil { // then stalls
		t.Fatal(err)
	}
	s := &Server{srv: &fasthttp.Server{ReadTimeout: 4 * time.Second}}
	r := bodyReader{s: s, r: srvConn, conn: srvConn, chunked: true,
		t: turns{deadline: time.Now().Add(300 * time.Millisecond)}}
	start := time.Now()
	_, err = r.readAll(make([]byte, 0, limit), limit, -1)
	took := time.Since(start)
	got := s.bodyError(err, bodyLimit{n: limit})
	var de *errdefs.Error
	if !errors.As(got, &de) || de.Kind != errdefs.KindTimeout || took > 2*time.Second {
		t.Fatalf("a read the request's deadline cut answered %v after %v; want the deadline's KindTimeout (504)", got, took.Round(time.Millisecond))
	}
}

// How a body that stopped arriving is answered: a reset connection is a
// client gone (499), not a malformed request; one that ended short of its
// length may have a client waiting for its 400.
func TestBodyErrors(t *testing.T) {
	reset := &net.OpError{Op: "read", Net: "tcp", Err: &os.SyscallError{Syscall: "read", Err: syscall.ECONNRESET}}
	for _, tt := range []struct {
		name string
		err  error
		want apierr.Status
	}{
		{"a connection reset", reset, apierr.Of(errdefs.KindGone)},
		{"a broken pipe", &net.OpError{Op: "write", Net: "tcp", Err: syscall.EPIPE}, apierr.Of(errdefs.KindGone)},
		{"a body short of its length", io.ErrUnexpectedEOF, apierr.BadRequest},
	} {
		st, _, msg, _ := apierr.Classify((&Server{}).bodyError(tt.err, bodyLimit{}))
		if st != tt.want {
			t.Errorf("%s: %v %q, want %v", tt.name, st, msg, tt.want)
		}
	}
}
