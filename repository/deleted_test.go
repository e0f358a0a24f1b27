package repository

import (
	"context"
	"io"
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

// hookNode runs onDeploy (once) as a deploy begins: what an index sees
// while a deploy is on its way.
type hookNode struct {
	*fakeNode
	onDeploy func()
}

func (h *hookNode) DeployLabeled(ctx context.Context, name, label string, aside bool, body io.Reader) (api.FunctionInfo, error) {
	if on := h.onDeploy; on != nil {
		h.onDeploy = nil
		on()
	}
	return h.fakeNode.DeployLabeled(ctx, name, label, aside, body)
}

// A load of a model deleted by plover rm (no index saw it) during which an
// index lists the store (cnn not there yet): the index must not take the
// deploying model for deleted. It did, and the load then answered 200
// with the function deployed while the index said {"state": ""} for good,
// a restart included.
func TestIndexDuringALoadAfterRm(t *testing.T) {
	ctx := context.Background()
	models := filepath.Join(t.TempDir(), "models")
	writeBundle(t, filepath.Join(models, "cnn", "1"), "cnn", false)
	age(t, models)
	node := &hookNode{fakeNode: newFakeNode()}
	cfg := Config{Dir: models, Poll: time.Hour, Settle: time.Millisecond, StateFile: filepath.Join(t.TempDir(), "state.json")}
	r, _ := New(cfg, node)
	r.Scan(ctx)
	node.fakeNode.Delete(ctx, "cnn", false) // plover rm, unnoticed
	var during string
	node.onDeploy = func() { during = index(r) }
	if err := r.Load(ctx, "cnn"); err != nil {
		t.Fatalf("load: %v", err)
	}
	for _, c := range []struct {
		when string
		r    *Repository
	}{{"after the load", r}, {"after a restart", nil}} {
		if c.r == nil {
			c.r, _ = New(cfg, node.fakeNode)
			c.r.Scan(ctx)
		}
		for _, e := range c.r.Index(ctx, false) {
			if e.State != Ready && e.State != Unavailable && e.State != Loading {
				t.Errorf("%s: entry %+v has no Triton state", c.when, e)
			}
		}
		if got := index(c.r); got != "cnn/1 READY; " || node.current("cnn") != "1" {
			t.Errorf("%s: index %q (during the load %q), function current %q; want cnn/1 READY", c.when, got, during, node.current("cnn"))
		}
	}
}
