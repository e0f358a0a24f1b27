// Package cli implements the plover command's subcommands.
package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/plover-run/plover/apierr"
)

// DefaultServer is where commands find a server without --server (or
// $PLOVER_SERVER, which sets it): plover serve's default listen address.
const DefaultServer = "http://127.0.0.1:8080"

func serverURL(flagVal string) string {
	s := flagVal
	if s == "" {
		s = DefaultServer
	}
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	return strings.TrimRight(s, "/")
}

// checkServerURL says what is wrong with a --server value that is no
// server's URL (nil for one that is, and for "", the default): a scheme
// other than http or https, no host, a port out of range, a query or
// fragment, a path that ends in /v1 or /v2, or a value that does not
// parse. Such a value is a command line that cannot run, not a server that
// cannot be reached.
func checkServerURL(s string) error {
	if s == "" {
		return nil
	}
	raw := s
	if !strings.Contains(raw, "://") {
		raw = "http://" + raw
	}
	if strings.Contains(raw, "@") {
		return errUserInfo // first, unechoed: a password with a / in it ends the authority before its @
	}
	u, err := url.Parse(raw)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return err
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("want http:// or https://, not %s://", u.Scheme)
	case u.Host == "" || u.Hostname() == "":
		return errors.New("no host (want http://HOST:PORT)")
	case !strings.Contains(s, "://") && (u.Hostname() == "http" || u.Hostname() == "https"):
		return fmt.Errorf("no host but %q: a ':' missing after the scheme?", u.Hostname())
	case u.RawQuery != "" || u.Fragment != "" || u.ForceQuery:
		return errors.New("a query or fragment: give the server's base URL (http://HOST:PORT)")
	case apiVersionPath(u.Path):
		// Each command adds its own /v1/...: this asked /v1/v1/... and read
		// a 404 "no route" that named no fix.
		base := *u
		base.Path = strings.TrimRight(u.Path, "/")
		base.Path = base.Path[:len(base.Path)-len("/v1")]
		return fmt.Errorf("the API's path in it: give the server's base URL, %s (each command adds /v1/... itself)", base.String())
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("port %s: want 1..65535", p)
		}
	}
	return nil
}

// apiVersionPath says whether a --server's path ends in an API version,
// /v1 or /v2: the URL of the API, not of the server.
func apiVersionPath(p string) bool {
	p = strings.TrimRight(p, "/")
	return strings.HasSuffix(p, "/v1") || strings.HasSuffix(p, "/v2")
}

// errUserInfo refuses a server URL with a user or password: the server
// takes a token, so they would be sent to no one, and printed in every
// error that names the server.
var errUserInfo = errors.New("an @ in it, a user or password: the server takes a token (--token or $PLOVER_TOKEN), not credentials in the URL")

// client talks to a plover server's HTTP API.
type client struct {
	base   string
	token  string
	http   *http.Client
	tlsErr error         // a --cacert that cannot be used: reported by the first call
	wait   time.Duration // with http.Timeout 0: the bound the request's context sets, for messages
}

// requestTimeout bounds a request to the server, its answer included: a
// listing, a delete, a rollback, and an invoke without --timeout. An invoke
// with --timeout waits that and invokeGrace instead (invokeWait); a deploy
// waits while its bytes move (uploadIdle). A variable for tests.
var requestTimeout = 10 * time.Minute

func newClient(server, token, cacert string) *client {
	// A token read from a file ends with a newline.
	c := &client{base: serverURL(server), token: strings.TrimSpace(token), http: &http.Client{Timeout: requestTimeout}}
	cfg, err := tlsConfig(cacert)
	c.tlsErr = err
	if cfg != nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = cfg
		c.http.Transport = tr
	}
	return c
}

// bounded is c without its http.Client's overall Timeout, for a request
// whose context bounds it instead, to wait (0: an upload's idle watch).
func (c *client) bounded(wait time.Duration) *client {
	hc := *c.http
	hc.Timeout = 0
	u := *c
	u.http, u.wait = &hc, wait
	return &u
}

// uploadIdle is how long plover deploy waits while no byte of its bundle
// moves to the server, and then for the server's answer after the last
// one (it checks and stores the bundle): a deploy has no overall bound, so
// that a large bundle over a slow link is not cut off while it moves. A
// variable for tests.
var uploadIdle = 5 * time.Minute

