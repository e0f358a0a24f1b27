package engine_test

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
)

// A label names its latest version, as the record says (Record.Find), on
// every node: where the current version has the label and a later version
// with it was deployed beside it (a model repository's folder rewritten
// while a higher folder could not be made current), a pin of the label
// ran the current one, the folder's old bytes, until the current version
// changed (a review found it). Here on the deploying node, on a node that
// served the function before and has polled since, and on a fresh node.
func TestALabelNamesItsLatestVersion(t *testing.T) {
	dir := t.TempDir()
	store, err := objectstore.NewFS(filepath.Join(dir, "store"))
	if err != nil {
		t.Fatal(err)
	}
	node := func(sub string) *engine.Engine {
		c, err := bundle.NewCache(filepath.Join(dir, sub), 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		return testkit.Engine(t, engine.Config{Store: store, Cache: c, Devices: []device.Device{device.NewHost(0)}})
	}
	pack := func(addOne bool) []byte {
		m := testkit.Manifest("fn")
		if addOne {
			m.Chain = append(m.Chain, abi.Launch{Kernel: "add_one", Grid: 1, Block: 1})
		}
		b, _, _, err := bundle.PackBytes(testkit.BundleDir(t, m, nil))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	ctx := context.Background()
	e1, e2 := node("c1"), node("c2")
	first, err := e1.Control().DeployLabeled(ctx, "fn", "2", false, bytes.NewReader(pack(false)))
	if err != nil {
		t.Fatal(err)
	}
	if err := e2.Invoke(ctx, "fn", &call.Request{Input: []byte{1}}); err != nil {
		t.Fatal(err)
	}
	later, err := e1.Control().DeployLabeled(ctx, "fn", "2", true, bytes.NewReader(pack(true)))
	if err != nil {
		t.Fatal(err)
	}
	e2.Refresh(ctx)
	for _, n := range []struct {
		name string
		e    *engine.Engine
	}{{"the deploying node", e1}, {"a node that served it, polled since", e2}, {"a fresh node", node("c3")}} {
		for _, ref := range []string{"2", later.Version, first.Version} {
			p, err := n.e.PinVersion(ctx, "fn", ref, time.Time{})
			if err != nil {
				t.Fatalf("%s: pin %s: %v", n.name, ref, err)
			}
			req := &call.Request{Input: []byte{1}}
			err = p.Invoke(ctx, req)
			p.Release()
			want, out := later.Version, byte(2)
			if ref == first.Version {
				want, out = first.Version, 1
			}
			if err != nil || req.Version != want || len(req.Output) == 0 || req.Output[0] != out {
				t.Errorf("%s: a pin of %q ran %s (output %v, %v); want %s (output %d): the current %s has label 2 too", n.name, ref, req.Version, req.Output[:min(1, len(req.Output))], err, want, out, first.Version)
			}
		}
	}
	// The current version is still the first: unpinned requests run it.
	req := &call.Request{Input: []byte{1}}
	if err := e1.Invoke(ctx, "fn", req); err != nil || req.Version != first.Version {
		t.Errorf("an unpinned request ran %s (%v), want the current %s", req.Version, err, first.Version)
	}
}
