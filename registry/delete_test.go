package registry

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/objectstore"
)

// agedStore dates every bundle past BundleGrace (so that Delete may
// remove it without the test waiting a minute), and fails Stat of bundles
// with statErr when set: a store that went down, or refuses reads, after
// the record was deleted.
type agedStore struct {
	objectstore.Store
	statErr error
}

func (s *agedStore) Stat(ctx context.Context, key string) (objectstore.Info, error) {
	if strings.HasPrefix(key, "bundles/") && s.statErr != nil {
		return objectstore.Info{}, s.statErr
	}
	in, err := s.Store.Stat(ctx, key)
	if strings.HasPrefix(key, "bundles/") {
		in.ModTime = in.ModTime.Add(-2 * BundleGrace)
	}
	return in, err
}

// Delete removes the record, then the bundles only it named. A store that
// fails the bundle's Stat is no bundle gone: Delete says the function is
// deleted but its bundle was kept, with the store's reason
// (ErrBundlesKept), instead of answering a clean delete that left the
// bundle behind; a bundle that is gone already is no error.
func TestDeleteReportsAStatFailure(t *testing.T) {
	ctx := context.Background()
	down := errors.New("store down: connection refused")
	for _, tc := range []struct {
		name        string
		statErr     error
		wantRemoved int
		wantErr     error // nil: none
	}{
		{"store answers", nil, 1, nil},
		{"bundle gone already", objectstore.ErrNotFound, 0, nil},
		{"store down", down, 0, down},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs, err := objectstore.NewFS(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			st := &agedStore{Store: fs}
			g := Registry{Store: st}
			body := []byte("the bundle")
			sha := bundle.Digest(body)
			if _, _, err := g.Publish(ctx, &abi.Manifest{Name: "fn", Priority: "default"}, bytes.NewReader(body), sha, int64(len(body)), false); err != nil {
				t.Fatal(err)
			}
			st.statErr = tc.statErr
			removed, err := g.Delete(ctx, "fn")
			if tc.wantErr == nil && err != nil {
				t.Fatalf("delete: %v", err)
			}
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || !errors.Is(err, ErrBundlesKept) || errors.Is(err, ErrNoFunction) {
					t.Fatalf("delete: %v, want ErrBundlesKept wrapping %v", err, tc.wantErr)
				}
				if !strings.Contains(err.Error(), sha) {
					t.Errorf("delete: %q does not name the bundle kept", err)
				}
			}
			if len(removed) != tc.wantRemoved {
				t.Errorf("removed %q, want %d", removed, tc.wantRemoved)
			}
			if _, err := g.Get(ctx, "fn"); !errors.Is(err, ErrNoFunction) {
				t.Errorf("the record is still there: %v", err)
			}
			_, err = fs.Stat(ctx, bundle.ObjectKey(sha))
			if gone := errors.Is(err, objectstore.ErrNotFound); gone != (tc.wantRemoved == 1) {
				t.Errorf("bundle gone: %v, removed %q", gone, removed)
			}
		})
	}
}

// failingBundleStore fails the Stat of one bundle (failKey) with failErr,
// and dates the other bundles past BundleGrace.
type failingBundleStore struct {
	agedStore
	failKey string
	failErr error
}

func (s *failingBundleStore) Stat(ctx context.Context, key string) (objectstore.Info, error) {
	if key == s.failKey {
		return objectstore.Info{}, s.failErr
	}
	return s.agedStore.Stat(ctx, key)
}

