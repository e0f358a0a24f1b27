package httpapi

import (
	"bufio"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// A drain whose grace ran out (its context's deadline) refuses the
// requests that had not started before it closes the connections left,
// and their answers are written, each closing its connection, while a
// request still running is cut at the end of closeWait, as its handler
// does not return. Every answer written during the drain closes its
// connection, not only those after this drain refused: another
// transport's drain (gRPC's, whose grace ends at the same moment) may
// refuse them first, and their answers kept their connections open. A
// drain ended at once (its context cancelled: a second signal) refuses
// nothing: the connections are closed as before. The server here does
// not close connections on shutdown itself, as fasthttp's
// CloseOnShutdown stops doing once its Shutdown's context ends.
func TestDrainAnswersTheRefusedBeforeItCloses(t *testing.T) {
	for _, tc := range []struct {
		name     string
		deadline bool // the grace ran out; else cancelled
		early    bool // the queued request answered during the grace, not refused by this drain
	}{
		{"the grace ran out", true, false},
		{"answered during the grace", true, true},
		{"stopped at once", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, addr, refused, ended := refusingServer(t)
			defer close(ended) // the running request's end, and a queued one never refused
			running, queued := request(t, addr, "/running"), request(t, addr, "/queued")
			for end := time.Now().Add(10 * time.Second); s.conns.handlers.Load() != 2; time.Sleep(time.Millisecond) {
				if time.Now().After(end) {
					t.Fatal("the requests never reached their handlers")
				}
			}
			grace := 100 * time.Millisecond
			if tc.early {
				grace = time.Second
			}
			ctx, cancel := context.WithTimeout(context.Background(), grace)
			defer cancel()
			if !tc.deadline {
				cancel()
			}
			calls := 0
			refuse := func() bool { calls++; close(refused); return true }
			if tc.early {
				refuse = func() bool { calls++; return true }
				go func() { // once the drain has begun: its listener closed
					for {
						c, err := net.Dial("tcp", addr)
						if err != nil {
							close(refused)
							return
						}
						c.Close()
						time.Sleep(time.Millisecond)
					}
				}()
			}
			start := time.Now()
			err := s.conns.shutdown(ctx, s.srv, refuse)
			took := time.Since(start)
			wantErr := context.DeadlineExceeded
			if !tc.deadline {
				wantErr = context.Canceled
			}
			if !errors.Is(err, wantErr) || took > grace+closeWait+time.Second {
				t.Errorf("the drain: %v after %v; want %v, the running request cut within closeWait", err, took, wantErr)
			}
			answer, queuedErr := http.ReadResponse(queued, nil)
			_, runningErr := http.ReadResponse(running, nil)
			switch {
			case runningErr == nil:
				t.Error("the running request was answered; want it cut")
			case tc.deadline && (calls != 1 || queuedErr != nil || answer.StatusCode != http.StatusServiceUnavailable || !answer.Close):
				t.Errorf("refuse called %d times, the queued request answered %v %v; want once, a 503 with Connection: close", calls, answer, queuedErr)
			case !tc.deadline && (calls != 0 || queuedErr == nil):
				t.Errorf("refuse called %d times, the queued request answered %v; want no refusal, its connection cut", calls, answer)
			}
		})
	}
}

// refusingServer serves, on a loopback port, GET /running, whose handler
// returns once ended is closed, and any other path, queued until refused
// is closed and then answered 503, or ended with no answer.
func refusingServer(t *testing.T) (s *Server, addr string, refused, ended chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	refused, ended = make(chan struct{}), make(chan struct{})
	s = &Server{}
	s.srv = &fasthttp.Server{
		Handler: s.conns.handle(func(ctx *fasthttp.RequestCtx) {
			if string(ctx.Path()) == "/running" {
				<-ended
				return
			}
			select {
			case <-refused:
				// Its way back from the engine, and its answer's
				// encoding, take a moment: closeAll must wait.
				time.Sleep(100 * time.Millisecond)
				ctx.SetStatusCode(http.StatusServiceUnavailable)
			case <-ended:
			}
		}),
		ConnState: s.conns.state,
		Logger:    fasthttpLogger{slog.New(slog.DiscardHandler)},
	}
	go s.srv.Serve(s.conns.listener(ln))
	return s, ln.Addr().String(), refused, ended
}

// request sends a GET of path on a connection of its own to addr, and
// returns where its answer is read.
func request(t *testing.T, addr, path string) *bufio.Reader {
	t.Helper()
	c, r := dialKept(t, addr)
	if _, err := c.Write([]byte("GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	return r
}
