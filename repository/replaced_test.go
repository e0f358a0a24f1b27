package repository

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A function the repository deployed and a plover deploy replaced since
// (its current version carries no folder's label) is no longer the
// repository's: its folder removed, or an unload, deleted it, though
// functions deployed otherwise are left alone.
func TestReplacedByPloverDeployIsLeftAlone(t *testing.T) {
	for _, c := range []struct {
		what string
		do   func(t *testing.T, r *Repository, models string)
		want string // the index after
	}{
		{"folder removed", func(t *testing.T, r *Repository, models string) {
			os.RemoveAll(filepath.Join(models, "cnn"))
			scanEmptied(context.Background(), r)
		}, ""},
		{"no version left", func(t *testing.T, r *Repository, models string) {
			os.RemoveAll(filepath.Join(models, "cnn", "1"))
			age(t, models)
			waitFor(t, r, 5, "cnn with no version", func() bool { return strings.Contains(index(r), "no version folders") })
		}, "cnn/ UNAVAILABLE (models/cnn: no plover.json and no version folders (1/, 2/, ...)); "},
		{"unloaded", func(t *testing.T, r *Repository, _ string) {
			if err := r.Unload(context.Background(), "cnn"); err != nil {
				t.Fatal(err)
			}
		}, "cnn/ UNAVAILABLE (unloaded); "},
	} {
		t.Run(c.what, func(t *testing.T) {
			ctx := context.Background()
			models := filepath.Join(t.TempDir(), "models")
			writeBundle(t, filepath.Join(models, "cnn", "1"), "cnn", false)
			age(t, models)
			node := newFakeNode()
			r, _ := New(Config{Dir: models, Poll: time.Hour, Settle: time.Millisecond}, node)
			r.Scan(ctx)
			if node.current("cnn") != "1" {
				t.Fatalf("cnn not deployed: %s", index(r))
			}
			b, _, _, err := r.pack(filepath.Join(models, "cnn", "1"), "")
			if err != nil {
				t.Fatal(err)
			}
			node.DeployLabeled(ctx, "cnn", "", false, strings.NewReader(string(b))) // plover deploy
			c.do(t, r, models)
			if got := index(r); node.recs["cnn"] == nil || got != c.want {
				t.Errorf("index %q, deletes %v; want %q and the plover deploy left alone", got, node.deletes, c.want)
			}
		})
	}
}
