package httpapi_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// TestBodyPastItsDeadlineIsCounted: a request whose body is still
// arriving at its deadline gets 504 before the engine sees it, and is
// counted in its function's requests and errors (plover ls), as /metrics
// counts it under its code (under _unknown until the function has
// answered once: README, metrics); it was in /metrics only.
func TestBodyPastItsDeadlineIsCounted(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	base := testkit.Serve(t, e, httpapi.Options{})
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nX-Plover-Timeout-Ms: 200\r\nContent-Length: 60000\r\n\r\n")
	c.Write(make([]byte, 20000)) // and the rest never comes
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 504 {
		t.Fatalf("a body still arriving at its deadline: %d %s; want 504", resp.StatusCode, body)
	}
	fi, err := e.Control().Function(t.Context(), "echo")
	if err != nil || fi.Requests != 1 || fi.ClientErrors != 0 || fi.Errors != 1 {
		t.Fatalf("echo: %d requests, %d client errors, %d errors (%v); want 1, 0, 1", fi.Requests, fi.ClientErrors, fi.Errors, err)
	}
}

// A pipeline whose step was deleted answers 404 whatever its request's
// body; its counts (plover ls) must not depend on the body's size either.
// A body over what fasthttp reads with the headers is admitted before it
// is read, and that admission's refusal was counted for the pipeline,
// where the same refusal met by a small body's invoke was not.
func TestRefusalCountsDoNotDependOnTheBody(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	testkit.Deploy(t, e, testkit.PipelineDir(t, "pl", "echo"))
	base := testkit.Serve(t, e, httpapi.Options{})
	if resp, body := testkit.Post(t, "POST", base+"/v1/functions/pl/invoke", "application/octet-stream", make([]byte, 16)); resp.StatusCode != 200 {
		t.Fatalf("pipeline: %d %s", resp.StatusCode, body)
	}
	if err := e.Control().Delete(t.Context(), "echo", true); err != nil {
		t.Fatal(err)
	}
	var counts []string
	for _, n := range []int{100, 20000} {
		if resp, body := testkit.Post(t, "POST", base+"/v1/functions/pl/invoke", "application/octet-stream", make([]byte, n)); resp.StatusCode != 404 {
			t.Fatalf("%d-byte body to a pipeline whose step is gone: %d %s, want 404", n, resp.StatusCode, body)
		}
		fi, err := e.Control().Function(t.Context(), "pl")
		if err != nil {
			t.Fatal(err)
		}
		counts = append(counts, fmt.Sprintf("%d-byte body: %d requests, %d client errors, %d errors", n, fi.Requests, fi.ClientErrors, fi.Errors))
	}
	if strings.TrimPrefix(counts[0], "100-byte body") != strings.TrimPrefix(counts[1], "20000-byte body") {
		t.Fatalf("the same refusal counted by the body's size:\n%s", strings.Join(counts, "\n"))
	}
}