// upload sends body (size bytes) and decodes the JSON answer into v,
// failing when idle passes with no byte sent, or with no answer after the
// last.
func (c *client) upload(path, contentType string, body io.Reader, size int64, idle time.Duration, v any) error {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	w := &stallWatch{r: body, size: size, idle: idle}
	w.t = time.AfterFunc(idle, func() { cancel(w.stalled()) })
	defer w.t.Stop()
	resp, err := c.bounded(0).doRequest(ctx, http.MethodPut, path, contentType, w, size, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	w.kick(0) // the answer came: idle again to read it
	if err := c.decode(resp, http.MethodPut, path, v); err != nil {
		if cause := context.Cause(ctx); cause != nil && cause != ctx.Err() {
			err = fmt.Errorf("reading the server's answer: %w", cause)
		}
		return err
	}
	return nil
}

// stallWatch reads a request's body, restarting t (which cancels the
// request) at each byte read, and once more at its end. The time between
// Reads is what it watches: the transport writes what one Read gave before
// it reads again, and a stalled link blocks that write. (A stream read by
// the CLI, whose consumer may block between Reads, has readWatch.)
type stallWatch struct {
	r    io.Reader
	size int64
	idle time.Duration
	t    *time.Timer

	mu   sync.Mutex
	sent int64
}

func (w *stallWatch) Read(p []byte) (int, error) {
	n, err := w.r.Read(p)
	if n > 0 || err == io.EOF {
		w.kick(n)
	}
	return n, err
}

func (w *stallWatch) kick(n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.sent += int64(n)
	w.t.Reset(w.idle)
}

// stalled says what the request was waiting for when idle passed.
func (w *stallWatch) stalled() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.sent < w.size {
		return fmt.Errorf("no byte of the upload moved for %v (%s of %s sent): gave up; the link or the server stalled", w.idle, humanBytes(w.sent), humanBytes(w.size))
	}
	return fmt.Errorf("no answer within %v of the upload's last byte (%s sent): gave up waiting; the server may still store it (plover versions NAME shows whether it did)", w.idle, humanBytes(w.sent))
}

// apiError is the server's JSON error, with the status it came with.
type apiError struct {
	Status  int
	Code    string
	Message string
	// RetryAfter is the wait the answer's Retry-After asks for (429 busy
	// and rate_limited, a 503), rounded up to whole seconds; 0 without one.
	RetryAfter time.Duration
	// Foreign is the request ("GET URL") of an answer that is not
	// plover's (Code "http"), which the message names instead of
	// "server said"; "" for plover's own.
	Foreign string
}

func (e *apiError) Error() string {
	s := fmt.Sprintf("server said %d %s: %s", e.Status, e.Code, e.Message)
	if e.Foreign != "" {
		s = fmt.Sprintf("%s answered %d %s: %s", e.Foreign, e.Status, http.StatusText(e.Status), e.Message)
	}
	// A rate limit's message says its wait itself ("retry in 1 s"): said
	// twice, it read as two waits.
	if e.RetryAfter > 0 && !strings.Contains(e.Message, "retry in ") {
		s += fmt.Sprintf(" (retry after %d s)", int64(e.RetryAfter/time.Second))
	}
	return s
}

// retryAfter reads a Retry-After header (apierr.RetryAfter: the one
// parser, plover bench's too).
func retryAfter(h http.Header, now time.Time) time.Duration {
	return apierr.RetryAfter(h.Get("Retry-After"), now)
}

func (c *client) do(method, path, contentType string, body io.Reader) (*http.Response, error) {
	return c.doSized(method, path, contentType, body, -1)
}

// doSized sends a body of known size (so a wrapped reader is not chunked).
func (c *client) doSized(method, path, contentType string, body io.Reader, size int64) (*http.Response, error) {
	return c.doRequest(context.Background(), method, path, contentType, body, size, nil)
}

