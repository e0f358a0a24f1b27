package repository_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/repository"
)

// A version folder that served and is then rewritten into one the
// repository refuses (its manifest names another function) is
// UNAVAILABLE in the index, and its number no longer runs the bundle it
// had: /v2/models/cnn/versions/2/ready said 200 and infer ran the old
// bytes while the index said UNAVAILABLE.
func TestRefusedVersionFolderIsNotServed(t *testing.T) {
	models := cnnModels(t, "1", "2")
	r, url := servePolled(t, models)
	if resp, b := testkit.Post(t, "GET", url+"/v2/models/cnn/versions/2/ready", "", nil); resp.StatusCode != 200 {
		t.Fatalf("version 2 at start: %d %s", resp.StatusCode, b)
	}
	os.Remove(filepath.Join(models, "cnn", "2", "plover.json")) // a link to src's
	testkit.WriteManifest(t, filepath.Join(models, "cnn", "2"), testkit.Manifest("other"))
	e := scanUntil(t, r, url, func(e api.RepositoryModel) bool {
		return e.Name == "cnn" && e.Version == "2" && e.State == repository.Unavailable
	})
	in := []byte(`{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[3],"data":[1,2,3]}]}`)
	for path, body := range map[string][]byte{"ready": nil, "infer": in} {
		method := map[bool]string{true: "GET", false: "POST"}[body == nil]
		if resp, b := testkit.Post(t, method, url+"/v2/models/cnn/versions/2/"+path, "application/json", body); resp.StatusCode == 200 {
			t.Errorf("cnn/2 %s in the index (%s), yet versions/2/%s answers 200 %.100s", e.State, e.Reason, path, b)
		}
	}
	if resp, _ := testkit.Post(t, "POST", url+"/v2/models/cnn/infer", "application/json", in); resp.StatusCode != 200 {
		t.Errorf("cnn (version 1 current) answers %d", resp.StatusCode)
	}
}
