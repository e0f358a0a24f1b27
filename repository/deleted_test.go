package repository

import (
	"context"
	"path/filepath"
	"testing"
	"time"
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
