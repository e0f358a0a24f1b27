package httpapi_test

import (
	"strings"
	"sync/atomic"
	"testing"

	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// README's advice behind a reverse proxy on the same machine: "have the
// proxy send Host: localhost". The console, opened at the proxy's name,
// then sends its own origin, which is not Host: every POST, PUT and
// DELETE it made was 403, though the browser says same-origin. A browser's
// Sec-Fetch-Site now decides where it is sent.
func TestConsoleBehindAProxySendingHostLocalhost(t *testing.T) {
	adm := csrfAdmin{rollbacks: new(atomic.Int32), gcs: new(atomic.Int32), deletes: new(atomic.Int32)}
	base := testkit.ServeWith(t, httpapi.New(frontdoor.New(frontdoor.Config{}), adm, httpapi.Options{}))
	code, body := send(t, "POST", base+"/v1/functions/f/rollback", "application/json", `{"version":"0123456789abcdef"}`,
		map[string]string{"Host": "localhost", "Origin": "https://plover.example.com", "Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors"})
	if code != 200 {
		t.Errorf("the console's rollback through a proxy sending Host: localhost (as README advises): %d %s", code, body)
	}
}

// Behind a plain-HTTP proxy that rewrites Host (to localhost, as README
// advises for a server without tokens), the browser sends Origin naming
// the proxy and, the page being no secure context, no Sec-Fetch-Site: the
// console's POSTs were 403. The operator names the proxy's origin
// (plover serve --origin); only that origin passes, and a rollback from
// another site's page is still refused.
func TestNamedOriginBehindAPlainHTTPProxy(t *testing.T) {
	adm := csrfAdmin{rollbacks: new(atomic.Int32), gcs: new(atomic.Int32), deletes: new(atomic.Int32)}
	const rollback, version = "/v1/functions/f/rollback", `{"version":"0123456789abcdef"}`
	proxied := func(origin string) map[string]string {
		return map[string]string{"Host": "localhost", "Origin": origin}
	}
	plain := testkit.ServeWith(t, httpapi.New(frontdoor.New(frontdoor.Config{}), adm, httpapi.Options{}))
	if code, body := send(t, "POST", plain+rollback, "application/json", version, proxied("http://gpu-box:8080")); code != 403 || !strings.Contains(body, "--origin") {
		t.Errorf("without --origin, the console's rollback through the proxy: %d %s, want 403 naming --origin", code, body)
	}

	named := testkit.ServeWith(t, httpapi.New(frontdoor.New(frontdoor.Config{}), adm,
		httpapi.Options{Origins: []string{"http://GPU-box:8080", "https://plover.example.com:443/"}}))
	for _, origin := range []string{"http://gpu-box:8080", "https://plover.example.com"} {
		before := adm.rollbacks.Load()
		if code, body := send(t, "POST", named+rollback, "application/json", version, proxied(origin)); code != 200 || adm.rollbacks.Load() != before+1 {
			t.Errorf("a rollback from the named origin %s: %d %s, want 200 and one rollback", origin, code, body)
		}
	}
	for _, c := range []struct{ why, origin string }{
		{"another site", "http://attacker.example"},
		{"the named host on another port", "http://gpu-box:8081"},
		{"the named host over the other scheme", "https://gpu-box:8080"},
		{"a name that starts with the named one", "http://gpu-box:8080.attacker.example"},
	} {
		before := adm.rollbacks.Load()
		if code, body := send(t, "POST", named+rollback, "application/json", version, proxied(c.origin)); code != 403 || adm.rollbacks.Load() != before {
			t.Errorf("a rollback from %s (%s) with --origin set: %d %s, want 403", c.origin, c.why, code, body)
		}
	}
}

func TestParseOrigin(t *testing.T) {
	for in, want := range map[string]string{
		"http://gpu-box:8080":         "http://gpu-box:8080",
		"HTTPS://Plover.Example.com/": "https://plover.example.com",
		"http://gpu-box:80":           "http://gpu-box",
		"https://gpu-box:443":         "https://gpu-box",
		"https://gpu-box:80":          "https://gpu-box:80",
		"http://[::1]:8080":           "http://[::1]:8080",
		"http://10.0.0.7":             "http://10.0.0.7",
	} {
		if got, err := httpapi.ParseOrigin(in); err != nil || got != want {
			t.Errorf("ParseOrigin(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "gpu-box:8080", "gpu-box", "ftp://gpu-box", "http://", "http://gpu-box/ui/",
		"http://gpu-box?x=1", "http://gpu-box#f", "http://u@gpu-box", "http://gpu-box:", "http://gpu-box:port", "null", "*"} {
		if got, err := httpapi.ParseOrigin(in); err == nil {
			t.Errorf("ParseOrigin(%q) = %q, want an error", in, got)
		}
	}
}
