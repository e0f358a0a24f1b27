package engine_test

import (
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
)

// stallingBundles answers bundle reads only when their context ends, as a
// store (S3 under SlowDown, a congested link) that does not answer in time.
type stallingBundles struct{ objectstore.Store }

func (s stallingBundles) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if strings.HasPrefix(key, "bundles/") {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return s.Store.Get(ctx, key)
}

// coldNode is a node whose cache lacks echo's bundle, deployed to the
// store by another, reading the store through wrap.
func coldNode(t *testing.T, wrap func(objectstore.Store) objectstore.Store) *engine.Engine {
	t.Helper()
	fs, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	deployer := testkit.Engine(t, engine.Config{Store: fs})
	testkit.Deploy(t, deployer, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	return testkit.Engine(t, engine.Config{Store: wrap(fs)})
}

// A cold start on a node whose cache lacks the bundle fetches it within the
// request's deadline; a deadline that passes during the fetch is the
// request's 504 (README: "the request's deadline passed ... while ...
// loading"), not a 503 blaming the store.
func TestColdFetchPastTheDeadlineIsATimeout(t *testing.T) {
	node := coldNode(t, func(fs objectstore.Store) objectstore.Store { return stallingBundles{fs} })
	req := &call.Request{Input: []byte("x"), Deadline: time.Now().Add(200 * time.Millisecond)}
	err := node.Invoke(context.Background(), "echo", req)
	if k := errdefs.KindOf(err); k != errdefs.KindTimeout {
		t.Fatalf("invoke: kind %d (%v), want KindTimeout (504)", k, err)
	}
}

// signallingStall is stallingBundles telling when a bundle read began.
type signallingStall struct {
	stallingBundles
	fetching chan struct{}
}

func (s signallingStall) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if strings.HasPrefix(key, "bundles/") {
		select {
		case s.fetching <- struct{}{}:
		default:
		}
	}
	return s.stallingBundles.Get(ctx, key)
}

// A request that finds another's fetch of its bundle under way gives up at
// its own deadline: it waited for the other's, up to ten minutes
// (--max-timeout), where its own was 200 ms.
func TestAColdStartBehindAnotherWaitsOnlyItsDeadline(t *testing.T) {
	fetching := make(chan struct{}, 1)
	node := coldNode(t, func(fs objectstore.Store) objectstore.Store { return signallingStall{stallingBundles{fs}, fetching} })
	first := make(chan error, 1)
	go func() {
		req := &call.Request{Input: []byte("x"), Deadline: time.Now().Add(20 * time.Second)}
		first <- node.Invoke(context.Background(), "echo", req)
	}()
	<-fetching // the first request holds the fetch
	req := &call.Request{Input: []byte("x"), Deadline: time.Now().Add(200 * time.Millisecond)}
	err := node.Invoke(context.Background(), "echo", req)
	if k := errdefs.KindOf(err); k != errdefs.KindTimeout || !strings.Contains(err.Error(), "another request") {
		t.Fatalf("the second request: kind %d (%v), want its own deadline's 504", k, err)
	}
	select {
	case err := <-first:
		t.Fatalf("the first request ended (%v) before the second gave up: the second waited for it", err)
	default:
	}
}
