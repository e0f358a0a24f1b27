package repository_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/repository"
)

// A model the repository deployed that an operator then deleted (plover
// rm: DELETE /v1/functions/NAME) is UNAVAILABLE in the index, not READY
// while its requests answer 404; the next polls leave it deleted (no
// silent redeploy), and a load deploys it again. The index said READY,
// also asked for the ready ones only.
func TestDeletedModelIsNotReady(t *testing.T) {
	r, url := servePolled(t, cnnModels(t, "1"))
	ctx := context.Background()
	index := func(body string) []api.RepositoryModel { t.Helper(); return postIndex(t, url, body) }
	in := []byte(`{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[3],"data":[1,2,3]}]}`)
	infer := func() int {
		resp, _ := testkit.Post(t, "POST", url+"/v2/models/cnn/infer", "application/json", in)
		return resp.StatusCode
	}
	if idx := index(`{"ready": true}`); len(idx) != 1 || infer() != 200 {
		t.Fatalf("at start: %+v", idx)
	}
	if resp, b := testkit.Post(t, "DELETE", url+"/v1/functions/cnn", "", nil); resp.StatusCode/100 != 2 {
		t.Fatalf("plover rm cnn: %d %s", resp.StatusCode, b)
	}
	if code := infer(); code != 404 {
		t.Fatalf("infer after plover rm: %d, want 404", code)
	}
	if resp, b := testkit.Post(t, "GET", url+"/v2/models/cnn/ready", "", nil); resp.StatusCode == 200 {
		t.Errorf("ready after plover rm: %d %s", resp.StatusCode, b)
	}
	for i := range 2 { // as the delete left it, and after a poll
		if idx := index(`{"ready": true}`); len(idx) != 0 {
			t.Errorf("look %d: the ready ones after plover rm: %+v, want none", i, idx)
		}
		idx := index("")
		if len(idx) != 1 || idx[0].Version != "" || idx[0].State != repository.Unavailable || !strings.Contains(idx[0].Reason, "plover rm") {
			t.Errorf("look %d: index after plover rm: %+v, want cnn UNAVAILABLE saying it was deleted", i, idx)
		}
		r.Scan(ctx)
		if code := infer(); code != 404 {
			t.Fatalf("look %d: a poll deployed the deleted model again: infer %d", i, code)
		}
	}
	if resp, b := testkit.Post(t, "POST", url+"/v2/repository/models/cnn/load", "", nil); resp.StatusCode != 200 {
		t.Fatalf("load: %d %s", resp.StatusCode, b)
	}
	if idx := index(`{"ready": true}`); len(idx) != 1 || infer() != 200 {
		t.Errorf("after a load: %+v", idx)
	}
}

// A pipeline one of whose steps was deleted (plover rm --force) is not
// READY in the index: its ready said 503 and its requests failed while
// the index said READY, also asked for the ready ones only.
func TestPipelineWithADeletedStepIsNotReady(t *testing.T) {
	models := cnnModels(t, "1")
	copyFiles(t, testkit.PipelineDir(t, "pipe", "cnn"), filepath.Join(models, "pipe"), "plover.json")
	ageAll(models)
	_, url := servePolled(t, models)
	if idx := postIndex(t, url, `{"ready": true}`); len(idx) != 2 {
		t.Fatalf("at start: %+v", idx)
	}
	if resp, b := testkit.Post(t, "DELETE", url+"/v1/functions/cnn?force=true", "", nil); resp.StatusCode/100 != 2 {
		t.Fatalf("plover rm --force cnn: %d %s", resp.StatusCode, b)
	}
	if resp, _ := testkit.Post(t, "GET", url+"/v2/models/pipe/ready", "", nil); resp.StatusCode == 200 {
		t.Fatalf("the pipeline is ready with its step deleted")
	}
	if idx := postIndex(t, url, `{"ready": true}`); len(idx) != 0 {
		t.Errorf("the ready ones once the pipeline's step was deleted: %+v, want none", idx)
	}
	idx := postIndex(t, url, "")
	if len(idx) != 2 || idx[1].Name != "pipe" || idx[1].State != repository.Unavailable || !strings.Contains(idx[1].Reason, "step cnn") {
		t.Errorf("index once the pipeline's step was deleted: %+v, want pipe/1 UNAVAILABLE naming step cnn", idx)
	}
}
