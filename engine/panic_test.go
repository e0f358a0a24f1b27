package engine_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
)

// A run that panics goes up to the request's caller (the transport, which
// recovers it: a 500), batched or not, with its instance closed and not
// put back: the next request runs on a fresh one. A batched run panicked
// in the batcher's own goroutine, where nothing recovered it: the test
// binary (plover serve) died. Unbatched, the instance was dropped unclosed
// and stayed counted busy for ever.
func TestRunThatPanicsClosesItsInstance(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    *abi.Manifest
		dir  func(t *testing.T, m *abi.Manifest) string
	}{
		{"unbatched", testkit.Manifest("echo"), func(t *testing.T, m *abi.Manifest) string { return testkit.BundleDir(t, m, nil) }},
		{"batched", testkit.BatchManifest("b", 4, ""), func(t *testing.T, m *abi.Manifest) string { return batchBundle(t, m) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev := &testkit.PanicDevice{Device: device.NewHost(0)}
			e := testkit.Engine(t, engine.Config{Devices: []device.Device{dev}})
			testkit.Deploy(t, e, tc.dir(t, tc.m))
			invoke := func(in []byte) (panicked any, err error) {
				defer func() { panicked = recover() }()
				return nil, e.Invoke(context.Background(), tc.m.Name, &call.Request{Input: in})
			}
			if p, err := invoke(item(1, 0)); err != nil || p != nil {
				t.Fatalf("the first request: %v, panic %v", err, p)
			}
			p, _ := invoke(testkit.PanicInput)
			if p == nil || !strings.Contains(fmt.Sprint(p), "a device bug") {
				t.Fatalf("the request whose run panicked: panic %v, want the device's", p)
			}
			if made, closed := dev.Made.Load(), dev.Closed.Load(); made != 1 || closed != 1 {
				t.Fatalf("after the panic: %d instances made, %d closed, want the one closed", made, closed)
			}
			fi, err := e.Control().Function(context.Background(), tc.m.Name)
			if err != nil || fi.Busy != 0 || fi.Idle != 0 {
				t.Fatalf("after the panic: %d instances busy, %d idle (%v), want none", fi.Busy, fi.Idle, err)
			}
			// Its transport answers the panic 500: plover ls counts it so,
			// not as a success.
			if fi.Requests != 2 || fi.Errors != 1 || fi.ClientErrors != 0 {
				t.Errorf("after the panic: %d requests, %d errors, %d client errors, want 2, 1, 0", fi.Requests, fi.Errors, fi.ClientErrors)
			}
			if p, err := invoke(item(2, 0)); err != nil || p != nil {
				t.Fatalf("the next request: %v, panic %v", err, p)
			}
			if made := dev.Made.Load(); made != 2 {
				t.Errorf("the next request ran on one of %d instances made, want a fresh one (2)", made)
			}
		})
	}
}

// panicRecords is a store with a bug: reading the record of a function
// named "bug" panics.
type panicRecords struct{ objectstore.Store }

func (s panicRecords) GetTagged(ctx context.Context, key string) (io.ReadCloser, objectstore.Info, error) {
	if strings.Contains(key, "/bug") {
		panic("a bug in the store")
	}
	return s.Store.GetTagged(ctx, key)
}

// A name's record is read on a goroutine of its own, which the lookups of
// the name share: a panic there (a bug in a store's Go code, or a load's)
// ended the process. It reaches the lookups' requests, for their
// transport to recover, and the name is read afresh by the next one.
func TestPanicInARecordReadReachesTheRequest(t *testing.T) {
	fs, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	deployer := testkit.Engine(t, engine.Config{Store: fs})
	testkit.Deploy(t, deployer, testkit.BundleDir(t, testkit.Manifest("bug"), nil))
	testkit.Deploy(t, deployer, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	e := testkit.Engine(t, engine.Config{Store: panicRecords{fs}}) // has not read either
	invoke := func(name string) (panicked any, err error) {
		defer func() { panicked = recover() }()
		return nil, e.Invoke(context.Background(), name, &call.Request{Input: []byte("x")})
	}
	for i := range 2 { // the second reads again: the first left no flight behind
		if p, _ := invoke("bug"); p == nil || !strings.Contains(fmt.Sprint(p), "a bug in the store") {
			t.Fatalf("request %d for bug: panic %v, want the store's", i+1, p)
		}
	}
	if p, err := invoke("echo"); p != nil || err != nil {
		t.Fatalf("a request for echo: panic %v, err %v", p, err)
	}
}

// armedRecords is panicRecords once armed: the names resolve first.
type armedRecords struct {
	objectstore.Store
	armed *atomic.Bool
}

func (s armedRecords) GetTagged(ctx context.Context, key string) (io.ReadCloser, objectstore.Info, error) {
	if s.armed.Load() {
		return panicRecords{s.Store}.GetTagged(ctx, key)
	}
	return s.Store.GetTagged(ctx, key)
}

// Refresh follows other nodes' changes on a goroutine of its own, with no
// transport above it: a panic applying one record (a bug the record
// reaches) ended the process, and every node's, and each again after its
// restart. It is that name's error now; the other names are applied.
func TestPanicInARefreshIsItsNamesError(t *testing.T) {
	fs, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	deployer := testkit.Engine(t, engine.Config{Store: fs})
	bug, echo := testkit.BundleDir(t, testkit.Manifest("bug"), nil), testkit.BundleDir(t, testkit.Manifest("echo"), nil)
	testkit.Deploy(t, deployer, bug)
	testkit.Deploy(t, deployer, echo)
	var armed atomic.Bool
	e := testkit.Engine(t, engine.Config{Store: armedRecords{fs, &armed}})
	for _, name := range []string{"bug", "echo"} {
		if err := e.Invoke(context.Background(), name, &call.Request{Input: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	redeploy := func(dir string) string {
		b, _, m, err := bundle.PackBytes(dir)
		if err != nil {
			t.Fatal(err)
		}
		fi, err := deployer.Control().Deploy(context.Background(), m.Name, bytes.NewReader(b), true)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Version
	}
	redeploy(bug)
	v2 := redeploy(echo)
	armed.Store(true)
	err = noPanic(t, "Refresh", func() error { return e.Refresh(context.Background()) })
	if err == nil || !strings.Contains(err.Error(), "function bug: applying its record panicked: a bug in the store") {
		t.Fatalf("Refresh: %v, want bug's panic as its error", err)
	}
	if fi, err := e.Control().Function(context.Background(), "echo"); err != nil || fi.Version != v2 {
		t.Fatalf("echo after the refresh: version %q (%v), want %q", fi.Version, err, v2)
	}
}
