// Package cli implements the plover command's subcommands.
package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
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
// fragment, or a value that does not parse. Such a value is a command line
// that cannot run, not a server that cannot be reached.
func checkServerURL(s string) error {
	if s == "" {
		return nil
	}
	raw := s
	if !strings.Contains(raw, "://") {
		raw = "http://" + raw
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
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("port %s: want 1..65535", p)
		}
	}
	return nil
}

// client talks to a plover server's HTTP API.
type client struct {
	base   string
	token  string
	http   *http.Client
	tlsErr error // a --cacert that cannot be used: reported by the first call
}

func newClient(server, token, cacert string) *client {
	c := &client{base: serverURL(server), token: token, http: &http.Client{Timeout: 10 * time.Minute}}
	cfg, err := tlsConfig(cacert)
	c.tlsErr = err
	if cfg != nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = cfg
		c.http.Transport = tr
	}
	return c
}

// apiError is the server's JSON error, with the status it came with.
type apiError struct {
	Status  int
	Code    string
	Message string
}

func (e *apiError) Error() string {
	return fmt.Sprintf("server said %d %s: %s", e.Status, e.Code, e.Message)
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
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the plover server at %s (start one with 'plover serve', or set --server / PLOVER_SERVER): %w", c.base, err)
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
			return nil, &apiError{Status: resp.StatusCode, Code: e.Error.Code, Message: msg}
		}
		return nil, &apiError{Status: resp.StatusCode, Code: "http", Message: strings.TrimSpace(string(b))}
	}
	return resp, nil
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
	return json.NewDecoder(resp.Body).Decode(v)
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
	return json.NewDecoder(resp.Body).Decode(v)
}
