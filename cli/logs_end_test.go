package cli

import (
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
// without a trace. A stream whose keep-alives come lasts past followIdle.
func TestLogsFollowGivesUpOnSilence(t *testing.T) {
	defer func(s, i time.Duration) { followStart, followIdle = s, i }(followStart, followIdle)
	followStart, followIdle = 200*time.Millisecond, 300*time.Millisecond
	const line = `{"time":"2026-01-01T00:00:00Z","stream":"stdout","pid":1,"line":"hi"}` + "\n"

	var raw *rawServer
	raw = newRawServer(t, func(net.Conn, *http.Request) { <-raw.release })
	_, errs, code := runMain(t, nil, "logs", "fn", "--follow", "--server", raw.url())
	if want := "plover logs: the plover server at " + raw.url() + ": no answer to the log request within 200ms"; code != 1 || !strings.Contains(errs, want) {
		t.Errorf("no answer: exit %d, stderr %q; want %q", code, errs, want)
	}

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.Write([]byte(line))
		w.(http.Flusher).Flush()
		if r.URL.Query().Get("since") == "" {
			<-r.Context().Done() // silent until the client goes
			return
		}
		// Keep-alives for longer than followIdle, then the end.
		tick := time.NewTicker(followIdle / 6)
		defer tick.Stop()
		for range 12 {
			select {
			case <-tick.C:
			case <-r.Context().Done():
				return
			}
			w.Write([]byte("\n"))
			w.(http.Flusher).Flush()
		}
	}))
	defer srv.Close()
	out, errs, code := runMain(t, nil, "logs", "fn", "--follow", "--server", srv.URL)
	want := "plover logs: the log stream from " + srv.URL + " sent nothing for 300ms, though a live one sends a keep-alive line every 15s: the server or the connection is gone"
	if code != 1 || !strings.Contains(out, "| hi") || !strings.Contains(errs, want) {
		t.Errorf("silent: exit %d, stdout %q, stderr %q; want %q", code, out, errs, want)
	}
	out, errs, code = runMain(t, nil, "logs", "fn", "--follow", "--since", "1m", "--server", srv.URL)
	if code != 0 || !strings.Contains(out, "| hi") || !strings.Contains(errs, "the server ended the stream") {
		t.Errorf("keep-alives: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}
