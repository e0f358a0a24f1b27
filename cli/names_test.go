package cli

import (
	"net/http"
	"strings"
	"testing"

	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// A NAME argument is a function's name, never part of the request's URL:
// one that no function can have ('?', '#', '/', '..') is refused (exit 2)
// before anything is sent. Put into the path as it was, "fn?force=true"
// deleted fn past the guard of the pipeline that runs it, and "../gc"
// reached another route.
func TestNameArgumentsCannotLeaveTheirPath(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	url := testkit.Serve(t, e, httpapi.Options{})
	if _, errs, code := runMain(t, nil, "deploy", testkit.BundleDir(t, testkit.Manifest("fn"), nil), "--server", url); code != 0 {
		t.Fatalf("deploy fn: %d %s", code, errs)
	}
	pipe := testkit.PipelineDir(t, "uses-fn", "fn")
	if _, errs, code := runMain(t, nil, "deploy", pipe, "--server", url); code != 0 {
		t.Fatalf("deploy uses-fn: %d %s", code, errs)
	}
	for _, args := range [][]string{
		{"rm", "fn?force=true"},
		{"rm", "fn#x"},
		{"rm", "../functions/fn"},
		{"versions", "fn/../../gc"},
		{"rollback", "../gc?", "x"},
		{"invoke", "fn/../fn"},
		{"logs", "..%2F"},
		{"bench", "fn?x", "--size", "1", "--requests", "1"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			out, errs, code := runMain(t, nil, append(args, "--server", url)...)
			if code != 2 || !strings.Contains(errs, "NAME") {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit 2 naming NAME", code, out, errs)
			}
		})
	}
	resp, err := http.Get(url + "/v1/functions/fn")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("GET /v1/functions/fn after the commands: %d, want 200 (still deployed)", resp.StatusCode)
	}
}
