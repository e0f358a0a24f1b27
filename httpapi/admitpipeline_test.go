package httpapi_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// A pipeline whose first step's queue is full refuses a request with 429
// whether the refusal is met before the body (a body over what fasthttp
// reads with the headers: Door.Admit) or by Invoke (a small body): either
// way it is one of the pipeline's requests, in plover ls and in /metrics,
// under the name the client invoked, not its first step's.
func TestPipelineRefusalBeforeTheBodyIsThePipelines(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	reg := prometheus.NewRegistry()
	url := testkit.Serve(t, e, httpapi.Options{Registry: reg})
	fillFn(t, e, url)
	testkit.Deploy(t, e, testkit.PipelineDir(t, "pl", "fn"))
	counts := func() string {
		pl, err := e.Control().Function(t.Context(), "pl")
		if err != nil {
			t.Fatal(err)
		}
		fn, err := e.Control().Function(t.Context(), "fn")
		if err != nil {
			t.Fatal(err)
		}
		n, _ := testkit.Counter(t, reg, "plover_requests_total", map[string]string{"function": "pl", "code": "429"})
		return fmt.Sprintf("pl %d requests, %d client errors, %d errors, %v 429s in /metrics; fn %d requests, %d client errors",
			pl.Requests, pl.ClientErrors, pl.Errors, n, fn.Requests, fn.ClientErrors)
	}
	var got []string
	for _, n := range []int{100, 32 << 10} { // Invoke's refusal, then Admit's
		before := counts()
		resp, body := testkit.Post(t, "POST", url+"/v1/functions/pl/invoke", "application/octet-stream", make([]byte, n))
		if resp.StatusCode != 429 {
			t.Fatalf("%d-byte body to a pipeline whose first step's queue is full: %d %s, want 429", n, resp.StatusCode, body)
		}
		got = append(got, fmt.Sprintf("%d-byte body: %s -> %s", n, before, counts()))
	}
	// The log shows which path refused each: Invoke's refusal is also a
	// request of fn's (its step ran as one), Admit's never reached fn.
	t.Log(strings.Join(got, "\n"))
	if pl, err := e.Control().Function(t.Context(), "pl"); err != nil || pl.Requests != 2 || pl.ClientErrors != 2 {
		t.Errorf("pl: want both 429s counted as its requests and client errors\n%s", strings.Join(got, "\n"))
	}
	if n, _ := testkit.Counter(t, reg, "plover_requests_total", map[string]string{"function": "pl", "code": "429"}); n != 2 {
		t.Errorf("/metrics: %v 429s for pl, want 2\n%s", n, strings.Join(got, "\n"))
	}
}
