package httpapi_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// A pipeline's version other than its current one runs only for a token
// that may invoke each of its steps, as a rollback to it needs: a
// redeploy without a step withdraws that step from the pipeline's callers
// (README, "Pipelines do not escalate"), and its older version, still in
// the record and callable by its id, ran it for a token with invoke on
// the pipeline alone. The current version, named or not, needs nothing
// more. The refusal names no step: one the token may not use may be
// another tenant's function (a review's finding).
func TestAnOlderPipelineVersionRunsOnlyForItsStepsInvokers(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	old, cur := testkit.WithdrawnStep(t, e)
	lines := []string{
		auth.Line("caller", auth.Invoke, auth.Hash("caller-token"), []string{"p"}, auth.Limits{}),
		auth.Line("trusted", auth.Invoke, auth.Hash("trusted-token"), []string{"p", "secret"}, auth.Limits{}),
	}
	tab, err := auth.Parse(strings.NewReader(strings.Join(lines, "\n")+"\n"), "tokens")
	if err != nil {
		t.Fatal(err)
	}
	url := testkit.ServeWith(t, httpapi.New(testkit.Door(e, tab, nil), e.Control(), httpapi.Options{}))
	for _, tc := range []struct {
		name, token, path string
		want              int
		says              string
		big               bool // a body past fasthttp's pre-read: refused before it is read
	}{
		{"the current version", "caller-token", "/v2/models/p/infer", 200, "", false},
		{"the current version by its id", "caller-token", "/v2/models/p/versions/" + cur + "/infer", 200, "", false},
		{"an older version", "caller-token", "/v2/models/p/versions/" + old + "/infer", 403, "which this one may not", false},
		{"an older version by a prefix", "caller-token", "/v2/models/p/versions/" + old[:8] + "/infer", 403, "current version", false},
		{"an older version, a large body", "caller-token", "/v2/models/p/versions/" + old + "/infer", 403, "which this one may not", true},
		{"an older version, its steps' invoker", "trusted-token", "/v2/models/p/versions/" + old + "/infer", 200, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := `{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[2],"data":[1,2]}]}`
			if tc.big {
				// Its headers and a quarter of it (fasthttp reads 8 KiB
				// before the handler runs): the refusal comes before the
				// rest.
				c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", tc.path, tc.token, 64<<10, strings.Repeat(" ", 16<<10))
				c.SetReadDeadline(time.Now().Add(5 * time.Second))
				answer, _ := io.ReadAll(c)
				if !strings.HasPrefix(string(answer), fmt.Sprintf("HTTP/1.1 %d ", tc.want)) || !strings.Contains(string(answer), tc.says) || strings.Contains(string(answer), "secret") {
					t.Fatalf("headers of a 64 KiB body for %s: %q; want %d saying %s before the body", tc.path, answer, tc.want, tc.says)
				}
				return
			}
			req, err := http.NewRequest("POST", url+tc.path, strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+tc.token)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			out, _ := io.ReadAll(resp.Body)
			if code := resp.StatusCode; code != tc.want || !strings.Contains(string(out), tc.says) || tc.token == "caller-token" && strings.Contains(string(out), "secret") {
				t.Fatalf("%s: %d %s; want %d saying %s", tc.path, resp.StatusCode, out, tc.want, tc.says)
			}
		})
	}
}