// A bundle whose Stat fails does not stop Delete: it goes on with the
// function's other bundles and reports every one it kept, joined under
// ErrBundlesKept.
func TestDeleteGoesOnPastAFailedBundle(t *testing.T) {
	ctx := context.Background()
	fs, err := objectstore.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	st := &failingBundleStore{agedStore: agedStore{Store: fs}}
	g := Registry{Store: st}
	var shas []string
	for _, body := range []string{"bundle one", "bundle two"} {
		sha := bundle.Digest([]byte(body))
		if _, _, err := g.Publish(ctx, &abi.Manifest{Name: "fn", Priority: "default"}, bytes.NewReader([]byte(body)), sha, int64(len(body)), false); err != nil {
			t.Fatal(err)
		}
		shas = append(shas, sha)
	}
	down := errors.New("store down: connection refused")
	st.failKey, st.failErr = bundle.ObjectKey(shas[0]), down // the first version's
	removed, err := g.Delete(ctx, "fn")
	if !errors.Is(err, ErrBundlesKept) || !errors.Is(err, down) || !strings.Contains(err.Error(), shas[0]) {
		t.Fatalf("delete: %v, want ErrBundlesKept wrapping %v and naming %s", err, down, shas[0])
	}
	if strings.Contains(err.Error(), shas[1]) {
		t.Errorf("delete: %q names the bundle it removed as kept", err)
	}
	if len(removed) != 1 || removed[0] != bundle.ObjectKey(shas[1]) {
		t.Errorf("removed %q, want the second bundle %s", removed, bundle.ObjectKey(shas[1]))
	}
	if _, err := fs.Stat(ctx, bundle.ObjectKey(shas[1])); !errors.Is(err, objectstore.ErrNotFound) {
		t.Errorf("the second bundle is still there: %v", err)
	}
	if _, err := fs.Stat(ctx, bundle.ObjectKey(shas[0])); err != nil {
		t.Errorf("the first bundle (its Stat failed) is gone: %v", err)
	}
}

// statFailsLater fails every Stat of a bundle after the first with err:
// the store went down after the deploy wrote its bundle.
type statFailsLater struct {
	objectstore.Store
	err   error
	stats int
}

func (s *statFailsLater) Stat(ctx context.Context, key string) (objectstore.Info, error) {
	if strings.HasPrefix(key, "bundles/") {
		if s.stats++; s.stats > 1 {
			return objectstore.Info{}, s.err
		}
	}
	return s.Store.Stat(ctx, key)
}

// Publish's last check of the bundle (after the record is written) that
// fails for a reason other than not-found says the bundle could not be
// checked and to deploy again, not that it is missing.
func TestPublishBundleCheckFails(t *testing.T) {
	ctx := context.Background()
	fs, err := objectstore.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	down := errors.New("store down: connection refused")
	g := Registry{Store: &statFailsLater{Store: fs, err: down}}
	body := []byte("the bundle")
	sha := bundle.Digest(body)
	_, _, err = g.Publish(ctx, &abi.Manifest{Name: "fn", Priority: "default"}, bytes.NewReader(body), sha, int64(len(body)), false)
	if !errors.Is(err, down) {
		t.Fatalf("publish: %v, want it to wrap %v", err, down)
	}
	for _, w := range []string{"fn", sha, "could not be checked", "deploy again"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("publish: %q does not say %q", err, w)
		}
	}
	if strings.Contains(err.Error(), "missing") {
		t.Errorf("publish: %q says the bundle is missing; it is there", err)
	}
	if _, err := fs.Stat(ctx, bundle.ObjectKey(sha)); err != nil {
		t.Errorf("the bundle: %v", err)
	}
}

// cancellingStore ends the delete's context at its first bundle Stat, as a
// client that leaves or a deadline that passes mid-delete would, and counts
// the bundle Stats.
type cancellingStore struct {
	*agedStore
	cancel context.CancelFunc
	stats  int
}

func (s *cancellingStore) Stat(ctx context.Context, key string) (objectstore.Info, error) {
	if strings.HasPrefix(key, "bundles/") && s.cancel != nil { // set once published
		s.stats++
		s.cancel()
		return objectstore.Info{}, fmt.Errorf("stat %s: %w", key, ctx.Err())
	}
	return s.agedStore.Stat(ctx, key)
}

// A delete whose context ends while it removes bundles stops there: the
// bundle it was at and the rest are kept, said once, instead of a failed
// call (each retried by S3) and a line per bundle.
func TestDeleteStopsWhenItsContextEnds(t *testing.T) {
	fs, err := objectstore.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	st := &cancellingStore{agedStore: &agedStore{Store: fs}}
	g := Registry{Store: st}
	for _, body := range []string{"one", "two", "three"} {
		if _, _, err := g.Publish(context.Background(), &abi.Manifest{Name: "fn", Priority: "default"}, bytes.NewReader([]byte(body)), bundle.Digest([]byte(body)), int64(len(body)), false); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st.cancel = cancel
	removed, err := g.Delete(ctx, "fn")
	if !errors.Is(err, ErrBundlesKept) || !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "and any after it") {
		t.Fatalf("delete: %v, want ErrBundlesKept saying the rest were kept, wrapping context.Canceled", err)
	}
	if st.stats != 1 || len(removed) != 0 {
		t.Errorf("%d bundle Stats and %q removed after the context ended at the first, want 1 and none", st.stats, removed)
	}
}
