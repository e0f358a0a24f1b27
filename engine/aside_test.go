package engine_test

import (
	"bytes"
	"context"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
)

// gatedDevice holds the next program load, and the next instance made,
// once armed, and counts the instances made.
type gatedDevice struct {
	device.Device
	mu                       sync.Mutex
	loadEntered, loadRelease chan struct{}
	newEntered, newRelease   chan struct{}
	news                     atomic.Int32
}

// gate holds until release, if armed (*entered non-nil), once.
func (d *gatedDevice) gate(entered, release *chan struct{}) {
	d.mu.Lock()
	in, out := *entered, *release
	*entered, *release = nil, nil
	d.mu.Unlock()
	if in != nil {
		close(in)
		<-out
	}
}

func (d *gatedDevice) Load(ctx context.Context, spec device.ProgramSpec) (device.Program, error) {
	d.gate(&d.loadEntered, &d.loadRelease)
	p, err := d.Device.Load(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &gatedProgram{Program: p, d: d}, nil
}

type gatedProgram struct {
	device.Program
	d *gatedDevice
}

func (p *gatedProgram) NewInstance(cfg device.InstanceConfig) (device.Instance, error) {
	p.d.news.Add(1)
	p.d.gate(&p.d.newEntered, &p.d.newRelease)
	return p.Program.NewInstance(cfg)
}

// arm makes the next load (or instance) wait until release is closed; it
// returns the channel closed once one does.
func (d *gatedDevice) arm(entered, release *chan struct{}, rel chan struct{}) chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	*entered, *release = make(chan struct{}), rel
	return *entered
}

// A poll's pre-warm aside of v2 is under way (its load held) when this
// node deploys a version itself, whose deploy pre-warms it (its instance
// held). The aside warm, once over, does not warm that version beside the
// deploy's warm: that made it two instances for a min_instances of 1 (a
// reviewer's test), whether or not a poll meanwhile left the warm another
// version (v3, from the other node, replaced by this node's deploy).
func TestAsideWarmLeavesALocalDeploysWarmAlone(t *testing.T) {
	for _, asked := range []bool{false, true} {
		t.Run(map[bool]string{false: "alone", true: "a poll asked for another"}[asked], func(t *testing.T) {
			asideBesideALocalDeploy(t, asked)
		})
	}
}

func asideBesideALocalDeploy(t *testing.T, asked bool) {
	ctx := context.Background()
	store, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	d := &gatedDevice{Device: device.NewHost(0)}
	a := testkit.Engine(t, engine.Config{Store: store})
	b := testkit.Engine(t, engine.Config{Store: store, Devices: []device.Device{d}})
	m := testkit.Manifest("warm")
	testkit.Deploy(t, a, testkit.BundleDir(t, m, nil))
	if err := b.Invoke(ctx, "warm", &call.Request{Input: []byte{1}}); err != nil {
		t.Fatal(err)
	}
	m.MinInstances, m.OutBytes = 1, 128
	testkit.Deploy(t, a, testkit.BundleDir(t, m, nil))
	loadRelease := make(chan struct{})
	loading := d.arm(&d.loadEntered, &d.loadRelease, loadRelease)
	if err := b.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	<-loading // v2's pre-warm aside
	if asked {
		m.OutBytes = 192
		testkit.Deploy(t, a, testkit.BundleDir(t, m, nil))
		if err := b.Refresh(ctx); err != nil { // leaves the warm under way v3
			t.Fatal(err)
		}
	}
	newRelease := make(chan struct{})
	making := d.arm(&d.newEntered, &d.newRelease, newRelease)
	m.OutBytes = 256
	raw, _, _, err := bundle.PackBytes(testkit.BundleDir(t, m, nil))
	if err != nil {
		t.Fatal(err)
	}
	deployed := make(chan error, 1)
	go func() {
		_, err := b.Control().Deploy(ctx, "warm", bytes.NewReader(raw), false)
		deployed <- err
	}()
	<-making // the deploy's warm of its version makes its instance
	close(loadRelease)
	for end := time.Now().Add(10 * time.Second); b.AsideWarms() > 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the pre-warm aside still under way 10 s after its load was let go")
		}
	}
	close(newRelease)
	if err := <-deployed; err != nil {
		t.Fatal(err)
	}
	if fi := info(t, b, "warm"); fi.Idle+fi.Busy != 1 {
		t.Fatalf("the version deployed here has %d instances for min_instances 1 (instances made: %d)", fi.Idle+fi.Busy, d.news.Load())
	}
}
