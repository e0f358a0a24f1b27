package repository

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A model folder found at start with no bundle left, whose function an
// earlier run deployed (its record's label says so), deletes it: the
// index says the folder has no bundle, and it must not answer. A function
// of the name deployed otherwise (no label) is left alone.
func TestNoBundleAtStartDeletesAnEarlierRunsFunction(t *testing.T) {
	ctx := context.Background()
	d := t.TempDir()
	models := filepath.Join(d, "models")
	writeBundle(t, filepath.Join(models, "cnn", "1"), "cnn", false)
	node := newFakeNode()
	r, _ := New(Config{Dir: models, Settle: 50 * time.Millisecond}, node)
	runStarted(t, r)
	if node.current("cnn") != "1" {
		t.Fatalf("at start: %s", index(r))
	}
	os.RemoveAll(filepath.Join(models, "cnn", "1"))
	age(t, models)
	r2, _ := New(Config{Dir: models, Settle: 50 * time.Millisecond}, node)
	runStarted(t, r2)
	want := "cnn/ UNAVAILABLE (models/cnn: no plover.json and no version folders (1/, 2/, ...)); "
	if _, err := node.Versions(ctx, "cnn"); err == nil || index(r2) != want {
		t.Errorf("restarted with no version folder left: function kept %v, index %q; want it deleted and %q", err == nil, index(r2), want)
	}
}

// A folder that lacks a bundle only for a moment, or whose manifest cannot
// be read now, is no model with no versions: its function (its record with
// it) stays and the next scans try again. A plover.json rewritten in place
// (removed, then written) between the look that decided the deploy and the
// listing of its versions deleted the function, and so did any error of
// the manifest's stat (EACCES, EIO, ESTALE: here a link loop, ELOOP).
func TestNoBundleOnlyOnceItIsSo(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name            string
		before, between func(t *testing.T, dir string)
	}{
		{"manifest removed after the look", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, "vecadd.so"), []byte("a new library"), 0o644)
		}, func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, "plover.json")) }},
		{"manifest unreadable", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, "plover.json"))
			if err := os.Symlink("plover.json", filepath.Join(dir, "plover.json")); err != nil {
				t.Fatal(err)
			}
		}, func(*testing.T, string) {}},
	} {
		t.Run(c.name, func(t *testing.T) {
			models := filepath.Join(t.TempDir(), "models")
			dir := filepath.Join(models, "cnn")
			writeBundle(t, dir, "cnn", false)
			node := newFakeNode()
			r, _ := New(Config{Dir: models, Poll: time.Hour, Settle: time.Millisecond}, node)
			r.Scan(ctx)
			c.before(t, dir)
			age(t, models)
			r.Scan(ctx) // seen changed once; the next look deploys it
			// That scan's steps, the change between its look and its deploy;
			// its look a second on (the link just made has settled then).
			r.take(ctx)
			found, _, _ := r.list()
			r.mu.Lock()
			m := r.modelLocked("cnn", found["cnn"])
			decided := r.settledLocked(m, found["cnn"], time.Now().Add(time.Second))
			r.mu.Unlock()
			c.between(t, dir)
			r.deployAll(ctx, []*model{m})
			r.give()
			if decided != changed || len(node.deletes) > 0 || node.current("cnn") != "1" || !strings.Contains(index(r), "cnn/1 READY") {
				t.Errorf("deploy decided %v; deletes %v, index %q; want the function kept, cnn/1 READY", decided == changed, node.deletes, index(r))
			}
		})
	}
}

// A restart while the store is down a moment, over a model folder an
// earlier run deployed whose version folders were all removed meanwhile:
// whether its function is the repository's cannot be read yet, and the
// next scan reads it again. It was taken for not the repository's and
// settled for good: the emptied folder's function served on.
func TestNoBundleAtStartWithTheStoreDown(t *testing.T) {
	ctx := context.Background()
	models := filepath.Join(t.TempDir(), "models")
	writeBundle(t, filepath.Join(models, "cnn", "1"), "cnn", false)
	node := &storeDownNode{fakeNode: newFakeNode()}
	cfg := Config{Dir: models, Poll: time.Hour, Settle: time.Millisecond}
	earlier, _ := New(cfg, node)
	earlier.Scan(ctx)
	os.RemoveAll(filepath.Join(models, "cnn", "1"))
	age(t, models)
	node.down.Store(true)
	r, _ := New(cfg, node)
	again := r.Scan(ctx)
	during := index(r)
	node.down.Store(false)
	r.Scan(ctx)
	if !again || !strings.Contains(during, "connection refused") || node.current("cnn") != "" {
		t.Errorf("scan with the store down: to be tried again %v, index %q; then function current %q, index %q; want it tried again and deleted",
			again, during, node.current("cnn"), index(r))
	}
}
