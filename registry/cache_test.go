package registry

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"sync/atomic"
	"testing"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/objectstore"
)

// countingStore counts the objects read.
type countingStore struct {
	objectstore.Store
	reads atomic.Int64
}

func (c *countingStore) GetTagged(ctx context.Context, key string) (io.ReadCloser, objectstore.Info, error) {
	c.reads.Add(1)
	return c.Store.GetTagged(ctx, key)
}

// With a Cache, a listing reads only the records written since the last
// one; what it returns is what a listing without the cache returns.
func TestListReadsOnlyChangedRecords(t *testing.T) {
	ctx := context.Background()
	fs, err := objectstore.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	st := &countingStore{Store: fs}
	put := func(name, current string) {
		b, _ := json.Marshal(api.Record{Name: name, Current: current, Versions: []api.Version{{ID: current}}})
		if err := fs.Put(ctx, recordKey(name), bytes.NewReader(b), int64(len(b))); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{"a", "b", "c"} {
		put(n, "v1")
	}
	cached, plain := Registry{Store: st, Cache: NewCache()}, Registry{Store: fs}
	list := func(step string, wantReads int64, want map[string]string) {
		t.Helper()
		before := st.reads.Load()
		recs, err := cached.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := st.reads.Load() - before; got != wantReads {
			t.Errorf("%s: %d records read, want %d", step, got, wantReads)
		}
		ref, _ := plain.List(ctx)
		if len(recs) != len(want) || len(ref) != len(want) {
			t.Fatalf("%s: %d records (%d without the cache), want %d", step, len(recs), len(ref), len(want))
		}
		for i, r := range recs {
			if want[r.Name] != r.Current || ref[i].Name != r.Name || ref[i].Current != r.Current {
				t.Errorf("%s: %s at %s (without the cache %s at %s), want %s", step, r.Name, r.Current, ref[i].Name, ref[i].Current, want[r.Name])
			}
		}
	}
	list("first", 3, map[string]string{"a": "v1", "b": "v1", "c": "v1"})
	list("unchanged", 0, map[string]string{"a": "v1", "b": "v1", "c": "v1"})
	put("b", "v2")
	fs.Delete(ctx, recordKey("c"))
	put("d", "v1")
	list("one rewritten, one deleted, one new", 2, map[string]string{"a": "v1", "b": "v2", "d": "v1"})
	list("unchanged again", 0, map[string]string{"a": "v1", "b": "v2", "d": "v1"})
}
