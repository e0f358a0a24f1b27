package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/plover-run/plover/api"
)

// plover health's exit statuses. 0 and 2 are every command's (Main): a
// probe that calls it can tell a server that answered "not now" (1) from
// one it never heard (3), which a restart policy may treat differently,
// and neither from a probe that is itself misconfigured (2).
const (
	healthBad         = 1 // the server answered, and not 200
	healthUnreachable = 3 // no answer: refused, timed out, TLS, cut
)

// healthTimeout is plover health's default bound on the whole exchange: a
// probe that waits longer than its scheduler's own timeout is killed and
// says nothing.
const healthTimeout = 3 * time.Second

// healthBodyMax bounds what plover health reads of an answer: /healthz
// lists a few devices, and anything much larger is not plover's.
const healthBodyMax = 1 << 20

const healthLong = `Asks a plover server whether it is healthy (GET /healthz: its devices) or,
with --ready, ready for work (GET /readyz: not while it starts or drains),
for container health checks and scripts. It sends no token: both probes
are open on an --auth-file server, which then tells a probe each device's
health but not why one is unhealthy, nor its memory (a token of the read
scope reads them: GET /healthz with it).

Exit status:
  0  the server answered 200 (a line says so, unless --quiet)
  1  the server answered something else, such as 503: unhealthy, not ready
  2  the command line cannot run (a bad flag, --server or --cacert)
  3  no answer: nothing listens there, no answer within --timeout, TLS failed`

func healthCmd() *command {
	var server, cacert string
	var ready, quiet, asJSON bool
	timeout := healthTimeout
	return &command{
		name: "health", summary: "ask a server whether it is healthy (/healthz) or ready (/readyz); the exit status says",
		long:  healthLong,
		usage: "[--ready] [--timeout 3s] [-q | --json]",
		example: "  plover health                                   # http://127.0.0.1:8080/healthz\n" +
			"  plover health --ready --server https://plover.example:8443 --cacert ca.pem\n" +
			"  plover health --ready -q --timeout 1s && echo serving   # a script: the exit status alone\n" +
			"  plover health --json | jq '.answer.devices[] | select(.healthy | not)'",
		shorthands: map[string]string{"quiet": "q"},
		flags: func(fs *flag.FlagSet) {
			// No --token: the probes need none, and one that has expired
			// must not make a healthy server look down.
			fs.StringVar(&server, "server", "", "server URL (default $PLOVER_SERVER or "+DefaultServer+"); https:// for a server with --tls-cert")
			fs.StringVar(&cacert, "cacert", "", "PEM file of CA certificates to trust for https, besides the system's (default $PLOVER_CACERT)")
			fs.BoolVar(&ready, "ready", false, "ask GET /readyz (ready for work) instead of GET /healthz (devices healthy)")
			fs.DurationVar(&timeout, "timeout", healthTimeout, "give up after this long, connection, TLS and answer included (exit 3)")
			fs.BoolVar(&quiet, "quiet", false, "print nothing when the answer is 200; a failure still says why on stderr")
			fs.BoolVar(&asJSON, "json", false, `print {"url","http_status","answer","error"} whatever the answer (the server's JSON as "answer"); the exit status as without it`)
		},
		run: func(fs *flag.FlagSet, args []string, env *Env) error {
			if timeout <= 0 {
				return usagef(env, "health", "--timeout %v: want a positive duration", timeout)
			}
			c := newClient(server, "", cacert)
			if c.tlsErr != nil {
				return usagef(env, "health", "%v", c.tlsErr)
			}
			c.http.Timeout = timeout
			path := "/healthz"
			if ready {
				path = "/readyz"
			}
			line, res, err := c.health(path, timeout)
			if asJSON {
				if jerr := printJSON(env.Stdout, res); jerr != nil {
					return jerr
				}
				return err
			}
			if err != nil {
				return err
			}
			if !quiet {
				fmt.Fprintln(env.Stdout, line)
			}
			return nil
		},
	}
}

// exitError is a failure with an exit status of its own; Main prints it as
// any other error.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// healthResult is plover health --json's output: the probe's URL, the
// answer's status and body (when it is JSON: plover's /healthz and /readyz
// are) and, for any answer but a 200, why it failed.
type healthResult struct {
	URL        string          `json:"url"`
	HTTPStatus int             `json:"http_status,omitempty"` // 0: no answer
	Answer     json.RawMessage `json:"answer,omitempty"`
	Error      string          `json:"error,omitempty"`
}

// health asks path (/healthz or /readyz) and returns the line to print for
// a 200, or an exitError that says what came back instead, and either way
// the result for --json.
func (c *client) health(path string, timeout time.Duration) (string, healthResult, error) {
	res := healthResult{URL: c.base + path}
	line, err := c.probe(path, timeout, &res)
	if err != nil {
		res.Error = err.Error()
	}
	return line, res, err
}

