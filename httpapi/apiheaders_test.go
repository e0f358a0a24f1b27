package httpapi_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// Every API answer is data to a browser: an invoke's output (a tenant's
// bytes), a listing, a refusal, an error, a log stream: nosniff, a
// sandboxing CSP, same-origin CORP. The console's pages keep their own
// policy (they run its scripts).
func TestAPIAnswersAreNotPages(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	url := testkit.Serve(t, e, httpapi.Options{})
	for _, tc := range []struct {
		name, method, path, body string
		header                   [2]string
		api                      bool
	}{
		{"an invoke's output", "POST", "/v1/functions/echo/invoke", "<script>alert(1)</script>", [2]string{}, true},
		{"a listing", "GET", "/v1/functions", "", [2]string{}, true},
		{"a 404", "GET", "/v1/functions/none", "", [2]string{}, true},
		{"a wrong method", "DELETE", "/healthz", "", [2]string{}, true},
		{"logs", "GET", "/v1/functions/echo/logs", "", [2]string{}, true},
		{"the metrics", "GET", "/metrics", "", [2]string{}, true},
		{"another site's write", "POST", "/v1/functions/echo/invoke", "x", [2]string{"Sec-Fetch-Site", "cross-site"}, true},
		{"an encoded body", "POST", "/v1/functions/echo/invoke", "x", [2]string{"Content-Encoding", "<x>"}, true},
		{"the console", "GET", "/ui/", "", [2]string{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, url+tc.path, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if tc.header[0] != "" {
				req.Header.Set(tc.header[0], tc.header[1])
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			h := resp.Header
			if h.Get("X-Content-Type-Options") != "nosniff" {
				t.Errorf("%d: X-Content-Type-Options %q, want nosniff", resp.StatusCode, h.Get("X-Content-Type-Options"))
			}
			csp := h.Get("Content-Security-Policy")
			if sandboxed := strings.Contains(csp, "sandbox") && strings.HasPrefix(csp, "default-src 'none'"); sandboxed != tc.api {
				t.Errorf("%d: Content-Security-Policy %q; want the API's sandbox: %v", resp.StatusCode, csp, tc.api)
			}
			if tc.api && h.Get("Cross-Origin-Resource-Policy") != "same-origin" {
				t.Errorf("%d: Cross-Origin-Resource-Policy %q, want same-origin", resp.StatusCode, h.Get("Cross-Origin-Resource-Policy"))
			}
		})
	}
}
