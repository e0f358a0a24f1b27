package engine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
	"github.com/plover-run/plover/registry"
)

// bundleGets counts the reads of bundles (not of records) from a store.
type bundleGets struct {
	objectstore.Store
	n atomic.Int64
}

func (s *bundleGets) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if strings.HasPrefix(key, "bundles/") {
		s.n.Add(1)
	}
	return s.Store.Get(ctx, key)
}

// storeAsOldServer stores a bundle of m's library with the manifest raw,
// written as a server before the manifest's newer rules took it (packed
// by hand, its record published with m), and returns the bundle's bytes.
func storeAsOldServer(t *testing.T, store objectstore.Store, m *abi.Manifest, raw string) []byte {
	t.Helper()
	lib, err := os.ReadFile(filepath.Join(testkit.BundleDir(t, m, nil), m.Library))
	if err != nil {
		t.Fatal(err)
	}
	b := testkit.RawBundle(t, [2]string{abi.ManifestFile, raw}, [2]string{m.Library, string(lib)})
	if _, _, err := (registry.Registry{Store: store}).Publish(context.Background(), m, bytes.NewReader(b), bundle.Digest(b), int64(len(b)), false); err != nil {
		t.Fatal(err)
	}
	return b
}

// withKey is m as JSON with key: value added first.
func withKey(t *testing.T, m *abi.Manifest, key, value string) string {
	t.Helper()
	j, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return `{"` + key + `":` + value + `,` + string(j[1:])
}

// A version stored before a rule for new manifests came (a key in
// another case, refused at deploy since 9eb6cdf) still loads and runs on
// an upgraded node: only deploys are held to the rule, and a fresh
// deploy of the same bundle is refused naming the key. Before, every
// invoke answered 503 "cannot prepare its bundle" and fetched it again.
func TestUpgradeKeepsStoredManifests(t *testing.T) {
	ctx := context.Background()
	fs, err := objectstore.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	store := &bundleGets{Store: fs}
	m := testkit.Manifest("old")
	b := storeAsOldServer(t, store, m, withKey(t, m, "Zero_Out", "true"))
	e := testkit.Engine(t, engine.Config{Store: store})
	invoke(t, e, "old", []byte{1})

	_, err = e.Control().Deploy(ctx, "old", bytes.NewReader(b), true)
	if errdefs.KindOf(err) != errdefs.KindInvalid || !strings.Contains(err.Error(), `Zero_Out: no such field (did you mean "zero_out"?`) {
		t.Errorf("a fresh deploy of the stored bundle: %v (kind %v), want 422 naming Zero_Out", err, errdefs.KindOf(err))
	}

	// One that no rule old or new takes is refused once, 422, and not
	// fetched again at each request.
	bad := testkit.Manifest("bad")
	storeAsOldServer(t, store, bad, withKey(t, bad, "max_queue", "-1"))
	store.n.Store(0)
	for i := range 3 {
		err := e.Invoke(ctx, "bad", &call.Request{Input: []byte{1}})
		if errdefs.KindOf(err) != errdefs.KindInvalid || !strings.Contains(err.Error(), "max_queue: -1 must be in") {
			t.Errorf("invoke %d of a stored bundle whose manifest is refused: %v (kind %v), want 422 naming max_queue", i, err, errdefs.KindOf(err))
		}
	}
	if n := store.n.Load(); n != 1 {
		t.Errorf("the refused bundle was fetched %d times for 3 invokes, want 1", n)
	}
}

// A stored bundle naming a field this node's plover does not know (a newer
// server sharing the store admitted it: a rolling upgrade) is 503, this
// node cannot run it and another may, not 422 the bundle's fault; kept,
// not fetched again at each request.
func TestStoredManifestWithAFieldFromANewerServer(t *testing.T) {
	ctx := context.Background()
	fs, err := objectstore.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	store := &bundleGets{Store: fs}
	m := testkit.Manifest("future")
	storeAsOldServer(t, store, m, withKey(t, m, "future_field", "1"))
	e := testkit.Engine(t, engine.Config{Store: store})
	for i := range 3 {
		err := e.Invoke(ctx, "future", &call.Request{Input: []byte{1}})
		if errdefs.KindOf(err) != errdefs.KindUnavailable || !strings.Contains(err.Error(), "future_field: no such field") {
			t.Errorf("invoke %d: %v (kind %v), want 503 naming future_field", i, err, errdefs.KindOf(err))
		}
	}
	if n := store.n.Load(); n != 1 {
		t.Errorf("fetched %d times for 3 invokes, want 1", n)
	}
}

// A version stored with idle_ttl 0, which the reaper read as "never
// release" until deploys refused it, loads on an upgraded node and takes
// the server's --idle-ttl, saying so in the log: released after the
// server's 100 ms, kept where the server's is negative (never). A fresh
// deploy of its bundle is refused naming the field.
func TestStoredIdleTTLZeroTakesTheServers(t *testing.T) {
	for _, tc := range []struct {
		name      string
		serverTTL time.Duration
		unloaded  bool
	}{
		{"the server releases after 100ms", 100 * time.Millisecond, true},
		{"the server never releases", -1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store, err := objectstore.NewFS(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			m := testkit.Manifest("old")
			m.IdleTTL = "0s"
			raw, err := json.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			b := storeAsOldServer(t, store, m, string(raw))
			var logs testkit.LogBuffer
			e := testkit.Engine(t, engine.Config{Store: store, IdleTTL: tc.serverTTL, Log: slog.New(slog.NewTextHandler(&logs, nil))})
			invoke(t, e, "old", []byte{1})
			e.Reap(time.Now().Add(time.Hour))
			if fi := info(t, e, "old"); fi.Loaded == tc.unloaded {
				t.Errorf("server --idle-ttl %v, an hour idle: loaded %v, want %v", tc.serverTTL, fi.Loaded, !tc.unloaded)
			}
			if want := "idle_ttl 0 in a manifest stored before deploys refused it: the server's --idle-ttl applies"; !strings.Contains(logs.String(), want) {
				t.Errorf("log does not say %q:\n%s", want, logs.String())
			}
			_, err = e.Control().Deploy(context.Background(), "old", bytes.NewReader(b), true)
			if errdefs.KindOf(err) != errdefs.KindInvalid || !strings.Contains(err.Error(), `idle_ttl: "0s" would release no idle instance ever`) {
				t.Errorf("a fresh deploy of the stored bundle: %v (kind %v), want 422 naming idle_ttl", err, errdefs.KindOf(err))
			}
		})
	}
}