// doRequest sends a request with extra headers; ctx bounds the whole
// exchange, the response body's reading included.
func (c *client) doRequest(ctx context.Context, method, path, contentType string, body io.Reader, size int64, header http.Header) (*http.Response, error) {
	if c.tlsErr != nil {
		return nil, c.tlsErr
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return nil, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if size >= 0 {
		req.ContentLength = size
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	var conn exchange
	req = req.WithContext(httptrace.WithClientTrace(ctx, conn.trace()))
	limit := c.http.Timeout
	if limit == 0 {
		limit = c.wait
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, c.transportError(ctx, err, &conn, req.URL, limit)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if json.Unmarshal(b, &e) == nil && e.Error.Code != "" {
			msg := e.Error.Message
			if resp.StatusCode == http.StatusUnauthorized && c.token == "" {
				msg += " (no token was sent: set $PLOVER_TOKEN or --token)"
			}
			return nil, &apiError{Status: resp.StatusCode, Code: e.Error.Code, Message: msg, RetryAfter: retryAfter(resp.Header, time.Now())}
		}
		// Not plover's error: another service at --server, a proxy's page,
		// of any size. Said as plover's ("server said 501 http: <!DOCTYPE
		// ...") it read as plover's own refusal.
		return nil, &apiError{Status: resp.StatusCode, Code: "http", Message: foreignAnswer(b), RetryAfter: retryAfter(resp.Header, time.Now()),
			Foreign: method + " " + c.base + path}
	}
	return resp, nil
}

// transportError says how a request that got no answer failed: a scheme
// or certificate that does not match the server (schemeMismatch: nothing
// ran, which the branches below would not have said), no
// connection made (no server there: how to start one), no answer within
// limit (the client's wait), or the connection cut after the request went
// out (the server may have run it: a client that sends it again may run it
// twice), or while it was being sent. A reason ctx was cancelled with (a
// stalled upload's) is the error.
func (c *client) transportError(ctx context.Context, err error, x *exchange, u *url.URL, limit time.Duration) error {
	if cause := context.Cause(ctx); cause != nil && cause != ctx.Err() {
		return fmt.Errorf("the plover server at %s: %w", c.base, cause)
	}
	if m := schemeMismatch(err, x, u); m != nil {
		return fmt.Errorf("the plover server at %s read no request, so nothing ran: %w", c.base, m)
	}
	if !x.connected.Load() {
		return fmt.Errorf("cannot reach the plover server at %s (start one with 'plover serve', or set --server / PLOVER_SERVER): %w", c.base, err)
	}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
		if !x.wrote.Load() {
			return fmt.Errorf("the plover server at %s did not take the whole request within %v: gave up sending it", c.base, limit.Round(time.Millisecond))
		}
		return fmt.Errorf("no answer from the plover server at %s within %v: gave up waiting; the server may still be running the request", c.base, limit.Round(time.Millisecond))
	}
	if !x.wrote.Load() {
		return fmt.Errorf("the connection to the plover server at %s broke while the request was being sent: %w", c.base, err)
	}
	return fmt.Errorf("the plover server at %s closed the connection before answering: the request may have run (%w)", c.base, err)
}

// functionNames lists the server's functions by name.
func (c *client) functionNames() ([]string, error) {
	var resp struct {
		Functions []struct {
			Name string `json:"name"`
		} `json:"functions"`
	}
	if err := c.getJSON("/v1/functions", &resp); err != nil {
		return nil, err
	}
	names := make([]string, len(resp.Functions))
	for i, f := range resp.Functions {
		names[i] = f.Name
	}
	return names, nil
}

func (c *client) getJSON(path string, v any) error {
	resp, err := c.do(http.MethodGet, path, "", nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return c.decode(resp, http.MethodGet, path, v)
}

// decode reads a successful answer's JSON into v. One that is not JSON (a
// proxy's page answered 200, another service on the port) is said with
// the request and what came instead: a bare "invalid character '<'" named
// neither.
func (c *client) decode(resp *http.Response, method, path string, v any) error {
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("%s %s%s answered %s, and not with plover's JSON (Content-Type %q): reading it: %w", method, c.base, path, resp.Status, resp.Header.Get("Content-Type"), err)
	}
	return nil
}

func (c *client) sendJSON(method, path, contentType string, body []byte, v any) error {
	resp, err := c.do(method, path, contentType, bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if v == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		return err
	}
	return c.decode(resp, method, path, v)
}
