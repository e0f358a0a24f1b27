package httpapi_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// What a token reads (the listing, a function's view and versions with
// their tenants, the metrics, its output) is that token's to see, not the
// browser's to keep: the console fetches these with the user's token, and
// a response without Cache-Control is storable (RFC 9111: 200 is
// heuristically cacheable), so Chromium wrote them to its disk cache, where
// they outlived the sign-out and the tab's sessionStorage. The logs route
// already said no-store; every answer behind the gate must.
func TestAuthenticatedReadsAreNotStored(t *testing.T) {
	tok, err := auth.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	tab, err := auth.Parse(strings.NewReader(auth.Line("ops", auth.Admin, auth.Hash(tok), nil, auth.Limits{})+"\n"), "tokens")
	if err != nil {
		t.Fatal(err)
	}
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	base := testkit.ServeTokens(t, e, tab, httpapi.Options{})
	for _, p := range []string{"/v1/functions", "/v1/functions/echo", "/v1/functions/echo/versions", "/metrics",
		"/v1/functions/nothing", "/v2/models/echo"} {
		req, _ := http.NewRequest("GET", base+p, nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if cc := resp.Header.Get("Cache-Control"); !strings.Contains(cc, "no-store") {
			t.Errorf("GET %s (%d): Cache-Control %q, want no-store", p, resp.StatusCode, cc)
		}
	}
}
