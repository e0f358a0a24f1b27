package cli

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/plover-run/plover/internal/testkit"
)

// rawServer accepts connections and hands each request, read in full, to
// then (nil: close the connection without an answer); it records the
// request line of each.
type rawServer struct {
	ln      net.Listener
	mu      sync.Mutex
	arrived []string
	release chan struct{}
}

func newRawServer(t *testing.T, then func(c net.Conn, req *http.Request)) *rawServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &rawServer{ln: ln, release: make(chan struct{})}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); close(s.release); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				io.Copy(io.Discard, req.Body)
				s.mu.Lock()
				s.arrived = append(s.arrived, req.Method+" "+req.URL.RequestURI())
				s.mu.Unlock()
				if then != nil {
					then(c, req)
				}
			}()
		}
	}()
	return s
}

func (s *rawServer) url() string { return "http://" + s.ln.Addr().String() }

func (s *rawServer) requests() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.arrived...)
}

// A request that got no answer is told by how far it got: no connection
// (how to start a server), the connection closed after the whole request
// was sent (it may have run), no answer within the client's wait (issue:
// all three said "cannot reach the plover server (start one with plover
// serve)").
func TestTransportFailuresToldApart(t *testing.T) {
	in := filepath.Join(t.TempDir(), "in")
	if err := os.WriteFile(in, []byte("input"), 0o644); err != nil {
		t.Fatal(err)
	}
	invokeArgs := func(url string, more ...string) []string {
		return append([]string{"invoke", "f", "--server", url, "--in", in, "--out", filepath.Join(t.TempDir(), "out")}, more...)
	}

	t.Run("not reached", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		url := "http://" + ln.Addr().String()
		ln.Close() // nothing listens there now
		_, errs, code := runMain(t, nil, invokeArgs(url)...)
		if code != 1 || !strings.Contains(errs, "cannot reach the plover server at "+url+" (start one with 'plover serve'") {
			t.Fatalf("exit %d, stderr %q", code, errs)
		}
	})

	t.Run("closed after the request", func(t *testing.T) {
		s := newRawServer(t, nil)
		for _, args := range [][]string{invokeArgs(s.url()), {"rm", "f", "--server", s.url()}} {
			_, errs, code := runMain(t, nil, args...)
			want := "the plover server at " + s.url() + " closed the connection before answering: the request may have run"
			if code != 1 || !strings.Contains(errs, want) || strings.Contains(errs, "start one") {
				t.Fatalf("%s: exit %d, stderr %q; want %q", args[0], code, errs, want)
			}
		}
		if got := s.requests(); len(got) != 2 || got[0] != "POST /v1/functions/f/invoke" || got[1] != "DELETE /v1/functions/f" {
			t.Fatalf("the server got %q; want the invoke and the delete, once each", got)
		}
	})

	t.Run("no answer in time", func(t *testing.T) {
		defer func(d time.Duration) { requestTimeout = d }(requestTimeout)
		requestTimeout = 150 * time.Millisecond
		var s *rawServer
		s = newRawServer(t, func(net.Conn, *http.Request) { <-s.release })
		for _, args := range [][]string{invokeArgs(s.url()), {"ls", "--server", s.url()}} {
			_, errs, code := runMain(t, nil, args...)
			want := "no answer from the plover server at " + s.url() + " within 150ms: gave up waiting; the server may still be running the request"
			if code != 1 || !strings.Contains(errs, want) {
				t.Fatalf("%s: exit %d, stderr %q; want %q", args[0], code, errs, want)
			}
		}
	})
}

// plover invoke waits as long as its --timeout asks (and invokeGrace), not
// the client's requestTimeout: a --timeout of 20m against a server with a
// raised --max-timeout failed at 10 minutes.
func TestInvokeWaitFollowsTimeout(t *testing.T) {
	defer func(d, g time.Duration) { requestTimeout, invokeGrace = d, g }(requestTimeout, invokeGrace)
	requestTimeout, invokeGrace = 10*time.Minute, 2*time.Second
	for _, tt := range []struct{ timeout, want time.Duration }{
		{0, 10 * time.Minute},
		{time.Second, 3 * time.Second},
		{20 * time.Minute, 20*time.Minute + 2*time.Second},
	} {
		if got := invokeWait(tt.timeout); got != tt.want {
			t.Errorf("invokeWait(%v) = %v, want %v", tt.timeout, got, tt.want)
		}
	}

	// Against a server: it answers after the client's requestTimeout has
	// passed, within --timeout.
	requestTimeout = 100 * time.Millisecond
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		time.Sleep(4 * requestTimeout) // a function that runs longer than requestTimeout
		w.Write([]byte("done"))
	}))
	defer srv.Close()
	out := filepath.Join(t.TempDir(), "out")
	_, errs, code := runMain(t, nil, "invoke", "f", "--server", srv.URL, "--in", os.DevNull, "--out", out, "--timeout", "30s")
	if b, _ := os.ReadFile(out); code != 0 || string(b) != "done" {
		t.Fatalf("invoke --timeout 30s with requestTimeout %v: exit %d, output %q, stderr %q", requestTimeout, code, b, errs)
	}
}

