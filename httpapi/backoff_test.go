package httpapi_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// A version backing off after repeated failures (here a plover_load that
// always fails) answers 503 with Retry-After, the whole seconds until the
// back-off ends, on /v1 and /v2, as README's error table says a 503 does;
// its message says what else lifts it: a redeploy, which for the same
// bytes takes --force (a plain one is "unchanged").
func TestBackoffSaysWhenToRetry(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.FailingLoadBundleDir(t, "h"))
	url := testkit.Serve(t, e, httpapi.Options{})
	for i := 0; ; i++ {
		if i == 10 {
			t.Fatal("10 requests to a function whose load fails, and no back-off")
		}
		resp, body := testkit.Post(t, "POST", url+"/v1/functions/h/invoke", "application/octet-stream", []byte{1})
		if resp.StatusCode != 503 {
			continue
		}
		if !strings.Contains(string(body), "is backing off") || !strings.Contains(string(body), "or a redeploy (plover deploy --force for the same bytes)") {
			t.Fatalf("503 %s; want the back-off, with what lifts it", body)
		}
		break
	}
	for _, path := range []string{"/v1/functions/h/invoke", "/v2/models/h/infer"} {
		ctype, in := "application/octet-stream", `x`
		if strings.HasPrefix(path, "/v2") {
			ctype, in = "application/json", `{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[1],"data":[1]}]}`
		}
		resp, body := testkit.Post(t, "POST", url+path, ctype, []byte(in))
		ra := resp.Header.Get("Retry-After")
		if n, err := strconv.Atoi(ra); resp.StatusCode != 503 || err != nil || n < 1 || n > 60 {
			t.Fatalf("%s: %d Retry-After %q %s; want 503 with Retry-After 1..60 (the back-off's minute)", path, resp.StatusCode, ra, body)
		}
	}
}
