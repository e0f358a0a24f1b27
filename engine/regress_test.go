package engine_test

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
)

type slowKey struct{}

// Regression tests for races a review found: a Refresh applying a record it
// read before a deploy or delete on this node, and memory eviction
// unloading functions whose unload frees nothing.

// slowStore delays record reads made with a marked context, after reading
// them: a store round trip that returns what was current when it started.
type slowStore struct {
	objectstore.Store
	read chan struct{} // signalled once a marked read has its data
}

func (s slowStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	rc, _, err := s.GetTagged(ctx, key)
	return rc, err
}

// GetTagged is how the registry reads records.
func (s slowStore) GetTagged(ctx context.Context, key string) (io.ReadCloser, objectstore.Info, error) {
	rc, info, err := s.Store.GetTagged(ctx, key)
	if err != nil || ctx.Value(slowKey{}) == nil || !strings.HasPrefix(key, "functions/") {
		return rc, info, err
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	s.read <- struct{}{}
	time.Sleep(300 * time.Millisecond)
	return io.NopCloser(bytes.NewReader(b)), info, nil
}

func newSlowEngine(t *testing.T) (*engine.Engine, chan struct{}) {
	fs, _ := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	read := make(chan struct{}, 8)
	return testkit.Engine(t, engine.Config{Store: slowStore{fs, read}}), read
}

func TestRefreshDoesNotRevertAConcurrentDeploy(t *testing.T) {
	e, read := newSlowEngine(t)
	m := testkit.Manifest("echo")
	v1 := testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	m.OutBytes = 128 // a different bundle
	dir2 := testkit.BundleDir(t, m, nil)
	done := make(chan struct{})
	go func() { e.Refresh(context.WithValue(context.Background(), slowKey{}, 1)); close(done) }()
	<-read // Refresh has read the record (v1)
	v2 := testkit.Deploy(t, e, dir2)
	<-done
	req := &call.Request{Input: []byte("x")}
	if err := e.Invoke(context.Background(), "echo", req); err != nil {
		t.Fatal(err)
	}
	t.Logf("v1=%s v2=%s (current in the store); node serves %s", v1.Version, v2.Version, req.Version)
	if req.Version != v2.Version {
		t.Errorf("after deploy returned v2, a concurrent Refresh switched the node back to v1")
	}
}

func TestRefreshDoesNotResurrectADeletedFunction(t *testing.T) {
	e, read := newSlowEngine(t)
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	done := make(chan struct{})
	go func() { e.Refresh(context.WithValue(context.Background(), slowKey{}, 1)); close(done) }()
	<-read // Refresh has read the record
	if err := e.Control().Delete(context.Background(), "echo", false); err != nil {
		t.Fatal(err)
	}
	<-done
	err := e.Invoke(context.Background(), "echo", &call.Request{Input: []byte("x")})
	t.Logf("invoke after delete: %v", err)
	if err == nil {
		t.Errorf("deleted function still runs on this node (until the next Refresh)")
	}
}

// Functions without constants free nothing when unloaded, yet reserve
// unloads every idle one before it gives up with 503.
func TestEvictionSkipsWhatFreesNothing(t *testing.T) {
	m := testkit.Manifest("x")
	per := m.MaxInputBytes + m.TmpBytes + m.OutBytes
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{device.NewHost(per + per/2)}})
	for _, n := range []string{"x", "y", "b"} {
		testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest(n), nil))
	}
	slow := testkit.Manifest("slow")
	slow.Chain = []abi.Launch{{Kernel: "sleep_ms", Grid: 1000, Block: 1}}
	testkit.Deploy(t, e, testkit.BundleDir(t, slow, nil))
	ctx := context.Background()
	inv := func(n string) error { return e.Invoke(ctx, n, &call.Request{Input: []byte("x")}) }
	inv("x")
	inv("y") // evicts x's idle instance: x is loaded with no instance
	slowDone := make(chan error)
	go func() { slowDone <- inv("slow") }() // evicts y's idle instance, then holds the memory
	testkit.WaitFor(t, e, "slow", "slow running", testkit.Busy(1, 0))
	if err := inv("b"); errdefs.KindOf(err) != errdefs.KindUnavailable {
		t.Fatalf("b with everything else busy or unevictable: %v, want 503", err)
	}
	for _, n := range []string{"x", "y"} {
		fi, _ := e.Control().Function(ctx, n)
		t.Logf("%s loaded=%v", n, fi.Loaded)
		if !fi.Loaded {
			t.Errorf("%s (no constants) was unloaded though that freed no memory, and b still failed", n)
		}
	}
	if err := <-slowDone; err != nil {
		t.Fatal(err)
	}
}

// A poll that takes in another node's deploy of a function with
// min_instances pre-warms it aside: a constructor that takes its time (up
// to the request timeout) must not hold up following the other functions'
// changes, a delete among them. Before, Refresh waited for the load.
func TestRefreshDoesNotWaitForAPrewarm(t *testing.T) {
	ctx := context.Background()
	store, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	d := &holdLoads{Device: device.NewHost(0), release: make(chan struct{})}
	a := testkit.Engine(t, engine.Config{Store: store})
	b := testkit.Engine(t, engine.Config{Store: store, Devices: []device.Device{d}})
	m := testkit.Manifest("warm")
	testkit.Deploy(t, a, testkit.BundleDir(t, m, nil))
	if err := b.Invoke(ctx, "warm", &call.Request{Input: []byte{1}}); err != nil {
		t.Fatal(err) // b has it now, so b's polls follow it
	}
	m.MinInstances, m.OutBytes = 1, 128 // a new version b pre-warms
	testkit.Deploy(t, a, testkit.BundleDir(t, m, nil))
	d.loading = make(chan struct{})
	refreshed := make(chan error, 1)
	go func() { refreshed <- b.Refresh(ctx) }()
	<-d.loading // the pre-warm's load is under way, held
	released := false
	defer func() {
		if !released {
			close(d.release)
		}
	}()
	select {
	case err := <-refreshed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Refresh still waits for a pre-warm's load after 10 s")
	}
	// A third version lands while the second's pre-warm is under way: the
	// one under way warms it next, with no request and no poll.
	m.OutBytes = 256
	v3 := testkit.Deploy(t, a, testkit.BundleDir(t, m, nil))
	if err := b.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	close(d.release)
	released = true
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		fi := info(t, b, "warm")
		if fi.Version == v3.Version && fi.Loaded && fi.Idle >= 1 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("b has %s, loaded %v, %d idle 10 s after a pre-warm under way ended; want %s warm", fi.Version, fi.Loaded, fi.Idle, v3.Version)
		}
	}
}
