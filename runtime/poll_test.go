package runtime_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
	"github.com/plover-run/plover/runtime"
	"github.com/plover-run/plover/runtime/registry"
)

// countingStore counts the store requests a node makes.
type countingStore struct {
	objectstore.Store
	lists, gets atomic.Int64
}

func (s *countingStore) List(ctx context.Context, prefix string) ([]objectstore.Info, error) {
	s.lists.Add(1)
	return s.Store.List(ctx, prefix)
}

func (s *countingStore) GetTagged(ctx context.Context, key string) (io.ReadCloser, objectstore.Info, error) {
	s.gets.Add(1)
	return s.Store.GetTagged(ctx, key)
}

func (s *countingStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	s.gets.Add(1)
	return s.Store.Get(ctx, key)
}

// What a node's poll costs the store with 1,000 functions: one listing,
// plus one read per record that changed since the last poll.
func TestPollCost(t *testing.T) {
	fs, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	store := &countingStore{Store: fs}
	const n = 1000
	ctx := context.Background()
	write := func(name, current string) {
		rec := registry.Record{Name: name, Current: current, Versions: []registry.Version{{ID: current, SHA256: fmt.Sprintf("%064x", 1)}}}
		b, _ := json.Marshal(rec)
		if err := fs.Put(ctx, "functions/"+name+".json", bytes.NewReader(b), int64(len(b))); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < n; i++ {
		write(fmt.Sprintf("f%04d", i), "v1")
	}
	e := testkit.Engine(t, runtime.Config{Store: store})
	for i := 0; i < n; i++ { // the node resolves every function (the load fails: no bundle; no matter)
		e.Invoke(ctx, fmt.Sprintf("f%04d", i), &runtime.Request{})
	}
	e.Refresh(ctx) // the first poll reads every record once
	for _, tt := range []struct {
		name    string
		changed int
	}{{"nothing changed", 0}, {"three records changed", 3}, {"nothing changed again", 0}} {
		for i := 0; i < tt.changed; i++ {
			write(fmt.Sprintf("f%04d", i*7), "v2-"+tt.name)
		}
		store.lists.Store(0)
		store.gets.Store(0)
		if err := e.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %d listing(s), %d record reads for %d functions", tt.name, store.lists.Load(), store.gets.Load(), n)
		if store.lists.Load() != 1 || store.gets.Load() != int64(tt.changed) {
			t.Errorf("%s: %d listings and %d reads, want 1 and %d", tt.name, store.lists.Load(), store.gets.Load(), tt.changed)
		}
	}
}
