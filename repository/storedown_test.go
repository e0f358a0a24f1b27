package repository

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/errdefs"
)

// storeDownNode's records cannot be read while down.
type storeDownNode struct {
	*fakeNode
	down atomic.Bool
}

func (s *storeDownNode) Versions(ctx context.Context, name string) (*api.Record, error) {
	if s.down.Load() {
		return nil, errdefs.New(errdefs.KindUnavailable, nil, "store: connection refused")
	}
	return s.fakeNode.Versions(ctx, name)
}

// A deploy that cannot read the function's record (the store down) keeps
// what serves in the index (cnn/1 still READY, as it still answers), and
// its reason, in the index and a load's error, names the folder and what
// failed, not the store's words alone; the class stays (503).
func TestStoreDownKeepsWhatServes(t *testing.T) {
	ctx := context.Background()
	root := filepath.Join(t.TempDir(), "models")
	writeBundle(t, filepath.Join(root, "cnn", "1"), "cnn", false)
	age(t, root)
	node := &storeDownNode{fakeNode: newFakeNode()}
	r, err := New(Config{Dir: root, Poll: time.Hour, Settle: 20 * time.Millisecond}, node)
	if err != nil {
		t.Fatal(err)
	}
	r.Scan(ctx)
	if got := index(r); got != "cnn/1 READY; " {
		t.Fatalf("start: %s", got)
	}
	node.down.Store(true)
	writeBundle(t, filepath.Join(root, "cnn", "2"), "cnn", false)
	age(t, root)
	waitFor(t, r, 5, "the deploy of cnn/2 tried", func() bool { return strings.Contains(index(r), "connection refused") })
	want := "models/cnn: reading its record: store: connection refused"
	if got := index(r); !strings.Contains(got, "cnn/1 READY") || !strings.Contains(got, want) {
		t.Errorf("store down: %s\nwant cnn/1 still READY and the reason %q", got, want)
	}
	err = r.Load(ctx, "cnn")
	if errdefs.KindOf(err) != errdefs.KindUnavailable || !strings.Contains(fmt.Sprint(err), "load cnn: "+want) {
		t.Errorf("load while the store is down: %v (kind %d), want 503 with %q", err, errdefs.KindOf(err), "load cnn: "+want)
	}
	node.down.Store(false)
	waitFor(t, r, 3, "cnn/2 current once the store is back", func() bool { return node.current("cnn") == "2" })
	if _, err := os.Stat(filepath.Join(root, "cnn", "2")); err != nil {
		t.Fatal(err)
	}
}

// A folder removed before this run deployed it (the store down at its
// first deploy) still takes its function with it when an earlier run of
// the repository deployed that function: dropped unseen, it served on for
// good with no folder. Whether it is the repository's is read from its
// record once the store answers; meanwhile the folder's entry says why it
// waits.
func TestRemovedBeforeItsFirstDeployOfThisRun(t *testing.T) {
	ctx := context.Background()
	r, root, node := restartedStoreDown(t)
	if err := os.RemoveAll(filepath.Join(root, "cnn")); err != nil {
		t.Fatal(err)
	}
	scanEmptied(ctx, r)
	if got := index(r); !strings.Contains(got, "its folder was removed") {
		t.Errorf("removed with the store down: %s; want its entry waiting, saying why", got)
	}
	node.down.Store(false)
	r.Scan(ctx)
	if node.current("cnn") != "" {
		t.Fatalf("cnn still served (version %s) after its folder was removed: %s", node.current("cnn"), index(r))
	}
	if got := index(r); got != "" {
		t.Errorf("index after the delete: %q, want empty", got)
	}
}

// An unload of a model this run has not deployed (its first deploy met
// the store down) while its record cannot be read: it answered 200,
// deleting nothing, and once the store was back a scan took an earlier
// run's function back, the unload undone.
func TestUnloadWithTheStoreDownIsRefused(t *testing.T) {
	r, _, _ := restartedStoreDown(t)
	err := r.Unload(context.Background(), "cnn")
	if errdefs.KindOf(err) != errdefs.KindUnavailable {
		t.Errorf("unload with the store down: %v (kind %d), want 503", err, errdefs.KindOf(err))
	}
	if got := index(r); strings.Contains(got, "unloaded") {
		t.Errorf("index %q: marked unloaded with its function not deleted", got)
	}
}

// restartedStoreDown is a repository (polling hourly) over DIR/cnn/1/,
// which an earlier run deployed, restarted with the store down: its first
// scan could not read cnn's record.
func restartedStoreDown(t *testing.T) (r *Repository, root string, node *storeDownNode) {
	t.Helper()
	ctx := context.Background()
	root = filepath.Join(t.TempDir(), "models")
	writeBundle(t, filepath.Join(root, "cnn", "1"), "cnn", false)
	age(t, root)
	node = &storeDownNode{fakeNode: newFakeNode()}
	cfg := Config{Dir: root, Poll: time.Hour, Settle: 20 * time.Millisecond}
	earlier, err := New(cfg, node)
	if err != nil {
		t.Fatal(err)
	}
	earlier.Scan(ctx)
	if node.current("cnn") != "1" {
		t.Fatalf("the earlier run did not deploy cnn: %s", index(earlier))
	}
	node.down.Store(true)
	r, err = New(cfg, node) // the server restarted, the store down
	if err != nil {
		t.Fatal(err)
	}
	r.Scan(ctx)
	if got := index(r); !strings.Contains(got, "connection refused") {
		t.Fatalf("first deploy with the store down: %s", got)
	}
	return r, root, node
}
