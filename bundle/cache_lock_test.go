package bundle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/objectstore"
)

// lockRefs is how many hold or wait for sha's lock; -1 when the lock is
// not in c.locks.
func lockRefs(c *Cache, sha string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.locks[sha]; ok {
		return l.refs
	}
	return -1
}

// waitFor polls cond, which another goroutine makes true, for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("no %s in 10 s", what)
		}
	}
}

// A bundle's lock leaves the cache with its last holder, whatever the Get
// ended in: one kept for each bundle ever asked for grew the map for the
// process's life.
func TestCacheLocksLeaveWithTheirLastHolder(t *testing.T) {
	store, _, c := storedBundle(t)
	ctx := context.Background()
	for i := range 40 {
		sha := putBundle(t, store, byte(i), 1<<10)
		if err := cacheGet(c, store, sha); err != nil {
			t.Fatal(err)
		}
		// A deploy's copy of a bundle the cache has: Adopt's failed rename.
		if err := cacheAdopt(c, store, sha); err != nil {
			t.Fatal(err)
		}

		var fe *FetchError
		if err := cacheGet(c, store, Digest([]byte{byte(i)})); !errors.As(err, &fe) {
			t.Fatalf("a bundle the store lacks: %v, want a FetchError", err)
		}
		junk := []byte(fmt.Sprintf("not a bundle %d", i))
		if err := store.Put(ctx, ObjectKey(Digest(junk)), strings.NewReader(string(junk)), int64(len(junk))); err != nil {
			t.Fatal(err)
		}
		var be *Error
		if err := cacheGet(c, store, Digest(junk)); !errors.As(err, &be) {
			t.Fatalf("a bundle that is not one: %v, want it refused", err)
		}
	}
	c.mu.Lock()
	left := len(c.locks)
	c.mu.Unlock()
	if left != 0 {
		t.Errorf("%d bundles' locks left after their Gets ended", left)
	}
}

// gatedStore holds each Get until the test answers the gate it sends: nil
// to serve the object, or the error to fail with.
type gatedStore struct {
	objectstore.Store
	calls chan chan error
}

func (s gatedStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	gate := make(chan error)
	s.calls <- gate
	if err := <-gate; err != nil {
		return nil, err
	}
	return s.Store.Get(ctx, key)
}

// Gets of one bundle still take turns with the lock leaving the map: one
// that arrives while another fetches waits on that one's lock, not on a
// new one of its own, also after a third let go of the lock they shared.
func TestCacheGetsOfABundleTakeTurns(t *testing.T) {
	store, sha, c := storedBundle(t)
	gs := gatedStore{Store: store, calls: make(chan chan error)}
	results := make(chan error, 3)
	get := func() { results <- cacheGet(c, gs, sha) }
	result := func() error {
		t.Helper()
		select {
		case err := <-results:
			return err
		case <-gs.calls:
			t.Fatal("a Get fetched while another held the bundle's lock")
		}
		return nil
	}

	go get()
	first := <-gs.calls // in the store, holding sha's lock
	go get()
	waitFor(t, "second Get at the bundle's lock", func() bool { return lockRefs(c, sha) == 2 })
	first <- errors.New("store down")
	if err := result(); err == nil {
		t.Fatal("the first Get did not fail with its store")
	}
	second := <-gs.calls // let go of by the first's failure, it fetches
	go get()
	waitFor(t, "third Get at the second's lock", func() bool {
		select {
		case <-gs.calls:
			t.Fatal("a third Get fetched while the second held the bundle's lock")
		default:
		}
		return lockRefs(c, sha) == 2
	})
	second <- nil
	for range 2 {
		if err := result(); err != nil {
			t.Fatal(err)
		}
	}
	if n := lockRefs(c, sha); n != -1 {
		t.Errorf("the bundle's lock is left with %d holders", n)
	}
}

// A directory the cache sets aside (a stray in a fetch's way, a damaged
// entry, a deploy's copy of a bundle the cache has) is removed after the
// bundle's lock is let go: a large one held up every request for the
// bundle while it went.
func TestCacheRemovesWhatItSetsAsideOutsideTheBundlesLock(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, c *Cache, store objectstore.Store, sha string)
		act   func(c *Cache, store objectstore.Store, sha string) error
	}{
		{"a directory no entry records", func(t *testing.T, c *Cache, store objectstore.Store, sha string) {
			stray := filepath.Join(c.Dir(), sha)
			if err := os.Mkdir(stray, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(stray, "w.bin"), []byte("stray"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, cacheGet},
		{"a damaged entry", func(t *testing.T, c *Cache, store objectstore.Store, sha string) {
			if err := cacheGet(c, store, sha); err != nil {
				t.Fatal(err)
			}
			w := filepath.Join(c.Dir(), sha, "w.bin")
			if err := os.Remove(w); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(w, []byte("damaged"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, cacheGet},
		{"a deploy's copy of a bundle the cache has", func(t *testing.T, c *Cache, store objectstore.Store, sha string) {
			if err := cacheGet(c, store, sha); err != nil {
				t.Fatal(err)
			}
		}, cacheAdopt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store, sha, c := storedBundle(t)
			tc.setup(t, c, store, sha)
			removing, let := make(chan string, 4), make(chan struct{})
			c.removeDir = func(d string) error {
				removing <- d
				<-let
				return os.RemoveAll(d)
			}
			done := make(chan error, 1)
			go func() { done <- tc.act(c, store, sha) }()
			var aside string
			select {
			case aside = <-removing:
			case err := <-done:
				t.Fatalf("nothing was set aside (%v)", err)
			}
			if n := lockRefs(c, sha); n != -1 {
				close(let)
				<-done
				t.Fatalf("%s is removed while %d hold or wait for the bundle's lock", filepath.Base(aside), n)
			}
			// Meanwhile, another request for the bundle is served.
			if _, _, fetched, err := c.Get(context.Background(), store, sha); err != nil || fetched {
				t.Fatalf("a Get during the removal: fetched %v, %v", fetched, err)
			}
			c.Release(sha)
			close(let)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			des, _ := os.ReadDir(c.Dir())
			for _, de := range des {
				if de.Name() != sha {
					t.Errorf("left in the cache: %s", de.Name())
				}
			}
		})
	}
}
