package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/funclog"
	"github.com/plover-run/plover/objectstore"
	"github.com/plover-run/plover/registry"
)

// heldStore holds every record read until released, counting them.
type heldStore struct {
	objectstore.Store
	reads   atomic.Int64
	release chan struct{}
}

func (s *heldStore) GetTagged(ctx context.Context, key string) (io.ReadCloser, objectstore.Info, error) {
	s.reads.Add(1)
	select {
	case <-s.release:
	case <-ctx.Done():
		return nil, objectstore.Info{}, ctx.Err()
	}
	return s.Store.GetTagged(ctx, key)
}

// Concurrent first requests for one name share one store read, whether the
// name has a function (a cold node under load) or not (a flood of 404s); the
// request that started the read may give up (its own error) without
// cutting the read the others wait for.
func TestLookupsShareOneRead(t *testing.T) {
	for _, tc := range []struct {
		name   string
		exists bool
		cancel bool // the first reader's request is cancelled mid-read
	}{
		{"no such function", false, false},
		{"a function", true, false},
		{"first reader cancelled", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
			if err != nil {
				t.Fatal(err)
			}
			const name = "fn"
			ctx := context.Background()
			if tc.exists {
				rec := api.Record{Name: name, Current: "v1", Versions: []api.Version{{ID: "v1", SHA256: fmt.Sprintf("%064x", 1)}}}
				b, _ := json.Marshal(rec)
				if err := fs.Put(ctx, "functions/"+name+".json", bytes.NewReader(b), int64(len(b))); err != nil {
					t.Fatal(err)
				}
			}
			store := &heldStore{Store: fs, release: make(chan struct{})}
			logs := funclog.New(nil)
			tab := newTable(registry.Registry{Store: store}, logs, 0, 0)

			first, cancelFirst := context.WithCancel(ctx)
			defer cancelFirst()
			firstDone := make(chan error, 1)
			go func() {
				_, err := tab.lookup(first, name, time.Time{})
				firstDone <- err
			}()
			waitFor(t, "the first read", func() bool { return store.reads.Load() == 1 })

			const others = 63
			var wg sync.WaitGroup
			errs := make([]error, others)
			fns := make([]*function, others)
			for i := range others {
				wg.Add(1)
				go func() {
					defer wg.Done()
					fns[i], errs[i] = tab.lookup(ctx, name, time.Time{})
				}()
			}
			waitFor(t, "every lookup to join the read", func() bool {
				tab.mu.Lock()
				defer tab.mu.Unlock()
				fl := tab.flights[name]
				return fl != nil && fl.waiters == others
			})
			if tc.cancel {
				cancelFirst()
				if err := <-firstDone; err == nil {
					t.Fatal("the cancelled lookup succeeded")
				}
			}
			close(store.release)
			wg.Wait()
			if !tc.cancel {
				errs = append(errs, <-firstDone)
			}
			if n := store.reads.Load(); n != 1 {
				t.Errorf("%d lookups made %d store reads, want 1", others+1, n)
			}
			for i, err := range errs {
				switch {
				case tc.exists && err != nil:
					t.Fatalf("lookup %d: %v", i, err)
				case !tc.exists && errdefs.KindOf(err) != errdefs.KindNotFound:
					t.Fatalf("lookup %d of a missing function: %v, want not found", i, err)
				}
			}
			if tc.exists {
				for i, f := range fns {
					if f == nil || f != tab.funcs[name] {
						t.Fatalf("lookup %d returned %p, the table has %p", i, f, tab.funcs[name])
					}
				}
			}
			if len(tab.flights) != 0 {
				t.Errorf("flights left: %v", tab.flights)
			}
		})
	}
}

// A lookup that joined another's read and whose own deadline passes first
// answers 504 at once, naming the function.
func TestLookupJoinerDeadline(t *testing.T) {
	fs, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	store := &heldStore{Store: fs, release: make(chan struct{})}
	defer close(store.release)
	tab := newTable(registry.Registry{Store: store}, nil, 0, 0)
	go tab.lookup(context.Background(), "fn", time.Time{})
	waitFor(t, "the first read", func() bool { return store.reads.Load() == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = tab.lookup(ctx, "fn", time.Time{})
	var e *errdefs.Error
	if !errors.As(err, &e) || e.Kind != errdefs.KindTimeout || !bytes.Contains([]byte(err.Error()), []byte("function fn")) {
		t.Fatalf("joined lookup past its deadline: %v, want a timeout naming fn", err)
	}
}

// waitFor polls cond (observed state) for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("waited 10 s for %s", what)
}

// A lookup without a deadline (prewarming at start) waits no longer than
// the engine's timeout, whether it starts the read (then it gets that
// timeout once, not a read again and again) or joins one that a request
// with a long deadline started.
func TestLookupWithoutDeadlineEndsAtTheTimeout(t *testing.T) {
	for _, joins := range []bool{false, true} {
		fs, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
		if err != nil {
			t.Fatal(err)
		}
		store := &heldStore{Store: fs, release: make(chan struct{})}
		tab := newTable(registry.Registry{Store: store}, nil, 50*time.Millisecond, 0)
		if joins {
			long, cancel := context.WithTimeout(context.Background(), time.Minute)
			go tab.lookup(long, "fn", time.Time{})
			waitFor(t, "the long request's read", func() bool { return store.reads.Load() == 1 })
			cancel() // the client goes; its read goes on
		}
		done := make(chan error, 1)
		go func() {
			_, err := tab.lookup(context.Background(), "fn", time.Time{})
			done <- err
		}()
		select {
		case err := <-done:
			if errdefs.KindOf(err) != errdefs.KindTimeout {
				t.Errorf("joins %v: lookup without a deadline: %v, want a timeout", joins, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("joins %v: lookup without a deadline still going 10 s on, %d store reads", joins, store.reads.Load())
		}
		if n := store.reads.Load(); n != 1 {
			t.Errorf("joins %v: %d store reads, want 1", joins, n)
		}
		close(store.release)
	}
}
