package repository

import (
	"context"
	"os"
	"path/filepath"
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
	r.Run(ctx)
	if node.current("cnn") != "1" {
		t.Fatalf("at start: %s", index(r))
	}
	os.RemoveAll(filepath.Join(models, "cnn", "1"))
	age(t, models)
	r2, _ := New(Config{Dir: models, Settle: 50 * time.Millisecond}, node)
	r2.Run(ctx)
	want := "cnn/ UNAVAILABLE (models/cnn: no plover.json and no version folders (1/, 2/, ...)); "
	if _, err := node.Versions(ctx, "cnn"); err == nil || index(r2) != want {
		t.Errorf("restarted with no version folder left: function kept %v, index %q; want it deleted and %q", err == nil, index(r2), want)
	}
}
