package engine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
)

// Names (a did-you-mean's candidates) has the store's functions, those this
// node never resolved included, and costs the store one listing however
// many requests ask in a row; a node that polls lists none of its own.
func TestNamesListOnce(t *testing.T) {
	fs, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 20 {
		name := fmt.Sprintf("f%02d", i)
		b, _ := json.Marshal(api.Record{Name: name, Current: "v1", Versions: []api.Version{{ID: "v1", SHA256: fmt.Sprintf("%064x", 1)}}})
		if err := fs.Put(ctx, "functions/"+name+".json", bytes.NewReader(b), int64(len(b))); err != nil {
			t.Fatal(err)
		}
	}
	store := &countingStore{Store: fs}
	e := testkit.Engine(t, engine.Config{Store: store})
	for range 100 {
		if names := e.Names(); len(names) != 20 || !slices.Contains(names, "f07") {
			t.Fatalf("names %q, want the store's 20", names)
		}
	}
	if n := store.lists.Load(); n != 1 {
		t.Errorf("100 asks listed the store %d times, want 1", n)
	}

	polled := testkit.Engine(t, engine.Config{Store: store})
	if err := polled.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	store.lists.Store(0)
	if names := polled.Names(); len(names) != 20 || store.lists.Load() != 0 {
		t.Errorf("after a poll: %d names, %d listings of its own; want 20 and none", len(names), store.lists.Load())
	}
}
