package engine_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
)

// downAfterRecord fails, once down is set, what a delete does after it has
// removed the record: the listing of the other records (list) or the Stat
// of a bundle (stat).
type downAfterRecord struct {
	objectstore.Store
	list, stat bool
	down       atomic.Bool
}

func (s *downAfterRecord) Stat(ctx context.Context, key string) (objectstore.Info, error) {
	if s.stat && s.down.Load() && strings.HasPrefix(key, "bundles/") {
		return objectstore.Info{}, errDown
	}
	return s.Store.Stat(ctx, key)
}

func (s *downAfterRecord) List(ctx context.Context, prefix string) ([]objectstore.Info, error) {
	if s.list && s.down.Load() {
		return nil, errDown
	}
	return s.Store.List(ctx, prefix)
}

// A delete whose record is gone but whose bundle the store could not check
// (registry.ErrBundlesKept) deleted the function: it answers success, and
// this node stops serving it, instead of a 503 "cannot update the store"
// for a function that is gone (a retry then answers 404) while the node
// serves on.
func TestDeleteWhoseBundlesWereKeptDeletes(t *testing.T) {
	for _, tc := range []struct {
		name       string
		list, stat bool
	}{{"listing fails", true, false}, {"bundle stat fails", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			testDeleteKept(t, &downAfterRecord{list: tc.list, stat: tc.stat})
		})
	}
}

func testDeleteKept(t *testing.T, store *downAfterRecord) {
	fs, err := objectstore.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	store.Store = fs
	e := testkit.Engine(t, engine.Config{Store: store})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("fn"), nil))
	ctx := context.Background()
	if err := e.Invoke(ctx, "fn", &call.Request{Input: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	store.down.Store(true)
	if err := e.Control().Delete(ctx, "fn", true); err != nil {
		t.Fatalf("delete: %v", err)
	}
	err = e.Invoke(ctx, "fn", &call.Request{Input: []byte("x")})
	var re *errdefs.Error
	if !errors.As(err, &re) || re.Kind != errdefs.KindNotFound {
		t.Fatalf("invoke after the delete: %v, want 404", err)
	}
}

// DeleteCurrent deletes only while the version it names is current: a
// deploy that made another current since is left alone (409 naming both),
// the function serving on; naming the current one deletes it.
func TestDeleteCurrentLeavesWhatLandedSince(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	dir := testkit.BundleDir(t, testkit.Manifest("fn"), nil)
	first := testkit.Deploy(t, e, dir)
	second := testkit.ForceDeploy(t, e, dir)
	ctx := context.Background()
	err := e.Control().DeleteCurrent(ctx, "fn", first.Version)
	var re *errdefs.Error
	if !errors.As(err, &re) || re.Kind != errdefs.KindConflict || !strings.Contains(re.Msg, second.Version) {
		t.Fatalf("DeleteCurrent of the version before the current one: %v; want a conflict naming %s", err, second.Version)
	}
	if err := e.Invoke(ctx, "fn", &call.Request{Input: []byte("x")}); err != nil {
		t.Fatalf("invoke after a refused DeleteCurrent: %v", err)
	}
	if err := e.Control().DeleteCurrent(ctx, "fn", second.Version); err != nil {
		t.Fatalf("DeleteCurrent of the current version: %v", err)
	}
	if _, err := e.Control().Versions(ctx, "fn"); errdefs.KindOf(err) != errdefs.KindNotFound {
		t.Fatalf("the record after DeleteCurrent: %v; want it gone", err)
	}
}
