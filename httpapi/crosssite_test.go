package httpapi_test

import (
	"context"
	"encoding/json"
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
	rollbacks, gcs, deletes *atomic.Int32
}

func (a csrfAdmin) Rollback(context.Context, string, string) (api.FunctionInfo, error) {
	a.rollbacks.Add(1)
	return api.FunctionInfo{Name: "f"}, nil
}

func (a csrfAdmin) Delete(context.Context, string, bool) error {
	a.deletes.Add(1)
	return nil
}

func (a csrfAdmin) GC(context.Context, time.Duration) ([]string, error) {
	a.gcs.Add(1)
	return nil, nil
}

// A page on any site can send a "simple" request to the server through
// its visitor's browser, with no CORS preflight: fetch(url, {method:
// "POST", mode: "no-cors", body: ...}) sends text/plain, as a form does.
// On a server without tokens nothing else stands in the way, so such a
// request must change nothing: a request that may change something (any
// method but GET and HEAD) is 403 when its Origin is not the server's or
// Sec-Fetch-Site says cross-site, and rollback's body must be JSON (415
// otherwise, as invoke's). The console's own requests (same origin) and
// clients that send no Origin (the CLI) pass.
func TestCrossSiteRequestsChangeNothing(t *testing.T) {
	adm := csrfAdmin{rollbacks: new(atomic.Int32), gcs: new(atomic.Int32), deletes: new(atomic.Int32)}
	base := testkit.ServeWith(t, httpapi.New(frontdoor.New(frontdoor.Config{}), adm, httpapi.Options{}))
	self := base // http://127.0.0.1:PORT, the Origin of the server's own pages
	const (
		rollback = "/v1/functions/f/rollback"
		gc       = "/v1/gc?grace=0s"
		version  = `{"version":"0123456789abcdef"}`
		plain    = "text/plain;charset=UTF-8"
		jsonType = "application/json"
	)
	for _, c := range []struct {
		name, method, path, ctype, body string
		headers                         map[string]string
		code                            int
		says                            string
		calls                           *atomic.Int32
	}{
		{"rollback from another site's page", "POST", rollback, plain, version,
			map[string]string{"Origin": "https://attacker.example", "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}, 403, "Sec-Fetch-Site: cross-site", adm.rollbacks},
		{"gc from another site's page", "POST", gc, plain, "",
			map[string]string{"Origin": "https://attacker.example", "Sec-Fetch-Site": "cross-site"}, 403, "Sec-Fetch-Site: cross-site", adm.gcs},
		{"gc from an older browser (Origin only)", "POST", gc, "", "",
			map[string]string{"Origin": "http://attacker.example"}, 403, `Origin "http://attacker.example" is not this server's`, adm.gcs},
		{"gc from another port of this host", "POST", gc, "", "",
			map[string]string{"Origin": "http://127.0.0.1:1"}, 403, "is not this server's", adm.gcs},
		{"gc from a sandboxed page", "POST", gc, "", "",
			map[string]string{"Origin": "null"}, 403, `Origin "null"`, adm.gcs},
		{"delete from another site's page", "DELETE", "/v1/functions/f", "", "",
			map[string]string{"Sec-Fetch-Site": "cross-site"}, 403, "Sec-Fetch-Site", adm.deletes},
		{"rollback as text/plain without Origin", "POST", rollback, plain, version, nil, 415, "send application/json", adm.rollbacks},
		{"rollback without a Content-Type", "POST", rollback, "", version, nil, 415, "send application/json", adm.rollbacks},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := c.calls.Load()
			code, body := send(t, c.method, base+c.path, c.ctype, c.body, c.headers)
			var e struct{ Error struct{ Message string } }
			if code != c.code || json.Unmarshal([]byte(body), &e) != nil || !strings.Contains(e.Error.Message, c.says) {
				t.Errorf("%d %s, want %d saying %q", code, body, c.code, c.says)
			}
			if c.calls.Load() != before {
				t.Errorf("it reached the control plane")
			}
		})
	}

	// What may: the console's own (same origin, the browser saying so),
	// the CLI's (no Origin), and a read from anywhere (its answer is the
	// browser's to withhold).
	for _, c := range []struct {
		name, method, path, ctype, body string
		headers                         map[string]string
		calls                           *atomic.Int32
	}{
		{"the console's rollback", "POST", rollback, jsonType, version,
			map[string]string{"Origin": self, "Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors"}, adm.rollbacks},
		{"the console's rollback, Origin in capitals", "POST", rollback, "Application/JSON; charset=utf-8", version,
			map[string]string{"Origin": strings.ToUpper(self)}, adm.rollbacks},
		{"the CLI's rollback", "POST", rollback, jsonType, version, nil, adm.rollbacks},
		{"the CLI's gc", "POST", gc, "", "", nil, adm.gcs},
	} {
		before := c.calls.Load()
		if code, body := send(t, c.method, base+c.path, c.ctype, c.body, c.headers); code != 200 || c.calls.Load() != before+1 {
			t.Errorf("%s: %d %s, want 200 and one call", c.name, code, body)
		}
	}
	if code, body := send(t, "GET", base+"/readyz", "", "", map[string]string{"Origin": "https://attacker.example", "Sec-Fetch-Site": "cross-site"}); code != 200 {
		t.Errorf("a cross-site GET: %d %s, want 200", code, body)
	}
}

// send makes one request with a Content-Type (none if "") and returns its
// status and body.
func send(t *testing.T, method, url, ctype, body string, headers map[string]string) (int, string) {
	t.Helper()
	hdr := map[string]string{}
	for k, v := range headers {
		hdr[k] = v
	}
	if ctype != "" {
		hdr["Content-Type"] = ctype
	}
	code, _, b := v2Do(t, method, url, hdr, []byte(body))
	return code, strings.TrimSpace(string(b))
}
