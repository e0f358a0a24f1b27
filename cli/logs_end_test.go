package cli

import (
	"bytes"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A followed stream that ends says why on stderr, whether the server ended
// it (a drain, the function deleted: exit 0, the lines before all printed)
// or the connection broke off (exit 1, naming the server and the cut, not
// a bare "unexpected EOF").
func TestLogsFollowEndIsExplained(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.Write([]byte(`{"time":"2026-01-01T00:00:00Z","stream":"stdout","pid":1,"line":"hi"}` + "\n"))
		w.(http.Flusher).Flush()
		if r.URL.Query().Get("since") == "1s" {
			return // the server ends the stream
		}
		c, _, _ := w.(http.Hijacker).Hijack()
		c.Close() // cut mid-stream
	}))
	defer srv.Close()
	out, errs, code := runMain(t, nil, "logs", "fn", "--follow", "--server", srv.URL)
	if code != 1 || !strings.Contains(out, "| hi") || !strings.Contains(errs, srv.URL) || !strings.Contains(errs, "broke off") {
		t.Errorf("cut: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	out, errs, code = runMain(t, nil, "logs", "fn", "--follow", "--since", "1s", "--server", srv.URL)
	if code != 0 || !strings.Contains(out, "| hi") || !strings.Contains(errs, "the server ended the stream") {
		t.Errorf("ended: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	// Without --follow the end of the lines is just the end.
	out, errs, code = runMain(t, nil, "logs", "fn", "--since", "1s", "--server", srv.URL)
	if code != 0 || errs != "" || !strings.Contains(out, "| hi") {
		t.Errorf("no follow: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

// A followed stream that stops moving is given up, naming the server: one
// whose answer never starts (followStart), and one silent past three
// keep-alives (followIdle). --follow waited forever on a server gone
// without a trace.
func TestLogsFollowGivesUpOnSilence(t *testing.T) {
	defer func(s, i time.Duration) { followStart, followIdle = s, i }(followStart, followIdle)
	followStart, followIdle = 200*time.Millisecond, 300*time.Millisecond
	var raw *rawServer
	raw = newRawServer(t, func(net.Conn, *http.Request) { <-raw.release })
	_, errs, code := runMain(t, nil, "logs", "fn", "--follow", "--server", raw.url())
	if want := "plover logs: the plover server at " + raw.url() + ": no answer to the log request within 200ms"; code != 1 || !strings.Contains(errs, want) {
		t.Errorf("no answer: exit %d, stderr %q; want %q", code, errs, want)
	}
}

// slowWriter is a reader that stops reading for a while (a pager, a full
// pipe): its first Write waits delay.
type slowWriter struct {
	b     bytes.Buffer // not embedded: its WriteString would skip Write
	delay time.Duration
}

func (w *slowWriter) Write(p []byte) (int, error) {
	if w.b.Len() == 0 {
		time.Sleep(w.delay)
	}
	return w.b.Write(p)
}

// Only the server's silence ends a followed stream: not the time its
// reader takes (a slow reader was cut after followIdle, its keep-alives
// waiting unread), nor the quiet of a server that sends no keep-alives (one
// older than them), which is not timed.
func TestLogsFollowSilenceIsTheServers(t *testing.T) {
	defer func(i time.Duration) { followIdle = i }(followIdle)
	followIdle = 300 * time.Millisecond
	const line = `{"time":"2026-01-01T00:00:00Z","stream":"stdout","pid":1,"line":"hi"}` + "\n"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		send := func(s string) {
			w.Write([]byte(s))
			w.(http.Flusher).Flush()
		}
		wait := func(d time.Duration) bool {
			select {
			case <-time.After(d):
				return true
			case <-r.Context().Done():
				return false
			}
		}
		switch strings.Split(r.URL.Path, "/")[3] {
		case "silent": // a keep-alive, a line, then nothing until the client goes
			send("\n" + line)
			<-r.Context().Done()
		case "alive": // a keep-alive, a line, keep-alives past followIdle, the end
			send("\n" + line)
			for range 12 {
				if !wait(followIdle / 6) {
					return
				}
				send("\n")
			}
		case "chatty": // says it sends keep-alives; lines, then nothing until the client goes
			w.Header().Set("X-Plover-Keep-Alive", (followIdle / 3).String())
			for range 6 {
				send(line)
				if !wait(followIdle / 6) {
					return
				}
			}
			<-r.Context().Done()
		case "old": // a line, then quiet past followIdle (no keep-alives), the end
			send(line)
			wait(2 * followIdle)
		}
	}))
	defer srv.Close()
	tests := []struct {
		name  string
		fn    string
		delay time.Duration // the reader's pause at the first line
		code  int
		want  string // in stderr
	}{
		{"silent", "silent", 0, 1, "plover logs: the log stream from " + srv.URL + " sent nothing for 300ms, though a live one sends a keep-alive line every 15s: the server or the connection is gone"},
		{"keep-alives", "alive", 0, 0, "the server ended the stream"},
		{"a slow reader", "alive", 2 * followIdle, 0, "the server ended the stream"},
		{"a server without keep-alives", "old", 0, 0, "the server ended the stream"},
		// Lines more often than keep-alives come carry none: a server that
		// says it sends them is timed from the start (one gone without a
		// FIN after its lines held --follow forever).
		{"chatty, then gone", "chatty", 0, 1, "sent nothing for 300ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var errb bytes.Buffer
			out := &slowWriter{delay: tt.delay}
			code := Main([]string{"logs", tt.fn, "--follow", "--server", srv.URL}, &Env{Stdin: strings.NewReader(""), Stdout: out, Stderr: &errb})
			if code != tt.code || !strings.Contains(out.b.String(), "| hi") || !strings.Contains(errb.String(), tt.want) {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit %d, %q", code, out.b.String(), errb.String(), tt.code, tt.want)
			}
		})
	}
}
