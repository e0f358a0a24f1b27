package httpapi_test

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/funclog"
	"github.com/plover-run/plover/gate"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// hostGet sends GET url naming host in its Host header (and token, if
// any), and returns the status and body.
func hostGet(t *testing.T, url, host, token string) (int, string) {
	t.Helper()
	hdr := map[string]string{"Host": host}
	if token != "" {
		hdr["Authorization"] = "Bearer " + token
	}
	code, _, b := v2Do(t, "GET", url, hdr, nil)
	return code, strings.TrimSpace(string(b))
}

// serveOn serves srv on ln until the test ends.
func serveOn(t *testing.T, srv *httpapi.Server, ln net.Listener, serve func(net.Listener) error) string {
	t.Helper()
	go serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return "http://127.0.0.1:" + strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

// A server without tokens lets anyone who reaches the port do anything
// (README, Security), and listens on loopback. A web page the operator
// visits reaches it too, through the browser, by DNS rebinding: its own
// name made to resolve to 127.0.0.1, its requests then naming that name in
// Host. Such a server answers only a Host that names the loopback
// (localhost or a loopback address, any port), with 421 otherwise, its
// metrics listener alike. A server with tokens, or one without on a
// non-loopback address (--insecure-no-auth: the operator's choice), serves
// whatever Host.
func TestOpenLoopbackServerAnswersOnlyLoopbackHosts(t *testing.T) {
	adm := logAdmin{store: funclog.New(nil), followers: make(chan *funclog.Follower, 1)}
	adm.store.Sink("f").Add(logLine("tenant secret printed by f"))
	open := httpapi.New(frontdoor.New(frontdoor.Config{}), adm, httpapi.Options{})
	base := testkit.ServeWith(t, open)
	url, port := base+"/v1/functions/f/logs", base[strings.LastIndexByte(base, ':'):]
	for _, c := range []struct {
		host string
		ok   bool
	}{
		{"127.0.0.1" + port, true},
		{"localhost" + port, true},
		{"LocalHost:9999", true},
		{"localhost.", true},
		{"[::1]" + port, true},
		{"127.0.0.2", true},
		{"rebind.attacker.example:8080", false},
		{"attacker.example", false},
		{"localhost.attacker.example" + port, false},
		{"127.0.0.1.nip.io" + port, false},
		{"10.0.0.1" + port, false},
		{"[::ffff:10.0.0.1]" + port, false},
		{"[::1", false},
	} {
		code, body := hostGet(t, url, c.host, "")
		switch {
		case c.ok && code != 200:
			t.Errorf("Host %q: %d %s, want 200", c.host, code, body)
		case !c.ok && (code != http.StatusMisdirectedRequest || !strings.Contains(body, "misdirected_request") ||
			!strings.Contains(body, "is not this server's loopback name") || strings.Contains(body, "tenant secret")):
			t.Errorf("Host %q: %d %s, want 421 saying why", c.host, code, body)
		}
	}

	// Its metrics listener (--metrics-listen, never authenticated) alike.
	mln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metrics := serveOn(t, open, mln, open.ServeMetrics) + "/metrics"
	if code, body := hostGet(t, metrics, "rebind.attacker.example", ""); code != http.StatusMisdirectedRequest {
		t.Errorf("metrics for a foreign Host: %d %.200s, want 421", code, body)
	}
	if code, body := hostGet(t, metrics, "localhost", ""); code != 200 {
		t.Errorf("metrics for localhost: %d %.200s, want 200", code, body)
	}

	// With tokens on loopback: the token is what is checked.
	const tok = "a-token-for-any-host"
	table, err := auth.Parse(strings.NewReader(auth.Line("dash", auth.Read, auth.Hash(tok), nil, auth.Limits{})+"\n"), "tokens")
	if err != nil {
		t.Fatal(err)
	}
	guarded := testkit.ServeWith(t, httpapi.New(frontdoor.New(frontdoor.Config{Gate: gate.New(table, nil)}), adm, httpapi.Options{}))
	if code, body := hostGet(t, guarded+"/v1/functions/f/logs", "plover.example.com", tok); code != 200 {
		t.Errorf("a server with tokens, for another Host: %d %s, want 200", code, body)
	}

	// Without tokens on every address (--insecure-no-auth), even when
	// reached through loopback: the operator chose it.
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Skipf("cannot listen on 0.0.0.0: %v", err)
	}
	exposed := httpapi.New(frontdoor.New(frontdoor.Config{}), adm, httpapi.Options{})
	if code, body := hostGet(t, serveOn(t, exposed, ln, exposed.Serve)+"/v1/functions/f/logs", "plover.example.com", ""); code != 200 {
		t.Errorf("a server without tokens on 0.0.0.0, for another Host: %d %s, want 200", code, body)
	}
}
