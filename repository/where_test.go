package repository

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A reason names the folder as the repository lays it out (README:
// "models/cnn/2: plover.json names ..."), whatever links lead to it: a
// repository given as a link (--repository /srv/models, a volume's
// mount) or a version folder linked to a release elsewhere. Named by its
// resolved path, it read "models/../data/models/cnn/2", naming the server's
// own layout and not the model folder the operator looks for.
func TestReasonsNameTheRepositorysFolders(t *testing.T) {
	d := t.TempDir()
	real := filepath.Join(d, "data", "models")
	writeBundle(t, filepath.Join(real, "cnn", "2"), "other", false)
	writeBundle(t, filepath.Join(real, "one"), "other", false)
	writeBundle(t, filepath.Join(d, "releases", "v7"), "other", false)
	if err := os.MkdirAll(filepath.Join(real, "linked"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(d, "releases", "v7"), filepath.Join(real, "linked", "3")); err != nil {
		t.Fatal(err)
	}
	age(t, real)
	models := filepath.Join(d, "models")
	if err := os.Symlink(real, models); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"cnn/2": "models/cnn/2: ", "linked/3": "models/linked/3: ", "one/1": "models/one: "}
	for _, dir := range []string{models, real} {
		r, err := New(Config{Dir: dir, Settle: 10 * time.Millisecond}, newFakeNode())
		if err != nil {
			t.Fatal(err)
		}
		r.Scan(context.Background())
		idx := r.Index(context.Background(), false)
		if len(idx) != len(want) {
			t.Fatalf("--repository %s: index %s", dir, index(r))
		}
		for _, e := range idx {
			if p := want[e.Name+"/"+e.Version]; !strings.HasPrefix(e.Reason, p+`plover.json names "other"`) {
				t.Errorf("--repository %s: %s/%s's reason %q, want it to begin %q", dir, e.Name, e.Version, e.Reason, p)
			}
		}
		if err := r.Load(context.Background(), "cnn"); err == nil || !strings.Contains(err.Error(), "load cnn: models/cnn/2: ") {
			t.Errorf("--repository %s: load cnn: %v, want it to name models/cnn/2", dir, err)
		}
	}
}

// A reason names a version folder's files from the folder ("models/broken:
// plover.json: invalid JSON ..."), not by the server's absolute path,
// which the index showed to every read token ("models/broken:
// /srv/plover/models/broken/plover.json: ...").
func TestReasonsKeepTheServersPathsOut(t *testing.T) {
	root := t.TempDir()
	models := filepath.Join(root, "models")
	writeBundle(t, filepath.Join(models, "cnn", "1"), "cnn", false)
	if err := os.Remove(filepath.Join(models, "cnn", "1", "b.bin")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "secret"), filepath.Join(models, "cnn", "1", "b.bin")); err != nil {
		t.Fatal(err)
	}
	writeBundle(t, filepath.Join(models, "broken"), "broken", false)
	if err := os.WriteFile(filepath.Join(models, "broken", "plover.json"), []byte(`{"name": "broken"`), 0o644); err != nil {
		t.Fatal(err)
	}
	age(t, models)
	time.Sleep(20 * time.Millisecond) // the link's own time past Settle
	r, err := New(Config{Dir: models, Settle: 10 * time.Millisecond}, newFakeNode())
	if err != nil {
		t.Fatal(err)
	}
	r.Scan(context.Background())
	want := map[string]string{"broken/1": "models/broken: plover.json: ", "cnn/1": "models/cnn/1: pack: bundle: b.bin is a link that resolves outside"}
	idx := r.Index(context.Background(), false)
	if len(idx) != len(want) {
		t.Fatalf("index: %s", index(r))
	}
	for _, e := range idx {
		if p := want[e.Name+"/"+e.Version]; !strings.HasPrefix(e.Reason, p) || strings.Contains(e.Reason, root) {
			t.Errorf("%s/%s: reason %q, want it to begin %q and not name %s", e.Name, e.Version, e.Reason, p, root)
		}
	}
}
