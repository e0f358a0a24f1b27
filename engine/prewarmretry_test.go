package engine_test

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
)

// bundleOutage is a store whose bundle reads fail while down is set: a
// store unreachable for a moment, its records read before.
type bundleOutage struct {
	objectstore.Store
	down atomic.Bool
}

func (s *bundleOutage) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if s.down.Load() && strings.HasPrefix(key, "bundles/") {
		return nil, errors.New("the store is unreachable a moment")
	}
	return s.Store.Get(ctx, key)
}

// A pre-warm that fails before its bundle is loaded (a poll's, the store
// unreachable a moment) is tried again by the reaper, with the top-ups'
// back-off: at the next pass, then 20 s after a second failure. Before,
// the reaper topped up loaded versions only, and the version stayed cold
// until its first request.
func TestFailedPrewarmIsTriedAgain(t *testing.T) {
	ctx := context.Background()
	fs, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	store := &bundleOutage{Store: fs}
	a := testkit.Engine(t, engine.Config{Store: fs})
	b := testkit.Engine(t, engine.Config{Store: store})
	m := testkit.Manifest("pw")
	testkit.Deploy(t, a, testkit.BundleDir(t, m, nil))
	if err := b.Invoke(ctx, "pw", &call.Request{Input: []byte{1}}); err != nil {
		t.Fatal(err)
	}
	m.MinInstances, m.OutBytes = 1, 128
	testkit.Deploy(t, a, testkit.BundleDir(t, m, nil))
	store.down.Store(true)
	if err := b.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the poll's pre-warm to fail", func() bool { return b.AsideWarms() == 0 && !b.ToppingUp("pw") })
	t0 := time.Now()
	b.Reap(t0)
	waitUntil(t, "a top-up to fail", func() bool { return !b.ToppingUp("pw") && b.TopUpFails("pw") == 1 })
	store.down.Store(false)
	b.Reap(t0.Add(15 * time.Second))
	if b.ToppingUp("pw") || b.TopUpFails("pw") != 1 {
		t.Fatal("a top-up was tried 15 s after one failed, not 20")
	}
	b.Reap(t0.Add(25 * time.Second))
	testkit.WaitFor(t, b, "pw", "its min_instances 1 after the store came back", idle(1))
	if n := b.TopUpFails("pw"); n != 0 {
		t.Errorf("%d top-up failures counted after one succeeded", n)
	}
}
