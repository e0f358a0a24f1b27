package httpapi_test

// Review rA (bug hunt, read-only): tests that show defects in the routes
// that serve function output and feed the console. Each fails on the code
// it was written against; see the report for the fix each suggests.

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// csrfAdmin records the state-changing calls a request reached.
type csrfAdmin struct {
	httpapi.Admin
	rollbacks, gcs *atomic.Int32
}

func (a csrfAdmin) Rollback(context.Context, string, string) (api.FunctionInfo, error) {
	a.rollbacks.Add(1)
	return api.FunctionInfo{Name: "f"}, nil
}

func (a csrfAdmin) GC(context.Context, time.Duration) ([]string, error) {
	a.gcs.Add(1)
	return nil, nil
}

// The console's rollback button posts JSON; the route reads its body as
// JSON whatever its Content-Type, and checks neither Origin nor
// Sec-Fetch-Site. On an open server (no tokens: nothing else stands in
// the way) a page on any site can make it with a "simple" cross-origin
// request that needs no CORS preflight: fetch(url, {method: "POST", mode:
// "no-cors", body: '{"version":"..."}'}) sends text/plain. POST /v1/gc
// likewise. The invoke route, by contrast, refuses text/plain (415).
func TestReviewRACrossSiteSimplePostChangesState(t *testing.T) {
	adm := csrfAdmin{rollbacks: new(atomic.Int32), gcs: new(atomic.Int32)}
	base := testkit.ServeWith(t, httpapi.New(frontdoor.New(frontdoor.Config{}), adm, httpapi.Options{}))
	for _, tc := range []struct {
		name, path, body string
		calls            *atomic.Int32
	}{
		{"rollback", "/v1/functions/f/rollback", `{"version":"0123456789abcdef"}`, adm.rollbacks},
		{"gc", "/v1/gc?grace=0s", "", adm.gcs},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest("POST", base+tc.path, strings.NewReader(tc.body))
			// What a browser sends for a cross-site no-cors fetch or form.
			req.Header.Set("Content-Type", "text/plain;charset=UTF-8")
			req.Header.Set("Origin", "https://attacker.example")
			req.Header.Set("Sec-Fetch-Site", "cross-site")
			req.Header.Set("Sec-Fetch-Mode", "no-cors")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if n := tc.calls.Load(); n != 0 || resp.StatusCode == 200 {
				t.Fatalf("a cross-site text/plain POST %s: %d, and it reached the control plane %d time(s)", tc.path, resp.StatusCode, n)
			}
		})
	}
}
