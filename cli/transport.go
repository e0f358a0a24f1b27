package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"
)

// This file is the one place that tells what a failed exchange with a
// server means, for plover health and every client command alike: each
// had its own, and only health's knew a scheme or a certificate that does
// not match the server from a server that is not there.

// exchange records how far a request got: a TCP connection, a connection
// ready for the request (after TLS, for https), the whole request written,
// the first byte of an answer.
type exchange struct {
	dialed, connected, wrote, answered atomic.Bool
}

func (x *exchange) trace() *httptrace.ClientTrace {
	return &httptrace.ClientTrace{
		ConnectDone: func(_, _ string, err error) {
			if err == nil {
				x.dialed.Store(true)
			}
		},
		GotConn: func(httptrace.GotConnInfo) { x.connected.Store(true) },
		WroteRequest: func(i httptrace.WroteRequestInfo) {
			if i.Err == nil {
				x.wrote.Store(true)
			}
		},
		GotFirstResponseByte: func() { x.answered.Store(true) },
	}
}

// tlsProbeWait bounds the TLS handshake schemeMismatch tries, after a
// failure, to learn whether the server speaks TLS. A variable for tests.
var tlsProbeWait = 2 * time.Second

// schemeMismatch says, as an error wrapping the cause, when err is a
// request that u's scheme or the server's certificate kept the server from
// reading (so nothing ran): a certificate not trusted, https:// to a
// plain-HTTP server, or http:// to a TLS listener, which closes plain HTTP
// unread. nil for any other failure.
func schemeMismatch(err error, x *exchange, u *url.URL) error {
	var (
		unknown x509.UnknownAuthorityError
		host    x509.HostnameError
		invalid x509.CertificateInvalidError
		record  tls.RecordHeaderError
		verify  *tls.CertificateVerificationError
	)
	switch {
	case errors.As(err, &unknown), errors.As(err, &host), errors.As(err, &invalid), errors.As(err, &verify):
		return fmt.Errorf("TLS: the server's certificate is not trusted (%w); give its CA with --cacert or $PLOVER_CACERT", tlsCause(err))
	case errors.As(err, &record), strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
		return fmt.Errorf("TLS handshake failed: the server speaks plain HTTP there (use %s)", withScheme(u, "http"))
	case u.Scheme == "http" && x.connected.Load() && !x.answered.Load() && isCut(err) && speaksTLS(u.Host):
		// plover serve --tls-cert reads the plain request's first bytes
		// as a TLS record header, finds none, and closes: no handshake,
		// so no request was ever read.
		return fmt.Errorf("the server speaks TLS there and closed this plain-HTTP request unread, before any TLS handshake (use %s): %w", withScheme(u, "https"), cause(err))
	}
	return nil
}

// isCut is a connection the server ended: closed (EOF) or reset, on the
// read or the write, or closed by the transport under a write still going
// once its read saw that (net.ErrClosed: an upload's body, still sending).
func isCut(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// speaksTLS says whether hostport completes a TLS handshake, or answers
// one with a TLS alert: a server that does speaks TLS there. Its
// certificate is not checked: nothing is sent over the connection, and
// the answer only chooses the advice.
func speaksTLS(hostport string) bool {
	if _, _, err := net.SplitHostPort(hostport); err != nil {
		hostport = net.JoinHostPort(hostport, "80")
	}
	ctx, cancel := context.WithTimeout(context.Background(), tlsProbeWait)
	defer cancel()
	d := tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // a probe: nothing is sent
	c, err := d.DialContext(ctx, "tcp", hostport)
	if err == nil {
		c.Close()
		return true
	}
	var alert tls.AlertError
	return errors.As(err, &alert)
}

// withScheme is u's server with the other scheme, for the advice: the URL
// to give instead.
func withScheme(u *url.URL, scheme string) string {
	v := url.URL{Scheme: scheme, Host: u.Host}
	return v.String()
}

// tlsCause is the verification failure itself, without the URL and the
// method the http client wraps it in.
func tlsCause(err error) error {
	var verify *tls.CertificateVerificationError
	if errors.As(err, &verify) && verify.Err != nil {
		return verify.Err
	}
	return cause(err)
}

// cause unwraps the http client's *url.Error, whose text repeats the method
// and URL that the message already names.
func cause(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// foreignAnswer says that body, an answer with no JSON error object of
// plover's in it, is not plover's answer: another service on the port (an
// HTML page), or a proxy's; its first bytes quoted short.
func foreignAnswer(body []byte) string {
	s := strings.TrimSpace(string(body))
	if s == "" {
		return "an empty body: not plover's answer (another service at --server?)"
	}
	return fmt.Sprintf("not plover's answer (another service at --server, or a proxy's page?): it began %s", quoteStart(s, 60))
}

// quoteStart quotes s's first n bytes, cut between characters, and says
// its length where it was cut: a 200 KB page was printed whole.
func quoteStart(s string, n int) string {
	if len(s) <= n {
		return fmt.Sprintf("%q", s)
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%q... (%d bytes)", s[:cut], len(s))
}
