package httpapi_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// A pipeline has no max_input_bytes of its own (its plover.json may set
// only name, kind and steps): the bound of its body is its first step's.
// A 413 for a body over it must name that step, as the engine's refusal of
// a small body (read before any handler) does, not send the author to the
// pipeline's max_input_bytes, which no deploy would accept.
func TestPipelineBodyBoundNamesItsStep(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	m := testkit.Manifest("small")
	m.MaxInputBytes = 3136
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	dir := testkit.PipelineDir(t, "p", "small", "small")
	fi := testkit.Deploy(t, e, dir)
	addr := strings.TrimPrefix(testkit.Serve(t, e, httpapi.Options{MaxBodyBytes: 256 << 20}), "http://")
	for _, tc := range []struct {
		name, route, ctype string
		size               int
	}{
		{"v1, read before the handler (engine refuses)", "/v1/functions/p/invoke", "application/octet-stream", 4000},
		{"v1, announced past the bound (refused before the body)", "/v1/functions/p/invoke", "application/octet-stream", 100 << 20},
		{"v2, announced past the bound", "/v2/models/p/infer", "application/json", 100 << 20},
		{"v2 naming its version, announced past the bound", "/v2/models/p/versions/" + fi.Version + "/infer", "application/json", 100 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n", tc.route, tc.ctype, tc.size)
			code, body := firstResponse(t, addr, head+strings.Repeat("x", min(tc.size, 8<<10)), 3*time.Second)
			if code != 413 || !strings.Contains(body, "step 0 (small)") {
				t.Fatalf("%d %s; want 413 naming the step whose max_input_bytes bounds the pipeline's input (step 0 (small))", code, body)
			}
		})
	}
}
