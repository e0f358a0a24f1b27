package engine_test

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
)

// The control routes' calls have no end of their own (httpapi's callCtx:
// a drain finishes them), and minio-go none on a body's read or a listing:
// a store that stalled after its headers held each such call, and its
// goroutine, for as long as the server ran (a review's finding). Each
// control call's store part now ends at a bound, as unavailable.
func TestAStalledStoreEndsAControlCall(t *testing.T) {
	fs, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	a := testkit.Engine(t, engine.Config{Store: fs})
	v1 := testkit.Deploy(t, a, testkit.BundleDir(t, testkit.Manifest("fn"), nil))
	m := testkit.Manifest("fn")
	m.OutBytes++
	testkit.Deploy(t, a, testkit.BundleDir(t, m, nil))
	testkit.Deploy(t, a, testkit.BundleDir(t, testkit.Manifest("other"), nil))
	pipe, _, _, err := bundle.PackBytes(testkit.PipelineDir(t, "pipe", "other"))
	if err != nil {
		t.Fatal(err)
	}

	fresh, _, _, err := bundle.PackBytes(testkit.BundleDir(t, testkit.Manifest("new"), nil))
	if err != nil {
		t.Fatal(err)
	}

	stalling := &stallingRecord{Store: fs, key: "functions/fn.json", stalled: make(chan struct{})}
	stalling.armed.Store(true)
	b := testkit.Engine(t, engine.Config{Store: stalledBundlePut{stalledListing{stalling}}, Timeout: 200 * time.Millisecond})
	engine.SetStoreCallBound(t, 200*time.Millisecond)
	c := b.Control()
	for _, tc := range []struct {
		name string
		call func(context.Context) error
	}{
		// A record's read was bounded before, by --timeout (table.record).
		{"Function", func(ctx context.Context) error { _, err := c.Function(ctx, "fn"); return err }},
		{"Versions", func(ctx context.Context) error { _, err := c.Versions(ctx, "fn"); return err }},
		{"Functions", func(ctx context.Context) error { _, err := c.Functions(ctx); return err }},
		{"Listed", func(ctx context.Context) error { _, err := c.Listed(ctx); return err }},
		{"GC", func(ctx context.Context) error { _, err := c.GC(ctx, time.Hour); return err }},
		{"Delete", func(ctx context.Context) error { return c.Delete(ctx, "fn", false) }},
		{"Delete, forced", func(ctx context.Context) error { return c.Delete(ctx, "fn", true) }},
		{"Rollback", func(ctx context.Context) error { _, err := c.Rollback(ctx, "fn", v1.Version); return err }},
		{"Unlabel", func(ctx context.Context) error { return c.Unlabel(ctx, "fn", "7") }},
		// Its step's record reads (other's is not stalled); the listing of
		// the pipelines that may run it stalls.
		{"Deploy, a pipeline", func(ctx context.Context) error {
			_, err := c.Deploy(ctx, "pipe", bytes.NewReader(pipe), false)
			return err
		}},
		// The upload of its bundle stalls.
		{"Deploy", func(ctx context.Context) error {
			_, err := c.Deploy(ctx, "new", bytes.NewReader(fresh), false)
			if err != nil && !strings.Contains(err.Error(), "the upload to the store passed its bound") {
				t.Errorf("a deploy whose upload stalled: %v, want it to name the bound", err)
			}
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			done := make(chan error, 1)
			go func() { done <- tc.call(context.Background()) }()
			select {
			case err := <-done:
				if k := errdefs.KindOf(err); k != errdefs.KindUnavailable && k != errdefs.KindTimeout {
					t.Fatalf("%s over a stalled store: %v (kind %v), want unavailable or a timeout", tc.name, err, k)
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("%s over a stalled store still held after 20 s (bound 200 ms)", tc.name)
			}
		})
	}
}

// stalledBundlePut is a store whose bundle uploads stall until their
// context ends.
type stalledBundlePut struct{ objectstore.Store }

func (s stalledBundlePut) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	if strings.HasPrefix(key, "bundles/") {
		<-ctx.Done()
		return ctx.Err()
	}
	return s.Store.Put(ctx, key, r, size)
}

// An upload that succeeded at its bound left the record's write none of
// its own when one bound covered the whole publish: the deploy failed
// with its bundle stored (a review's LOW). Each store step now has its
// own bound.
func TestAnUploadEndingAtItsBoundIsRecorded(t *testing.T) {
	fs, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	a := testkit.Engine(t, engine.Config{Store: lateBundlePut{fs}})
	engine.SetStoreCallBound(t, 200*time.Millisecond)
	fresh, _, _, err := bundle.PackBytes(testkit.BundleDir(t, testkit.Manifest("late"), nil))
	if err != nil {
		t.Fatal(err)
	}
	fi, err := a.Control().Deploy(context.Background(), "late", bytes.NewReader(fresh), false)
	if err != nil {
		t.Fatalf("a deploy whose upload ended at its bound: %v, want its record written", err)
	}
	if _, err := a.Control().Function(context.Background(), "late"); err != nil || fi.Version == "" {
		t.Fatalf("the deployed function: %v (version %q)", err, fi.Version)
	}
}

// lateBundlePut is a store whose bundle uploads land just as their
// context ends: the last byte's acknowledgement arrives at the bound.
type lateBundlePut struct{ objectstore.Store }

func (s lateBundlePut) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	if strings.HasPrefix(key, "bundles/") {
		<-ctx.Done()
		return s.Store.Put(context.WithoutCancel(ctx), key, r, size)
	}
	return s.Store.Put(ctx, key, r, size)
}
