package engine_test

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"

	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
)

// Two deploys through one node overlap: X1's record lands in the store
// first, X2's lands on the node first and its pre-warm is making X2's
// instance (held); X1's landing then follows the store, where X2 is
// current, and pre-warms the current version, X2, beside X2's own warm.
// One warm of a version at a time: min_instances 1 leaves one instance.
// Before, both warms read none made yet and made one each.
func TestOverlappingDeploysWarmTheVersionOnce(t *testing.T) {
	fs, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	store := holdStore{Store: fs, landed: make(chan struct{}), release: make(chan struct{})}
	d := &gatedDevice{Device: device.NewHost(0)}
	e := testkit.Engine(t, engine.Config{Store: store, Devices: []device.Device{d}})
	m := testkit.Manifest("fn")
	m.MinInstances = 1
	testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	pack := func(out int64) []byte {
		m.OutBytes = out
		b, _, _, err := bundle.PackBytes(testkit.BundleDir(t, m, nil))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	x1, x2 := pack(128), pack(192)
	first := make(chan error, 1)
	go func() {
		_, err := e.Control().Deploy(context.WithValue(context.Background(), holdKey{}, 1), "fn", bytes.NewReader(x1), false)
		first <- err
	}()
	<-store.landed
	rel := make(chan struct{})
	making := d.arm(&d.newEntered, &d.newRelease, rel)
	second := make(chan error, 1)
	go func() {
		_, err := e.Control().Deploy(context.Background(), "fn", bytes.NewReader(x2), false)
		second <- err
	}()
	<-making // X2's own warm makes its instance
	close(store.release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	close(rel)
	if err := <-second; err != nil {
		t.Fatal(err)
	}
	if fi := info(t, e, "fn"); fi.Idle+fi.Busy != 1 {
		t.Errorf("%d instances of the current version for min_instances 1", fi.Idle+fi.Busy)
	}
}