// probe is health's exchange, filling res's status and answer as they come.
func (c *client) probe(path string, timeout time.Duration, res *healthResult) (string, error) {
	target := res.URL
	req, err := http.NewRequest(http.MethodGet, target, nil)
	if err != nil {
		return "", &exitError{healthUnreachable, fmt.Errorf("GET %s: %w", target, err)}
	}
	req.Header.Set("Accept", "application/json")
	var x exchange
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), x.trace()))
	resp, err := c.http.Do(req)
	if err != nil {
		return "", &exitError{healthUnreachable, fmt.Errorf("GET %s: no answer: %w", target, unreachableReason(err, &x, req.URL, timeout))}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, healthBodyMax))
	res.HTTPStatus = resp.StatusCode
	if err == nil && json.Valid(body) {
		res.Answer = body
	}
	if err != nil && resp.StatusCode == http.StatusOK {
		// The status is the probe's answer (as a kubelet's httpGet reads
		// it); a body cut after it only loses the summary's details.
		return fmt.Sprintf("%s: %s answered 200 (its body was cut: %v)", healthWord(path), target, err), nil
	}
	if resp.StatusCode == http.StatusOK {
		return fmt.Sprintf("%s: %s answered 200%s", healthWord(path), target, healthDetails(path, body)), nil
	}
	return "", &exitError{healthBad, fmt.Errorf("GET %s answered %s: %s", target, resp.Status, answerReason(path, body))}
}

func healthWord(path string) string {
	if path == "/readyz" {
		return "ready"
	}
	return "healthy"
}

// healthDetails is what a 200 from /healthz adds to the line: its devices,
// named, so that a probe's log shows which the server found.
func healthDetails(path string, body []byte) string {
	if path != "/healthz" {
		return ""
	}
	var h struct {
		Devices []api.DeviceHealth `json:"devices"`
	}
	if json.Unmarshal(body, &h) != nil || len(h.Devices) == 0 {
		return ""
	}
	names := make([]string, len(h.Devices))
	for i, d := range h.Devices {
		names[i] = d.Name
	}
	noun := "device"
	if len(names) > 1 {
		noun = "devices"
	}
	return fmt.Sprintf("; %d %s: %s", len(names), noun, strings.Join(names, ", "))
}

// answerReason says why an answer other than 200 is one: the unhealthy
// devices and their errors from /healthz, what a 503 from /readyz means,
// the server's JSON error, or the start of a body that is none of these
// (another service on the port).
func answerReason(path string, body []byte) string {
	var h struct {
		Status  *string            `json:"status"`
		Ready   *bool              `json:"ready"`
		Devices []api.DeviceHealth `json:"devices"`
		Error   struct{ Code, Message string }
	}
	if json.Unmarshal(body, &h) == nil {
		switch {
		case path == "/healthz" && h.Status != nil:
			var bad []string
			for _, d := range h.Devices {
				if !d.Healthy {
					s := "device " + d.Name + " unhealthy"
					if d.Error != "" {
						s += ": " + d.Error
					}
					bad = append(bad, s)
				}
			}
			if len(bad) == 0 {
				return fmt.Sprintf("status %q", *h.Status)
			}
			return fmt.Sprintf("status %q; %s", *h.Status, strings.Join(bad, "; "))
		case path == "/readyz" && h.Ready != nil && !*h.Ready:
			return "not ready: the server is starting (its --repository models still deploying) or draining"
		case h.Error.Code != "":
			return h.Error.Code + ": " + h.Error.Message
		}
	}
	return foreignAnswer(body)
}

// unreachableReason says in a few words why no answer came, and what
// likely fixes it, for a probe's log: refused, timed out (before or after
// the connection), a scheme or certificate that does not match the server
// (schemeMismatch, every command's), an unknown host, or the connection
// cut.
func unreachableReason(err error, x *exchange, u *url.URL, timeout time.Duration) error {
	var (
		dns *net.DNSError
		ne  net.Error
	)
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return errors.New("connection refused: nothing listens there (is plover serve running, with this --listen?)")
	case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
		switch {
		case !x.dialed.Load():
			return fmt.Errorf("no connection within %v (timeout): a firewall dropping it, or the host down", timeout)
		case !x.connected.Load():
			return fmt.Errorf("connected, but no TLS handshake within %v (timeout)", timeout)
		}
		return fmt.Errorf("connected, but no answer within %v (timeout): the server is stuck or overloaded", timeout)
	}
	if m := schemeMismatch(err, x, u); m != nil {
		return m
	}
	switch {
	case errors.As(err, &dns):
		return fmt.Errorf("cannot resolve %s: %s", dns.Name, dns.Err)
	case x.connected.Load():
		return fmt.Errorf("the connection was cut before an answer: %w", cause(err))
	}
	return cause(err)
}
