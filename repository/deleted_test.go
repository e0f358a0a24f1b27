package repository

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/plover-run/plover/api"
)

// A model deployed while the store's listing that would judge it was on
// its way is not taken for deleted (it may have a record the listing
// missed): the index's check of deleted functions races with scans.
func TestDeployDuringListingIsNotDeleted(t *testing.T) {
	ctx := context.Background()
	models := filepath.Join(t.TempDir(), "models")
	writeBundle(t, filepath.Join(models, "a"), "a", false)
	age(t, models)
	node := newFakeNode()
	r, _ := New(Config{Dir: models, Poll: time.Hour, Settle: time.Millisecond}, node)
	r.Scan(ctx) // a serves: an index lists the store
	writeBundle(t, filepath.Join(models, "b"), "b", false)
	age(t, models)
	r.Scan(ctx) // b seen once: the next scan deploys it
	once := false
	node.onList = func() {
		if !once {
			once = true
			r.Scan(ctx) // b deployed after the listing was read
		}
	}
	r.Index(ctx, false)
	node.onList = nil
	if got, want := index(r), "a/1 READY; b/1 READY; "; got != want || node.current("b") != "1" {
		t.Errorf("index %q, b deployed %v; want %q", got, node.current("b") != "", want)
	}
}

// A model unloaded because its function was deleted (plover rm, or an
// unload on another node sharing the store) is loaded again by the next
// scan once a repository deployed it again elsewhere (a load on that
// node): it stayed "deleted" in this node's index while this node served
// it. A function of the name deployed otherwise is left alone.
func TestDeletedThenLoadedElsewhereIsServedAgain(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name, want string
		redeploy   func(t *testing.T, other *Repository, node *fakeNode)
	}{
		{"loaded on another node", "cnn/1 READY; ", func(t *testing.T, other *Repository, _ *fakeNode) {
			if err := other.Load(ctx, "cnn"); err != nil {
				t.Fatal(err)
			}
		}},
		{"plover deploy", "cnn/ UNAVAILABLE (" + deletedReason + "); ", func(t *testing.T, _ *Repository, node *fakeNode) {
			node.recs["cnn"] = &api.Record{Name: "cnn", Current: "by-hand", Versions: []api.Version{{ID: "by-hand"}}}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			models := filepath.Join(t.TempDir(), "models")
			writeBundle(t, filepath.Join(models, "cnn", "1"), "cnn", false)
			age(t, models)
			node := newFakeNode()
			cfg := Config{Dir: models, Poll: time.Hour, Settle: time.Millisecond}
			r, _ := New(cfg, node)
			other, _ := New(cfg, node)
			r.Scan(ctx)
			other.Scan(ctx)
			node.Delete(ctx, "cnn", false)
			r.Scan(ctx)
			if got := index(r); got != "cnn/ UNAVAILABLE ("+deletedReason+"); " {
				t.Fatalf("after plover rm: %q", got)
			}
			c.redeploy(t, other, node)
			r.Scan(ctx)
			if got := index(r); got != c.want {
				t.Errorf("after the function came back: index %q, want %q", got, c.want)
			}
		})
	}
}
