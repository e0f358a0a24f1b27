package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// tlsPloverServer serves the real HTTP API behind plover serve's own
// listener with --tls-cert (the connection guard, then TLS) and returns
// its https URL, the CA file that trusts it, and its engine.
func tlsPloverServer(t *testing.T) (string, string, *engine.Engine) {
	t.Helper()
	ca, cert, key, _ := testkit.WriteCerts(t, t.TempDir())
	d, err := newFrontDoor(&serveFlags{listen: "127.0.0.1:0", tlsCert: cert, tlsKey: key}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ln, scheme, err := d.listen(ctx)
	if err != nil {
		t.Fatal(err)
	}
	e := testkit.Engine(t, engine.Config{})
	srv := httpapi.New(testkit.Door(e, nil, nil), e.Control(), httpapi.Options{})
	go srv.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return scheme + "://" + ln.Addr().String(), ca, e
}

// A --server whose scheme or certificate does not match the server, or
// that is no plover server, is told so by every client command as plover
// health tells it: each said "cannot reach ... (start one with 'plover
// serve')" or "closed the connection before answering: the request may
// have run" (nothing had: a TLS listener never reads plain HTTP), or
// "server said 501 http: <!DOCTYPE HTML>" as if plover had refused.
func TestMismatchedServerToldByEveryCommand(t *testing.T) {
	tlsURL, ca, e := tlsPloverServer(t)
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("fn"), nil))
	plain, _ := healthServer(t)
	// What python3 -m http.server answers a POST, PUT or DELETE.
	const page = "<!DOCTYPE HTML>\n<html lang=\"en\">\n    <head>\n        <meta charset=\"utf-8\">\n        <title>Error response</title>\n    </head>\n    <body>\n        <h1>Error response</h1>\n        <p>Error code: 501</p>\n    </body>\n</html>\n"
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html;charset=utf-8")
		w.WriteHeader(http.StatusNotImplemented)
		io.WriteString(w, page)
	}))
	t.Cleanup(other.Close)
	httpToTLS := "http://" + strings.TrimPrefix(tlsURL, "https://")
	httpsToPlain := "https://" + strings.TrimPrefix(plain, "http://")

	in := filepath.Join(t.TempDir(), "in")
	if err := os.WriteFile(in, make([]byte, 64<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := testkit.BundleDir(t, testkit.Manifest("fn"), nil)
	commands := map[string][]string{
		"invoke": {"invoke", "fn", "--in", in, "--out", filepath.Join(t.TempDir(), "out")},
		"deploy": {"deploy", dir},
		"rm":     {"rm", "fn"},
	}
	tests := []struct {
		name   string
		server string
		code   int
		want   []string
	}{
		{"http to a TLS listener", httpToTLS, 1, []string{
			"the plover server at " + httpToTLS + " read no request, so nothing ran: the server speaks TLS there",
			"(use " + tlsURL + ")"}},
		{"https without its CA", tlsURL, 1, []string{
			"the plover server at " + tlsURL + " read no request, so nothing ran: TLS: the server's certificate is not trusted (x509: ",
			"give its CA with --cacert or $PLOVER_CACERT"}},
		{"https to a plain server", httpsToPlain, 1, []string{
			"read no request, so nothing ran: TLS handshake failed: the server speaks plain HTTP there (use " + plain + ")"}},
		{"another service", other.URL, 1, []string{
			" " + other.URL + "/v1/functions/fn", " answered 501 Not Implemented: not plover's answer (another service at --server, or a proxy's page?): it began \"<!DOCTYPE HTML>\\n<html lang=\\\"en\\\">",
			fmt.Sprintf("... (%d bytes)", len(page)-1)}}, // its newline trimmed
		{"the API's path", plain + "/v1", 2, []string{
			"--server \"" + plain + "/v1\": the API's path in it: give the server's base URL, " + plain + " (each command adds /v1/... itself)"}},
		{"the API's path, a slash after", plain + "/v1/", 2, []string{"give the server's base URL, " + plain + " "}},
	}
	for _, tt := range tests {
		for _, cmd := range []string{"invoke", "deploy", "rm"} {
			t.Run(tt.name+"/"+cmd, func(t *testing.T) {
				_, errs, code := runMain(t, nil, append(commands[cmd], "--server", tt.server)...)
				if code != tt.code {
					t.Fatalf("exit %d, want %d; stderr %q", code, tt.code, errs)
				}
				for _, w := range append(tt.want, "plover "+cmd+": ") {
					if !strings.Contains(errs, w) {
						t.Errorf("stderr %q, want %q in it", errs, w)
					}
				}
				for _, no := range []string{"may have run", "start one", "server said"} {
					if strings.Contains(errs, no) {
						t.Errorf("stderr %q says %q", errs, no)
					}
				}
			})
		}
	}
	// Nothing ran: rm over plain HTTP left the function deployed, and the
	// server trusted with its CA answers.
	out, errs, code := runMain(t, nil, "ls", "--server", tlsURL, "--cacert", ca)
	if code != 0 || !slices.Contains(e.Names(), "fn") || !strings.Contains(out, "\nfn ") {
		t.Fatalf("ls with the CA: exit %d, stdout %q, stderr %q; the engine has %q; want fn still deployed", code, out, errs, e.Names())
	}
}

// The TLS probe tells a TLS listener from a server that cuts plain HTTP
// for another reason, which "may have run" still describes.
func TestSpeaksTLS(t *testing.T) {
	tlsURL, _, _ := tlsPloverServer(t)
	plain, _ := healthServer(t)
	cutter := newRawServer(t, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	for _, tt := range []struct {
		name, hostport string
		want           bool
	}{
		{"plover serve --tls-cert", strings.TrimPrefix(tlsURL, "https://"), true},
		{"plain plover serve", strings.TrimPrefix(plain, "http://"), false},
		{"a server that closes", strings.TrimPrefix(cutter.url(), "http://"), false},
		{"nothing listens", closed, false},
	} {
		if got := speaksTLS(tt.hostport); got != tt.want {
			t.Errorf("%s: speaksTLS = %v, want %v", tt.name, got, tt.want)
		}
	}
}
