package repository_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/repository"
)

// A model whose version folders all went while its folder stays
// (models/cnn/1/ and 2/ deleted, models/cnn/ kept with only a notes/
// folder) is what a removed folder is: its function deleted, the folder's
// entry UNAVAILABLE as one with no bundle; unless a pipeline runs it,
// then it stays, serving the pipeline, UNAVAILABLE with the reason, and is
// deleted at the scan after the pipeline goes. It kept answering before.
func TestModelWithNoVersionsLeftIsDeleted(t *testing.T) {
	for _, piped := range []bool{false, true} {
		t.Run(map[bool]string{false: "alone", true: "a pipeline's step"}[piped], func(t *testing.T) {
			models := cnnModels(t, "1", "2")
			if piped {
				copyFiles(t, testkit.PipelineDir(t, "pipe", "cnn"), filepath.Join(models, "pipe"), "plover.json")
				ageAll(models)
			}
			r, url := servePolled(t, models)
			ctx := context.Background()
			in := []byte(`{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[3],"data":[1,2,3]}]}`)
			infer := func(name string) int {
				resp, _ := testkit.Post(t, "POST", url+"/v2/models/"+name+"/infer", "application/json", in)
				return resp.StatusCode
			}
			if code := infer("cnn"); code != 200 {
				t.Fatalf("at start: infer %d", code)
			}
			os.RemoveAll(filepath.Join(models, "cnn", "1"))
			os.RemoveAll(filepath.Join(models, "cnn", "2"))
			os.Mkdir(filepath.Join(models, "cnn", "notes"), 0o755)
			cnn := scanUntil(t, r, url, func(e api.RepositoryModel) bool {
				return e.Name == "cnn" && e.Version == "" && e.State != repository.Loading
			})
			if !piped {
				if code := infer("cnn"); code != 404 || !strings.Contains(cnn.Reason, "no plover.json and no version folders") {
					t.Errorf("no version folder left: infer %d, index entry %+v; want 404 and no bundle", code, cnn)
				}
				return
			}
			if code := infer("pipe"); code != 200 || cnn.State != repository.Unavailable || !strings.Contains(cnn.Reason, "pipe") {
				t.Fatalf("a pipeline's step with no version folder left: infer pipe %d, index entry %+v; want 200 and UNAVAILABLE naming the pipeline", code, cnn)
			}
			os.RemoveAll(filepath.Join(models, "pipe"))
			r.Scan(ctx)
			r.Scan(ctx)
			if code := infer("cnn"); code != 404 {
				t.Errorf("once the pipeline went: infer cnn %d, want 404; index %+v", code, postIndex(t, url, ""))
			}
		})
	}
}

// scanUntil scans r until the index at url has an entry as want, and
// returns it (for at most 10 s: a folder settles first).
func scanUntil(t *testing.T, r *repository.Repository, url string, want func(api.RepositoryModel) bool) api.RepositoryModel {
	t.Helper()
	var idx []api.RepositoryModel
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		r.Scan(context.Background())
		idx = postIndex(t, url, "")
		for _, e := range idx {
			if want(e) {
				return e
			}
		}
	}
	t.Fatalf("not after 10 s of scans; index %+v", idx)
	return api.RepositoryModel{}
}
