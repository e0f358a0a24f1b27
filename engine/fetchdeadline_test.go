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

// A cold start on a node whose cache lacks the bundle fetches it within the
// request's deadline; a deadline that passes during the fetch is the
// request's 504 (README: "the request's deadline passed ... while ...
// loading"), not a 503 blaming the store.
func TestColdFetchPastTheDeadlineIsATimeout(t *testing.T) {
	fs, err := objectstore.NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	deployer := testkit.Engine(t, engine.Config{Store: fs})
	testkit.Deploy(t, deployer, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	node := testkit.Engine(t, engine.Config{Store: stallingBundles{fs}})
	req := &call.Request{Input: []byte("x"), Deadline: time.Now().Add(200 * time.Millisecond)}
	err = node.Invoke(context.Background(), "echo", req)
	if k := errdefs.KindOf(err); k != errdefs.KindTimeout {
		t.Fatalf("invoke: kind %d (%v), want KindTimeout (504)", k, err)
	}
}
