package repository

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/plover-run/plover/errdefs"
)

// A load while DIR itself is gone (a volume unmounted) is the node's
// failure, 503, as the index says, not a 404 a client takes for final.
func TestALoadWithTheRepositoryGoneIsUnavailable(t *testing.T) {
	ctx := context.Background()
	d := t.TempDir()
	models := filepath.Join(d, "models")
	writeBundle(t, filepath.Join(models, "cnn", "1"), "cnn", false)
	age(t, d)
	node := newFakeNode()
	r, err := New(Config{Dir: models, Poll: time.Hour, Settle: time.Millisecond}, node)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(models); err != nil {
		t.Fatal(err)
	}
	err = r.Load(ctx, "cnn")
	t.Logf("load with DIR gone: kind %v: %v", errdefs.KindOf(err), err)
	if errdefs.KindOf(err) != errdefs.KindUnavailable {
		t.Errorf("want 503 (DIR unreadable), got kind %v", errdefs.KindOf(err))
	}
}
