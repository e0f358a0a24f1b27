package httpapi

import (
	"bufio"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// A drain whose grace ran out (its context's deadline) refuses the
// requests that had not started before it closes the connections left,
// and their answers are written, each closing its connection, while a
// request still running is cut at the end of closeWait, as its handler
// does not return. A drain ended at once (its context cancelled: a second
// signal) refuses nothing: the connections are closed as before.
func TestDrainAnswersTheRefusedBeforeItCloses(t *testing.T) {
	for _, tc := range []struct {
		name     string
		deadline bool // the grace ran out; else cancelled
	}{
		{"the grace ran out", true},
		{"stopped at once", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			refused, ended := make(chan struct{}), make(chan struct{})
			defer close(ended) // the running request's end, and a queued one never refused
			var handlers atomic.Int32
			s := &Server{}
			s.srv = &fasthttp.Server{
				Handler: s.conns.handle(func(ctx *fasthttp.RequestCtx) {
					handlers.Add(1)
					if string(ctx.Path()) == "/running" {
						<-ended
						return
					}
					select { // queued until the engine refuses it
					case <-refused:
						// Its way back from the engine, and its answer's
						// encoding, take a moment: closeAll must wait.
						time.Sleep(100 * time.Millisecond)
						ctx.SetStatusCode(http.StatusServiceUnavailable)
					case <-ended:
					}
				}),
				ConnState:       s.conns.state,
				CloseOnShutdown: true,
				Logger:          fasthttpLogger{slog.New(slog.DiscardHandler)},
			}
			go s.srv.Serve(s.conns.listener(ln))
			runningConn, queuedConn := request(t, ln, "/running"), request(t, ln, "/queued")
			for end := time.Now().Add(10 * time.Second); handlers.Load() != 2; time.Sleep(time.Millisecond) {
				if time.Now().After(end) {
					t.Fatal("the requests never reached their handlers")
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			if !tc.deadline {
				cancel()
			}
			calls := 0
			start := time.Now()
			err = s.conns.shutdown(ctx, s.srv, func() bool { calls++; close(refused); return true })
			took := time.Since(start)
			wantErr := context.DeadlineExceeded
			if !tc.deadline {
				wantErr = context.Canceled
			}
			if !errors.Is(err, wantErr) || took > time.Second+closeWait {
				t.Errorf("the drain: %v after %v; want %v, the running request cut within closeWait", err, took, wantErr)
			}
			queued, queuedErr := http.ReadResponse(bufio.NewReader(queuedConn), nil)
			_, runningErr := http.ReadResponse(bufio.NewReader(runningConn), nil)
			switch {
			case runningErr == nil:
				t.Error("the running request was answered; want it cut")
			case tc.deadline && (calls != 1 || queuedErr != nil || queued.StatusCode != http.StatusServiceUnavailable || !queued.Close):
				t.Errorf("refuse called %d times, the queued request answered %v %v; want once, a 503 with Connection: close", calls, queued, queuedErr)
			case !tc.deadline && (calls != 0 || queuedErr == nil):
				t.Errorf("refuse called %d times, the queued request answered %v; want no refusal, its connection cut", calls, queued)
			}
		})
	}
}

// request sends a GET of path on a connection of its own to ln.
func request(t *testing.T, ln net.Listener, path string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	return c
}
