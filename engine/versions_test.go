package engine_test

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
)

func TestTwoNodesFollowDeployRollbackDelete(t *testing.T) {
	ctx := context.Background()
	store, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	a := testkit.Engine(t, engine.Config{Store: store})
	b := testkit.Engine(t, engine.Config{Store: store}) // its own cache: a second node
	m := testkit.Manifest("fn")
	m.Chain = []abi.Launch{{Kernel: "echo", Grid: 1, Block: 8}}
	v1 := testkit.Deploy(t, a, testkit.BundleDir(t, m, nil))

	out := func(e *engine.Engine) (byte, string) {
		t.Helper()
		r := invoke(t, e, "fn", []byte{5})
		return r.Output[0], r.Version
	}
	if o, v := out(b); o != 5 || v != v1.Version {
		t.Fatalf("node b before: %d %s", o, v)
	}
	m.Chain = append(m.Chain, abi.Launch{Kernel: "add_one", Grid: 1, Block: 1})
	v2 := testkit.Deploy(t, a, testkit.BundleDir(t, m, nil))
	if o, _ := out(b); o != 5 {
		t.Fatal("node b switched without a refresh")
	}
	if err := b.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if o, v := out(b); o != 6 || v != v2.Version {
		t.Fatalf("node b after deploy: %d %s, want 6 %s", o, v, v2.Version)
	}

	if _, err := a.Control().Rollback(ctx, "fn", v1.Version[:8]); err != nil {
		t.Fatal(err)
	}
	if o, v := out(a); o != 5 || v != v1.Version {
		t.Fatalf("node a after rollback: %d %s", o, v)
	}
	b.Refresh(ctx)
	if o, v := out(b); o != 5 || v != v1.Version {
		t.Fatalf("node b after rollback: %d %s", o, v)
	}
	if _, err := a.Control().Rollback(ctx, "fn", "ffffffff-nope"); errdefs.KindOf(err) != errdefs.KindNotFound {
		t.Fatalf("rollback to an unknown version: %v", err)
	}
	rec, err := b.Control().Versions(ctx, "fn")
	if err != nil || len(rec.Versions) != 2 || rec.Current != v1.Version {
		t.Fatalf("versions: %+v %v", rec, err)
	}

	// GC keeps both bundles while the record names them.
	if removed, err := a.Control().GC(ctx, 0); err != nil || len(removed) != 0 {
		t.Fatalf("gc with referenced bundles removed %v (%v)", removed, err)
	}
	if err := a.Control().Delete(ctx, "fn", false); err != nil {
		t.Fatal(err)
	}
	// Bundles written within registry.BundleGrace stay (a deploy racing
	// the delete may be about to name them); gc without grace removes them.
	if objs, _ := store.List(ctx, "bundles/"); len(objs) != 2 {
		t.Fatalf("delete of just-written bundles: %v", objs)
	}
	if removed, err := a.Control().GC(ctx, 0); err != nil || len(removed) != 2 {
		t.Fatalf("gc after the delete removed %v (%v)", removed, err)
	}
	if objs, _ := store.List(ctx, "bundles/"); len(objs) != 0 {
		t.Fatalf("gc left bundles behind: %v", objs)
	}
	b.Refresh(ctx)
	if err := b.Invoke(ctx, "fn", &call.Request{}); errdefs.KindOf(err) != errdefs.KindNotFound {
		t.Fatalf("node b after delete: %v", err)
	}
}

// Deploying the bytes of the current version creates no version and says
// so; force creates one; different bytes create one as always.
func TestDeployUnchanged(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	ctx := context.Background()
	dir := testkit.BundleDir(t, testkit.Manifest("fn"), nil)
	b, _, _, err := bundle.PackBytes(dir)
	if err != nil {
		t.Fatal(err)
	}
	deploy := func(body []byte, force bool) api.FunctionInfo {
		t.Helper()
		fi, err := e.Control().Deploy(ctx, "fn", bytes.NewReader(body), force)
		if err != nil {
			t.Fatal(err)
		}
		return fi
	}
	first := deploy(b, false)
	for _, tc := range []struct {
		name      string
		force     bool
		unchanged bool
		versions  int
	}{{"same bytes", false, true, 1}, {"same bytes again", false, true, 1}, {"same bytes, force", true, false, 2}} {
		fi := deploy(b, tc.force)
		if fi.Unchanged != tc.unchanged || fi.Versions != tc.versions || (tc.unchanged && fi.Version != first.Version) {
			t.Errorf("%s: unchanged %v, %d versions, version %s; want unchanged %v, %d versions (first %s)",
				tc.name, fi.Unchanged, fi.Versions, fi.Version, tc.unchanged, tc.versions, first.Version)
		}
	}
	m := testkit.Manifest("fn")
	m.OutBytes++
	b2, _, _, err := bundle.PackBytes(testkit.BundleDir(t, m, nil))
	if err != nil {
		t.Fatal(err)
	}
	if fi := deploy(b2, false); fi.Unchanged || fi.Versions != 3 {
		t.Errorf("different bytes: unchanged %v, %d versions; want a third version", fi.Unchanged, fi.Versions)
	}
}

// A function deleted and deployed again on another node between two of
// this node's polls is a new function here too: the old one's output is
// dropped and its followers end, its request counts start again. Records
// keep every version, so one that no longer lists the version this node
// runs was made anew.
func TestRefreshSeesARecreatedFunction(t *testing.T) {
	ctx := context.Background()
	store, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	a := testkit.Engine(t, engine.Config{Store: store})
	b := testkit.Engine(t, engine.Config{Store: store, Devices: []device.Device{keepsOutput{device.NewHost(0)}}})
	m := testkit.Manifest("fn")
	testkit.Deploy(t, a, testkit.BundleDir(t, m, nil))
	for range 3 {
		invoke(t, b, "fn", []byte{1})
	}
	_, f, err := b.Control().Logs(ctx, "fn", time.Time{}, true)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := b.Refresh(ctx); err != nil { // nothing changed: the same function
		t.Fatal(err)
	}
	if fi, _ := b.Control().Function(ctx, "fn"); fi.Requests != 3 {
		t.Fatalf("requests %d after a refresh that changed nothing, want 3", fi.Requests)
	}
	if err := a.Control().Delete(ctx, "fn", false); err != nil {
		t.Fatal(err)
	}
	m.Chain = []abi.Launch{{Kernel: "add_one", Grid: 1, Block: 1}}
	v := testkit.Deploy(t, a, testkit.BundleDir(t, m, nil))
	if err := b.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case _, ok := <-f.C:
		if ok {
			t.Fatal("a line for the follower of the deleted function")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the follower of a function deleted on another node still follows after the refresh")
	}
	if r := invoke(t, b, "fn", []byte{1}); r.Version != v.Version {
		t.Fatalf("node b runs %s, want the new function's %s", r.Version, v.Version)
	}
	if fi, _ := b.Control().Function(ctx, "fn"); fi.Requests != 1 {
		t.Fatalf("requests %d after the function was made anew and invoked once, want 1", fi.Requests)
	}
}
