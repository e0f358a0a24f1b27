package httpapi_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/textproto"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/ioshare"
)

// A client that is slow to send its body, or to read its answer, holds
// none of the server's I/O turns while it is slow: a piece waits for its
// socket holding no turn, then moves in one (README, "how a byte is
// scheduled"). Only a test with the server built (cli/plover's) asserted
// this; a body's piece, or an answer's, that waited for its socket inside
// its turn passed every test of this package (a review's finding). Each case waits until its
// function is seen holding no turn for a run of samples while its request
// is still under way: blocked in a turn, it holds one throughout.
func TestASlowClientHoldsNoTurn(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	m := testkit.Manifest("slow")
	m.MaxInputBytes, m.OutBytes = 1<<20, 16<<20 // echo: the input, then zeros to out_bytes
	m.ZeroOut = new(bool)
	m.Chain = []abi.Launch{{Kernel: "echo", Grid: 1, Block: 256}}
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	addr := strings.TrimPrefix(testkit.Serve(t, e, httpapi.Options{ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second}), "http://")
	fl := e.IO("slow")

	t.Run("a body trickling", func(t *testing.T) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST /v1/functions/slow/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", 1<<20)
		if _, err := c.Write(make([]byte, 20<<10)); err != nil { // past what comes with the headers
			t.Fatal(err)
		}
		var stop atomic.Bool
		defer stop.Store(true)
		go func() {
			for !stop.Load() {
				c.Write([]byte{1})
				time.Sleep(20 * time.Millisecond)
			}
		}()
		holdsNoTurn(t, fl, func() bool { in, mem := fl.Bodies(); return in+mem > 0 })
	})

	t.Run("an answer not read", func(t *testing.T) {
		// A small receive buffer: 16 MiB cannot all wait in the sockets.
		d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
			if err != nil {
				return err
			}
			return serr
		}}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST /v1/functions/slow/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: 1\r\n\r\nx")
		r := bufio.NewReaderSize(c, 16)
		status, err := r.ReadString('\n')
		if err != nil || !strings.Contains(status, " 200 ") {
			t.Fatalf("the answer's first line: %q, %v", status, err)
		}
		// Its answer has begun, and stays under way while nothing more is
		// read: then it is read, and must arrive whole.
		holdsNoTurn(t, fl, func() bool { return true })
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		tp := textproto.NewReader(r)
		h, err := tp.ReadMIMEHeader()
		if err != nil {
			t.Fatal(err)
		}
		n, err := io.Copy(io.Discard, io.LimitReader(r, 16<<20))
		if want := int64(16 << 20); err != nil || n != want || h.Get("Content-Length") != strconv.FormatInt(want, 10) {
			t.Fatalf("the answer read late: %d bytes (Content-Length %q), %v; want all %d", n, h.Get("Content-Length"), err, want)
		}
	})
}

// holdsNoTurn waits until busy says the slow request is under way, then
// until fl is seen holding no turn (no piece moving or stalled) in 20
// samples in a row, a millisecond apart, while it still is.
func holdsNoTurn(t *testing.T, fl *ioshare.Flow, busy func() bool) {
	t.Helper()
	end := time.Now().Add(10 * time.Second)
	for ; !busy(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the slow request was not seen under way within 10 s")
		}
	}
	run := 0
	for ; run < 20; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			moving, stalled, _ := fl.Pieces()
			t.Fatalf("for 10 s the slow client's flow held a turn (now %d moving, %d stalled): a piece waits for its socket in its turn", moving, stalled)
		}
		moving, stalled, _ := fl.Pieces()
		switch {
		case !busy():
			t.Fatal("the slow request ended: nothing left to watch")
		case moving+stalled == 0:
			run++
		default:
			run = 0
		}
	}
}
