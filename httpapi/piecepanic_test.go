package httpapi_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/ioshare"
	"github.com/plover-run/plover/reqmetrics"
	"github.com/plover-run/plover/sched"
)

// threadLevels is the server's threads' CPU weights (ioshare.Threads):
// each thread's level, by thread id, as the pieces set them.
type threadLevels struct {
	mu sync.Mutex
	at map[int]int
}

func (*threadLevels) Base() (int, bool) { return 0, true }

func (l *threadLevels) Set(level int) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.at[unix.Gettid()] = level
	return nil
}

// mine reports whether the calling thread is at a function's level now.
func (l *threadLevels) mine() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.at[unix.Gettid()] != 0
}

// left is the threads still at a function's level.
func (l *threadLevels) left() map[int]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := map[int]int{}
	for tid, level := range l.at {
		if level != 0 {
			m[tid] = level
		}
	}
	return m
}

// pieceRunner answers every invoke with a 1 MiB output; its function's
// bytes move in turns of fl.
type pieceRunner struct {
	testkit.PanicRunner
	fl *ioshare.Flow
}

func (r pieceRunner) IO(string) *ioshare.Flow { return r.fl }
func (pieceRunner) Land(string) call.Landing  { return nil }

func (pieceRunner) Invoke(_ context.Context, _ string, req *call.Request) error {
	req.Output = append(req.Output[:0], make([]byte, 1<<20)...)
	return nil
}

// buggyListener accepts connections whose reads (read) or socket writes
// (write) panic when made on a thread at a function's level: a bug in
// moving a piece of a function's bytes, in its turn.
type buggyListener struct {
	net.Listener
	th          *threadLevels
	read, write bool
}

func (l buggyListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return buggyConn{c.(*net.TCPConn), l}, nil
}

type buggyConn struct {
	*net.TCPConn
	l buggyListener
}

func (c buggyConn) Read(b []byte) (int, error) {
	if c.l.read && c.l.th.mine() {
		panic("a bug in reading a piece")
	}
	return c.TCPConn.Read(b)
}

func (c buggyConn) SyscallConn() (syscall.RawConn, error) {
	rc, err := c.TCPConn.SyscallConn()
	return buggyRaw{rc, c.l}, err
}

type buggyRaw struct {
	syscall.RawConn
	l buggyListener
}

func (r buggyRaw) Write(f func(uintptr) bool) error {
	if r.l.write && r.l.th.mine() {
		panic("a bug in writing a piece")
	}
	return r.RawConn.Write(f)
}

// A panic while a piece of a function's bytes moves in its turn, its
// thread at the function's CPU weight (a nice level, or a CPU group), puts
// the thread back at the server's and ends the turn: the thread (locked to
// its goroutine, fasthttp's, which serves the next requests of every
// tenant) stayed at the function's level and locked, the turn counted as
// moving, and the server's count of niced threads never came down (with
// GOMAXPROCS-1 such panics no piece moved at its weight again). A body's
// piece is a 500; an answer's, whose status is out, cuts its connection,
// logged and counted as other panics are: fasthttp recovered that one
// itself, into a debug line, uncounted.
func TestPanicInAPieceRestoresItsThread(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4)) // a piece moves niced only with 2 Ps or more
	for _, tc := range []struct {
		name        string
		read, write bool
		body        int
		route       string
		panicked    string
	}{
		{"a body's piece", true, false, 1 << 20, "POST /v1/functions/echo/invoke", "a bug in reading a piece"},
		{"an answer's piece", false, true, 100, "POST /v1/functions/echo/invoke", "a bug in writing a piece"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			th := &threadLevels{at: map[int]int{}}
			sh := ioshare.New(ioshare.Config{Slots: 3, Hold: time.Minute, Threads: th,
				Nice: func(float64, sched.Class) int { return 10 }})
			fl, other := sh.Flow("echo"), sh.Flow("other")
			fl.Set(1, sched.Default)
			// other's piece in flight: echo's pieces share the I/O, and move at echo's level.
			busy, err := other.Turn(context.Background(), time.Time{}, nil, true)
			if err != nil {
				t.Fatal(err)
			}
			defer busy.Done()

			var log testkit.LogBuffer
			reg := prometheus.NewRegistry()
			door := frontdoor.New(frontdoor.Config{Runner: pieceRunner{fl: fl}, Metrics: reqmetrics.New(reg),
				Log: slog.New(slog.NewTextHandler(&log, nil))})
			srv := httpapi.New(door, nil, httpapi.Options{Registry: reg})
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			go srv.Serve(buggyListener{ln, th, tc.read, tc.write})
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				srv.Shutdown(ctx)
			})

			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(20 * time.Second))
			go fmt.Fprintf(c, "POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n%s",
				tc.body, make([]byte, tc.body))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("no answer: %v (did the server die?)", err)
			}
			got, err := io.ReadAll(resp.Body)
			switch {
			case tc.read && (resp.StatusCode != 500 || !resp.Close || !strings.Contains(string(got), `"code":"internal"`)):
				t.Fatalf("%d %s (close %v): want 500 internal, its connection closed", resp.StatusCode, got, resp.Close)
			case tc.write && (resp.StatusCode != 200 || !errors.Is(err, io.ErrUnexpectedEOF)):
				t.Fatalf("%d, %d bytes, %v: want 200 and its answer cut (unexpected EOF)", resp.StatusCode, len(got), err)
			}
			if left := th.left(); len(left) > 0 {
				t.Errorf("threads left at the function's level after the panic (thread id: level): %v", left)
			}
			if moving, stalled, _ := fl.Pieces(); moving+stalled != 0 {
				t.Errorf("%d of the function's pieces still moving and %d stalled after the panic, want 0: its turn never ended", moving, stalled)
			}
			onePanic(t, log.String(), reg, tc.route, tc.panicked, "echo")
		})
	}
}
