package registry

import (
	"bytes"
	"context"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/internal/minio"
	"github.com/plover-run/plover/objectstore"
)

// onDelete runs hook once, before the first Delete of key.
type onDelete struct {
	objectstore.Store
	key  string
	once sync.Once
	hook func()
}

func (s *onDelete) Delete(ctx context.Context, key string) error {
	if key == s.key {
		s.once.Do(s.hook)
	}
	return s.Store.Delete(ctx, key)
}

// A deploy that reuses an unreferenced bundle while gc is deleting others
// keeps it: gc decides on each bundle's age as it is just before it goes,
// not as its listing of all of them, made before the deploy touched it,
// showed it. (It deleted the bundle after the deploy's record named it,
// and every node's cold start of that version failed.)
func TestGCKeepsABundleADeployReusedMeanwhile(t *testing.T) {
	ctx := context.Background()
	srv := minio.Start(t)
	srv.MustCreateBucket(t, "gc-race")
	s3, err := objectstore.Open(ctx, "s3://gc-race", objectstore.S3Options{Endpoint: srv.Endpoint, AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	// Two bundles no record names (a deleted function's, kept by their
	// grace then), in the order gc deletes them.
	bodies := [][]byte{[]byte("bundle one"), []byte("bundle two")}
	shas := []string{bundle.Digest(bodies[0]), bundle.Digest(bodies[1])}
	if shas[0] > shas[1] {
		bodies[0], bodies[1] = bodies[1], bodies[0]
		shas[0], shas[1] = shas[1], shas[0]
	}
	for i, b := range bodies {
		if err := s3.Put(ctx, bundle.ObjectKey(shas[i]), bytes.NewReader(b), int64(len(b))); err != nil {
			t.Fatal(err)
		}
	}
	const grace = 2 * time.Second
	for { // until both are past the grace, as gc's listing dates them
		infos, err := s3.List(ctx, "bundles/")
		if err != nil {
			t.Fatal(err)
		}
		if len(infos) == 2 && time.Since(infos[0].ModTime) > grace && time.Since(infos[1].ModTime) > grace {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}

	st := &onDelete{Store: s3, key: bundle.ObjectKey(shas[0])}
	g := Registry{Store: st}
	st.hook = func() {
		// While gc deletes the first, a deploy (another node's) reuses
		// the second: its object is there, so it is touched, not written.
		m := &abi.Manifest{Name: "reuser", Priority: "default"}
		if _, created, err := g.Publish(ctx, m, bytes.NewReader(bodies[1]), shas[1], int64(len(bodies[1])), false); err != nil || !created {
			t.Errorf("publish: created %v, %v", created, err)
		}
	}
	removed, err := g.GC(ctx, grace)
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(removed)
	rec, err := g.Get(ctx, "reuser")
	if err != nil {
		t.Fatal(err)
	}
	cv, _ := rec.CurrentVersion()
	if _, err := s3.Stat(ctx, bundle.ObjectKey(cv.SHA256)); err != nil {
		t.Fatalf("gc removed %q; the current version of reuser names a bundle that is gone: %v", removed, err)
	}
	if len(removed) != 1 || removed[0] != bundle.ObjectKey(shas[0]) {
		t.Errorf("gc removed %q, want only %s", removed, bundle.ObjectKey(shas[0]))
	}
}
