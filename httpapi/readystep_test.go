package httpapi_test

import (
	"context"
	"strings"
	"testing"

	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// A pipeline whose step's function was deleted (plover rm --force) still
// exists, but every request to it fails before it runs (404 at that
// step): its /v2 ready is 503 ready false, as for a step whose library
// was refused, and its metadata 503 naming the step, not a 404 that says
// the model itself is unknown.
func TestModelReadyOfAPipelineWhoseStepWasDeleted(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("gone"), nil))
	pdir := testkit.PipelineDir(t, "p", "echo", "gone")
	testkit.Deploy(t, e, pdir)
	if err := e.Control().Delete(context.Background(), "gone", true); err != nil {
		t.Fatal(err)
	}
	url := testkit.Serve(t, e, httpapi.Options{})
	infer := []byte(`{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[1],"data":[1]}]}`)
	if code, _, body := v2Do(t, "POST", url+"/v2/models/p/infer", nil, infer); code != 404 || !strings.Contains(string(body), "step 1 (gone)") {
		t.Fatalf("infer of p: %d %s, want 404 naming step 1 (gone)", code, body)
	}
	code, _, body := v2Do(t, "GET", url+"/v2/models/p/ready", nil, nil)
	if code != 503 || !strings.Contains(string(body), `"ready":false`) {
		t.Fatalf("p/ready after its step's function was deleted: %d %s, want 503 ready false", code, body)
	}
	// Its metadata cannot be told (its tensors are its steps'), but the
	// model exists: 503 naming it and the step, as its ready says, not
	// the 404 of an unknown model.
	code, _, body = v2Do(t, "GET", url+"/v2/models/p", nil, nil)
	if code != 503 || !strings.Contains(string(body), "step 1 (gone)") || !strings.Contains(string(body), "model p") {
		t.Fatalf("p's metadata after its step's function was deleted: %d %s, want 503 naming model p and step 1 (gone)", code, body)
	}
	if code, _, body := v2Do(t, "GET", url+"/v2/models/nosuch", nil, nil); code != 404 {
		t.Fatalf("nosuch's metadata: %d %s, want 404", code, body)
	}
	if code, _, body := v2Do(t, "GET", url+"/v2/models/nosuch/ready", nil, nil); code != 404 {
		t.Fatalf("nosuch/ready: %d %s, want 404", code, body)
	}
}
