package engine_test

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
	"github.com/plover-run/plover/registry"
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
		rec := api.Record{Name: name, Current: current, Versions: []api.Version{{ID: current, SHA256: fmt.Sprintf("%064x", 1)}}}
		b, _ := json.Marshal(rec)
		if err := fs.Put(ctx, "functions/"+name+".json", bytes.NewReader(b), int64(len(b))); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < n; i++ {
		write(fmt.Sprintf("f%04d", i), "v1")
	}
	e := testkit.Engine(t, engine.Config{Store: store})
	for i := 0; i < n; i++ { // the node resolves every function (the load fails: no bundle; no matter)
		e.Invoke(ctx, fmt.Sprintf("f%04d", i), &call.Request{})
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

// md5Store gives objects S3's ETag for a single-part upload: the MD5 of
// the bytes, so a record written back to earlier bytes has its earlier tag.
type md5Store struct{ objectstore.Store }

func md5Tag(s objectstore.Store, ctx context.Context, key string) string {
	rc, err := s.Get(ctx, key)
	if err != nil {
		return ""
	}
	defer rc.Close()
	h := md5.New()
	io.Copy(h, rc)
	return hex.EncodeToString(h.Sum(nil))
}

func (s md5Store) List(ctx context.Context, prefix string) ([]objectstore.Info, error) {
	infos, err := s.Store.List(ctx, prefix)
	for i := range infos {
		infos[i].ETag = md5Tag(s.Store, ctx, infos[i].Key)
	}
	return infos, err
}

func (s md5Store) GetTagged(ctx context.Context, key string) (io.ReadCloser, objectstore.Info, error) {
	rc, in, err := s.Store.GetTagged(ctx, key)
	if err == nil {
		in.ETag = md5Tag(s.Store, ctx, key)
	}
	return rc, in, err
}

// PutIf checks the MD5 tag (not atomically: the test has one writer).
func (s md5Store) PutIf(ctx context.Context, key string, r io.Reader, size int64, ifMatch string) error {
	cur := md5Tag(s.Store, ctx, key)
	if cur != ifMatch {
		return objectstore.ErrPrecondition
	}
	return s.Store.Put(ctx, key, r, size)
}

// A node's own rollback makes the tag it applied stale: when another node
// rolls the record back to the very bytes (and tag) it had, this node
// still follows.
func TestPollSeesARecordReturningToItsOldBytes(t *testing.T) {
	fs, _ := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	store := md5Store{fs}
	ctx := context.Background()
	e := testkit.Engine(t, engine.Config{Store: store})
	m := testkit.Manifest("fn")
	v1 := testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	m.OutBytes = 128
	v2 := testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	reg := registry.Registry{Store: store}
	if _, _, err := reg.SetCurrent(ctx, "fn", v1.Version); err != nil { // another node
		t.Fatal(err)
	}
	e.Refresh(ctx)                                                         // applies the record (current v1) and its tag
	if _, err := e.Control().Rollback(ctx, "fn", v2.Version); err != nil { // this node
		t.Fatal(err)
	}
	if _, _, err := reg.SetCurrent(ctx, "fn", v1.Version); err != nil { // another node: the old bytes again
		t.Fatal(err)
	}
	e.Refresh(ctx)
	req := &call.Request{Input: []byte("x")}
	if err := e.Invoke(ctx, "fn", req); err != nil {
		t.Fatal(err)
	}
	if req.Version != v1.Version {
		t.Fatalf("node serves %s; the store's current version is %s", req.Version, v1.Version)
	}
}
