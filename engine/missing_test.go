package engine_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
)

// A bundle object gone from the store (deleted by hand, by a lifecycle
// rule) while its function's record still names it fails a cold start
// with a 500 that says so and what to do, not the store's 503, which a
// client retries for ever; a deploy of the same bytes stores it again.
func TestAMissingBundleIsNoOutage(t *testing.T) {
	ctx := context.Background()
	fs, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	a := testkit.Engine(t, engine.Config{Store: fs})
	b := testkit.Engine(t, engine.Config{Store: fs}) // its own cache: a second node
	dir := testkit.BundleDir(t, testkit.Manifest("fn"), nil)
	fi := testkit.Deploy(t, a, dir)
	if err := fs.Delete(ctx, bundle.ObjectKey(fi.SHA256)); err != nil {
		t.Fatal(err)
	}
	for range 2 { // the same answer again: nothing is fetched, nothing kept
		err := b.Invoke(ctx, "fn", &call.Request{Input: []byte("x")})
		if k := errdefs.KindOf(err); k != errdefs.KindInternal {
			t.Fatalf("invoke with its bundle gone: kind %d (%v), want KindInternal (500)", k, err)
		}
		var ee *errdefs.Error
		want := "function fn: its bundle " + fi.SHA256[:12] + " is missing from the store: deploy it again"
		if !errors.As(err, &ee) || ee.Msg != want {
			t.Fatalf("invoke with its bundle gone: %v, want the client told %q", err, want)
		}
	}
	testkit.Deploy(t, a, dir) // unchanged: the bundle is stored again
	if r := invoke(t, b, "fn", []byte("x")); r.Version != fi.Version {
		t.Fatalf("after the deploy again: version %s, want %s", r.Version, fi.Version)
	}
}

// A function deleted on another node, its bundles with it, answers 404 on
// a node that has not polled the delete yet and finds its bundle gone at a
// cold start: the record read again says the function is gone. Deployed
// again there (a later life of the name), it answers 503 with a retry
// time, and the node follows the new life at once: the next request runs
// it. It answered 500 "missing from the store: deploy it again", for a
// function served elsewhere, until its poll.
func TestABundleDeletedWithItsFunctionElsewhereIs404(t *testing.T) {
	for _, again := range []bool{false, true} {
		t.Run(map[bool]string{false: "deleted", true: "deleted and deployed again"}[again], func(t *testing.T) {
			ctx := context.Background()
			root := filepath.Join(t.TempDir(), "store")
			fs, err := objectstore.NewFS(root)
			if err != nil {
				t.Fatal(err)
			}
			a := testkit.Engine(t, engine.Config{Store: fs})
			b := testkit.Engine(t, engine.Config{Store: fs})
			m := testkit.Manifest("fn")
			m.Chain = []abi.Launch{{Kernel: "echo", Grid: 1, Block: 8}}
			testkit.Deploy(t, a, testkit.BundleDir(t, m, nil))
			invoke(t, b, "fn", []byte{5})
			m.Chain = append(m.Chain, abi.Launch{Kernel: "add_one", Grid: 1, Block: 1})
			v2 := testkit.Deploy(t, a, testkit.BundleDir(t, m, nil))
			if err := b.Refresh(ctx); err != nil { // v2 current on b, its bundle not fetched
				t.Fatal(err)
			}
			// Past the grace a delete keeps just-written bundles for.
			old := time.Now().Add(-2 * time.Hour)
			bundles, err := fs.List(ctx, "bundles/")
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range bundles {
				if err := os.Chtimes(filepath.Join(root, filepath.FromSlash(o.Key)), old, old); err != nil {
					t.Fatal(err)
				}
			}
			if err := a.Control().Delete(ctx, "fn", false); err != nil {
				t.Fatal(err)
			}
			if _, err := fs.Stat(ctx, bundle.ObjectKey(v2.SHA256)); !errors.Is(err, objectstore.ErrNotFound) {
				t.Fatalf("the delete kept v2's bundle: %v", err)
			}
			if !again {
				err = b.Invoke(ctx, "fn", &call.Request{Input: []byte{5}})
				if k := errdefs.KindOf(err); k != errdefs.KindNotFound || !strings.Contains(err.Error(), "not found") {
					t.Fatalf("invoke of a function deleted elsewhere, its bundle gone: kind %d (%v), want KindNotFound (404)", k, err)
				}
				return
			}
			m.Chain = m.Chain[:1]
			m.Chain = append(m.Chain, abi.Launch{Kernel: "add_one", Grid: 1, Block: 1}, abi.Launch{Kernel: "add_one", Grid: 1, Block: 1})
			v3 := testkit.Deploy(t, a, testkit.BundleDir(t, m, nil))
			err = b.Invoke(ctx, "fn", &call.Request{Input: []byte{5}})
			var ee *errdefs.Error
			if k := errdefs.KindOf(err); k != errdefs.KindUnavailable || !errors.As(err, &ee) || ee.RetryAt.IsZero() || !strings.Contains(err.Error(), "deployed again") {
				t.Fatalf("invoke of a function deleted and deployed again elsewhere: kind %d (%v), want KindUnavailable (503) with a retry time", k, err)
			}
			if r := invoke(t, b, "fn", []byte{5}); r.Version != v3.Version || r.Output[0] != 7 {
				t.Fatalf("the next invoke: version %s, output %v; want %s's answer 7", r.Version, r.Output, v3.Version)
			}
		})
	}
}
