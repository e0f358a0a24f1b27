package repository_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/repository"
)

// postIndex is the index the server at url answers to body.
func postIndex(t *testing.T, url, body string) []api.RepositoryModel {
	t.Helper()
	resp, b := testkit.Post(t, "POST", url+"/v2/repository/index", "application/json", []byte(body))
	var out []api.RepositoryModel
	if err := json.Unmarshal(b, &out); err != nil || resp.StatusCode != 200 {
		t.Fatalf("index: %d %s", resp.StatusCode, b)
	}
	return out
}

// A version the node deployed but cannot run (its library refused at
// its first load: a dependency missing on this node) is not READY in the
// index, as /v2/models/NAME/ready is not ready: the index said READY
// (even asked for the ready ones only) while ready said 503 and every
// request failed, and a load answered 200. Nor is a pipeline one of
// whose steps cannot run.
func TestIndexSaysWhatCannotRun(t *testing.T) {
	src := testkit.UnloadableBundleDir(t, testkit.Manifest("cnn"))
	good := testkit.BundleDir(t, testkit.Manifest("good"), nil)
	models := filepath.Join(t.TempDir(), "models")
	copyFiles(t, src, filepath.Join(models, "cnn", "1"), "plover.json", "kernels.so")
	copyFiles(t, good, filepath.Join(models, "good"), "plover.json", "kernels.so")
	copyFiles(t, testkit.PipelineDir(t, "pipe", "good", "cnn"), filepath.Join(models, "pipe"), "plover.json")
	ageAll(models)
	e := testkit.Engine(t, engine.Config{})
	r, err := repository.New(repository.Config{Dir: models, Settle: 50 * time.Millisecond}, e.Control())
	if err != nil {
		t.Fatal(err)
	}
	url := testkit.Serve(t, e, httpapi.Options{Repository: r})
	r.Scan(context.Background())
	index := func(body string) []api.RepositoryModel { t.Helper(); return postIndex(t, url, body) }
	if idx := index(`{"ready": true}`); len(idx) != 3 {
		t.Fatalf("before any request (nothing loaded, nothing known refused): %+v", idx)
	}
	in := `{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[3],"data":[1,2,3]}]}`
	if resp, b := testkit.Post(t, "POST", url+"/v2/models/cnn/infer", "application/json", []byte(in)); resp.StatusCode == 200 {
		t.Fatalf("a library that cannot load ran: %s", b)
	}
	for _, m := range []string{"cnn", "pipe"} { // a pipeline is not ready while a step is not
		if resp, b := testkit.Post(t, "GET", url+"/v2/models/"+m+"/ready", "", nil); resp.StatusCode != 503 {
			t.Fatalf("ready of %s: %d %s", m, resp.StatusCode, b)
		}
	}
	idx := index("")
	if len(idx) != 3 || idx[0].Name != "cnn" || idx[0].State != repository.Unavailable ||
		!strings.HasPrefix(idx[0].Reason, "models/cnn/1: ") || !strings.Contains(idx[0].Reason, "libploverdep.so") || idx[1].State != repository.Ready ||
		idx[2].State != repository.Unavailable || !strings.HasPrefix(idx[2].Reason, "models/pipe: ") || !strings.Contains(idx[2].Reason, "libploverdep.so") {
		t.Errorf("index once cnn's library was refused: %+v, want cnn/1 and pipe/1 UNAVAILABLE with the reason, good READY", idx)
	}
	if idx := index(`{"ready": true}`); len(idx) != 1 || idx[0].Name != "good" {
		t.Errorf("the ready ones: %+v, want good alone", idx)
	}
	resp, b := testkit.Post(t, "POST", url+"/v2/repository/models/cnn/load", "", nil)
	if resp.StatusCode != 400 || !strings.Contains(string(b), "libploverdep.so") {
		t.Errorf("load of the model whose library is refused: %d %s, want 400 with the reason", resp.StatusCode, b)
	}
}
