package cli

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
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
