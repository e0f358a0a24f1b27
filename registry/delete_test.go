package registry

import (
	"bytes"
	"context"
	"errors"
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