// slowBody yields its bytes a chunk at a time, each after a tick: a slow
// link that keeps moving.
type slowBody struct {
	chunk, left int
	tick        <-chan time.Time
}

func (b *slowBody) Read(p []byte) (int, error) {
	if b.left == 0 {
		return 0, io.EOF
	}
	<-b.tick
	n := min(b.chunk, b.left, len(p))
	for i := range p[:n] {
		p[i] = 'b'
	}
	b.left -= n
	return n, nil
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// A deploy has no overall bound: it fails when no byte moves for
// uploadIdle, or no answer comes that long after the last one, and an
// upload that keeps moving goes on past requestTimeout.
func TestUploadIdleTimeout(t *testing.T) {
	defer func(d time.Duration) { requestTimeout = d }(requestTimeout)
	requestTimeout = 100 * time.Millisecond
	const idle = 300 * time.Millisecond
	hold := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/functions/stalled": // takes a little, then reads no more
			io.CopyN(io.Discard, r.Body, 2048)
			<-hold
			return
		case "/v1/functions/held": // takes it all, never answers
			io.Copy(io.Discard, r.Body)
			<-hold
			return
		}
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"name":"f","version":"v1"}`))
	}))
	defer srv.Close()
	defer close(hold) // before srv.Close, which waits for the handlers
	c := newClient(srv.URL, "", "")
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()

	// 20 chunks, a tick apart: 400 ms in all, longer than requestTimeout.
	var v map[string]any
	body := &slowBody{chunk: 1024, left: 20 * 1024, tick: tick.C}
	start := time.Now()
	if err := c.upload("/v1/functions/f", "application/octet-stream", body, 20*1024, idle, &v); err != nil || v["version"] != "v1" {
		t.Fatalf("a moving upload: %v, answer %v", err, v)
	}
	if el := time.Since(start); el < requestTimeout {
		t.Fatalf("the upload took %v, not longer than requestTimeout %v: it tests nothing", el, requestTimeout)
	}

	// The server stops reading: the socket's buffers fill (64 MiB is far
	// more than they hold), and nothing moves.
	const size = 64 << 20
	err := c.upload("/v1/functions/stalled", "application/octet-stream", io.LimitReader(zeros{}, size), size, idle, &v)
	want := "the plover server at " + srv.URL + ": no byte of the upload moved for 300ms ("
	if err == nil || !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), " of 64.0 MiB sent): gave up") {
		t.Fatalf("a stalled upload: %v; want %q", err, want+"... of 64.0 MiB sent): gave up")
	}

	// All sent; the answer never comes.
	err = c.upload("/v1/functions/held", "application/octet-stream", strings.NewReader("bundle"), 6, idle, &v)
	want = "the plover server at " + srv.URL + ": no answer within 300ms of the upload's last byte (6 B sent): gave up waiting"
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("an unanswered upload: %v; want %q", err, want)
	}
}

// plover deploy sends its bundle with upload: a server that takes it and
// never answers is given up on uploadIdle after the last byte, with the
// reason.
func TestDeployGivesUpWhenIdle(t *testing.T) {
	defer func(d, r time.Duration) { uploadIdle, requestTimeout = d, r }(uploadIdle, requestTimeout)
	uploadIdle, requestTimeout = 200*time.Millisecond, 3*time.Second // the latter only ends a deploy that ignores uploadIdle sooner
	var s *rawServer
	s = newRawServer(t, func(c net.Conn, req *http.Request) {
		if req.URL.Path == "/healthz" { // deploy asks first which targets the server runs
			io.WriteString(c, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
			return
		}
		<-s.release
	})
	dir := testkit.BundleDir(t, testkit.Manifest("fn"), nil)
	_, errs, code := runMain(t, nil, "deploy", dir, "--server", s.url())
	want := "no answer within 200ms of the upload's last byte"
	if code != 1 || !strings.Contains(errs, want) {
		t.Fatalf("exit %d, stderr %q; want %q", code, errs, want)
	}
}

// An error answer's Retry-After is said with it: a 429 or 503 printed
// "server said 429 rate_limited: ..." without the wait it asks for.
func TestAPIErrorSaysRetryAfter(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		header string
		want   time.Duration
	}{
		{"", 0}, {"7", 7 * time.Second}, {" 2 ", 2 * time.Second}, {"-3", 0}, {"soon", 0},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second},
		{now.Add(-time.Minute).Format(http.TimeFormat), 0},
	} {
		h := http.Header{}
		if tt.header != "" {
			h.Set("Retry-After", tt.header)
		}
		if got := retryAfter(h, now); got != tt.want {
			t.Errorf("Retry-After %q: %v, want %v", tt.header, got, tt.want)
		}
	}

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch strings.TrimSuffix(r.URL.Path, "/versions") {
		case "/v1/functions/limited":
			w.Header().Set("Retry-After", "7")
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, `{"error":{"code":"rate_limited","message":"token app is over its rate"}}`)
		case "/v1/functions/gated":
			// The gate's own words say the wait: said once.
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, `{"error":{"code":"rate_limited","message":"token app is over its rate of 1 requests/s (burst 1, auth file): retry in 1 s"}}`)
		case "/v1/functions/down":
			w.Header().Set("Retry-After", "30")
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, "the proxy's own page")
		default:
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, `{"error":{"code":"not_found","message":"function f not found"}}`)
		}
	}))
	defer srv.Close()
	for _, tt := range []struct{ name, want string }{
		{"limited", "plover versions: server said 429 rate_limited: token app is over its rate (retry after 7 s)\n"},
		{"gated", "plover versions: server said 429 rate_limited: token app is over its rate of 1 requests/s (burst 1, auth file): retry in 1 s\n"},
		{"down", "/v1/functions/down/versions answered 503 Service Unavailable: not plover's answer (another service at --server, or a proxy's page?): it began \"the proxy's own page\" (retry after 30 s)\n"},
		{"f", "plover versions: server said 404 not_found: function f not found\n"},
	} {
		_, errs, code := runMain(t, nil, "versions", tt.name, "--server", srv.URL)
		if code != 1 || !strings.HasSuffix(errs, tt.want) {
			t.Errorf("versions %s: exit %d, stderr %q; want it to end %q", tt.name, code, errs, tt.want)
		}
	}
}

// A constants file that is not there is said as the manifest's other
// checks are, naming DIR/plover.json and the field: it read "constants:
// nosuch.bin: no such file or directory".
func TestMissingConstantsNamesTheManifest(t *testing.T) {
	m := testkit.Manifest("fn")
	m.Constants = "nosuch.bin"
	dir := testkit.BundleDir(t, m, nil)
	want := "plover deploy: " + filepath.Join(dir, "plover.json") + ": constants: " + filepath.Join(dir, "nosuch.bin") + ": no such file or directory\n"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	server := "http://" + ln.Addr().String()
	ln.Close() // the check comes before any upload: no server needed
	for _, to := range [][]string{{"--server", server}, {"--store", "file://" + filepath.Join(t.TempDir(), "store")}} {
		_, errs, code := runMain(t, nil, append([]string{"deploy", dir}, to...)...)
		if code != 1 || errs != want {
			t.Errorf("deploy %s: exit %d, stderr %q; want %q", to[0], code, errs, want)
		}
	}
}

// An answer that is not plover's JSON (a proxy's page) is said in brief
// and with where it came from: a 200 KB HTML 502 was printed whole, and a
// 200 of HTML said only "invalid character '<' looking for beginning of
// value".
func TestAnswersNotPloversJSON(t *testing.T) {
	page := "<html><body>" + strings.Repeat("<p>Bad gateway, é.</p>", 10000) + "</body></html>"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		if r.URL.Path == "/v1/functions/bad/versions" {
			w.WriteHeader(http.StatusBadGateway)
		}
		io.WriteString(w, page)
	}))
	defer srv.Close()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"versions", "bad"}, fmt.Sprintf("plover versions: GET %s/v1/functions/bad/versions answered 502 Bad Gateway: not plover's answer (another service at --server, or a proxy's page?): it began %q... (%d bytes)\n", srv.URL, page[:60], len(page))},
		{[]string{"versions", "fn"}, "plover versions: GET " + srv.URL + "/v1/functions/fn/versions answered 200 OK, and not with plover's JSON (Content-Type \"text/html; charset=utf-8\"): reading it: invalid character '<'"},
		{[]string{"ls"}, "plover ls: GET " + srv.URL + "/v1/functions answered 200 OK, and not with plover's JSON (Content-Type \"text/html; charset=utf-8\")"},
		{[]string{"gc"}, "plover gc: POST " + srv.URL + "/v1/gc?grace=1m0s answered 200 OK, and not with plover's JSON"},
	} {
		_, errs, code := runMain(t, nil, append(tt.args, "--server", srv.URL)...)
		if code != 1 || !strings.HasPrefix(errs, tt.want) || len(errs) > 500 {
			t.Errorf("%v: exit %d, stderr (%d bytes) %.600q; want it to begin %q", tt.args, code, len(errs), errs, tt.want)
		}
	}
	// Cut between characters: the cut é is not half of one.
	if got := quoteStart(strings.Repeat("a", 59)+"é", 60); got != `"`+strings.Repeat("a", 59)+`"... (61 bytes)` {
		t.Errorf("quoteStart cut inside a character: %q", got)
	}
}
