package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
)

// A version pinned by a pipeline step that is not current runs beside the
// current one, shows in the function's figures, and is unloaded when idle
// whatever its min_instances (they are for when it is current); pinned
// again, it comes back; made current, its pool serves as the function's.
func TestPinnedVersionLifecycle(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	ctx := context.Background()
	m := testkit.Manifest("fn")
	m.MinInstances = 1
	v1 := testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	m.Chain = append(m.Chain, m.Chain[0]) // another bundle: a second version
	v2 := testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	if v1.Version == v2.Version {
		t.Fatal("one version")
	}
	run := func(ref string) string {
		t.Helper()
		p, err := e.PinVersion(ctx, "fn", ref, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Release()
		req := &call.Request{Input: []byte("x")}
		if err := p.Invoke(ctx, req); err != nil {
			t.Fatal(err)
		}
		return req.Version
	}
	if got := run(v1.Version[:8]); got != v1.Version {
		t.Fatalf("pinned %s ran %s", v1.Version[:8], got)
	}
	fi, _ := e.Control().Function(ctx, "fn")
	if fi.Idle != 2 || fi.Version != v2.Version { // v2's min instance and v1's
		t.Fatalf("with v1 pinned: idle %d, current %s", fi.Idle, fi.Version)
	}
	e.Reap(time.Now().Add(time.Hour))
	fi, _ = e.Control().Function(ctx, "fn")
	if fi.Idle != 1 {
		t.Fatalf("after reaping: idle %d, want v2's min instance alone", fi.Idle)
	}
	if got := run(v1.Version); got != v1.Version {
		t.Fatalf("pinned again: ran %s", got)
	}
	if _, err := e.PinVersion(ctx, "fn", "00000000", time.Time{}); errdefs.KindOf(err) != errdefs.KindNotFound {
		t.Fatalf("a version fn does not have: %v", err)
	}
	// Rolled back to, the pinned version becomes current with its pool.
	if _, err := e.Control().Rollback(ctx, "fn", v1.Version); err != nil {
		t.Fatal(err)
	}
	fi, _ = e.Control().Function(ctx, "fn")
	if fi.Version != v1.Version || !fi.Loaded || fi.Idle != 1 {
		t.Fatalf("after rollback: %s loaded %v idle %d", fi.Version, fi.Loaded, fi.Idle)
	}
}
