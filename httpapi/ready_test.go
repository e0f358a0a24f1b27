package httpapi_test

import (
	"strings"
	"testing"

	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// /v2/models/NAME/ready is whether the model takes inference requests
// now: a function whose library a device refused (a dependency missing:
// every request fails with 422, and will until a redeploy), or a pipeline
// that runs it, is not ready (503, ready false), as Triton answers for a
// model that failed to load; both answered 200 ready. A function beside
// it stays ready.
func TestModelReadyOfAFunctionThatFailedToLoad(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.UnloadableBundleDir(t, testkit.Manifest("broken")))
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	pdir := testkit.PipelineDir(t, "p", "echo", "broken")
	testkit.Deploy(t, e, pdir)
	url := testkit.Serve(t, e, httpapi.Options{})
	infer := []byte(`{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[1],"data":[1]}]}`)
	for range 2 {
		if code, _, body := v2Do(t, "POST", url+"/v2/models/broken/infer", nil, infer); code != 422 {
			t.Fatalf("infer of broken: %d %s, want 422 (its library refused)", code, body)
		}
		for _, name := range []string{"broken", "p"} {
			code, _, body := v2Do(t, "GET", url+"/v2/models/"+name+"/ready", nil, nil)
			if code != 503 || !strings.Contains(string(body), `"ready":false`) {
				t.Fatalf("%s/ready after broken's load failed: %d %s, want 503 ready false", name, code, body)
			}
		}
	}
	if code, _, body := v2Do(t, "GET", url+"/v2/models/echo/ready", nil, nil); code != 200 || !strings.Contains(string(body), `"ready":true`) {
		t.Fatalf("echo/ready: %d %s", code, body)
	}
}
