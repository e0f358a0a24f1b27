package objectstore

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/tmpfs"
)

// A file store whose directory, or its functions/, went (deleted, moved
// aside, its volume unmounted) fails every operation with ErrStoreGone, a
// 503, as an S3 store whose bucket went does (ErrNoBucket): a node took
// the empty listing for every function deleted and unloaded them all. A
// store never written lists empty, and one whose functions/ the operator
// made empty lists empty too.
func TestFSStoreGone(t *testing.T) {
	ctx := context.Background()
	const key = "functions/f.json"
	cases := []struct {
		name string
		// take does to the store at root what the case is about; it
		// returns the store to look through (s, or one opened anew as a
		// restarted server opens it).
		take func(t *testing.T, root string, s *FS) *FS
		gone bool
	}{
		{"root removed", func(t *testing.T, root string, s *FS) *FS {
			removeAll(t, root)
			return s
		}, true},
		{"functions moved aside", func(t *testing.T, root string, s *FS) *FS {
			rename(t, filepath.Join(root, "functions"), filepath.Join(filepath.Dir(root), "aside"))
			return s
		}, true},
		{"functions moved aside, store opened anew", func(t *testing.T, root string, s *FS) *FS {
			rename(t, filepath.Join(root, "functions"), filepath.Join(filepath.Dir(root), "aside"))
			return openFS(t, root)
		}, true},
		{"functions made empty by the operator", func(t *testing.T, root string, s *FS) *FS {
			removeAll(t, filepath.Join(root, "functions"))
			if err := os.Mkdir(filepath.Join(root, "functions"), 0o755); err != nil {
				t.Fatal(err)
			}
			return s
		}, false},
		{"the store's volume unmounted", func(t *testing.T, root string, s *FS) *FS {
			if err := unix.Unmount(root, unix.MNT_DETACH); err != nil {
				t.Fatal(err)
			}
			return s
		}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "store")
			if strings.Contains(c.name, "volume") {
				tmpfs.Mount(t, root, "4m")
			}
			s := openFS(t, root)
			for _, k := range []string{key, "bundles/b.tar.zst"} {
				if err := s.Put(ctx, k, strings.NewReader("{}"), 2); err != nil {
					t.Fatal(err)
				}
			}
			s = c.take(t, root, s)
			if !c.gone {
				l, err := s.List(ctx, "functions/")
				if err != nil || len(l) != 0 {
					t.Fatalf("list: %v, %v; want none, no error", l, err)
				}
				if _, err := s.Stat(ctx, key); !errors.Is(err, ErrNotFound) {
					t.Errorf("stat: %v, want ErrNotFound", err)
				}
				return
			}
			for op, err := range storeOps(ctx, s, key) {
				wantGone(t, op, err)
			}
			_, err := s.List(ctx, "functions/")
			t.Logf("list: %v", err)
			// Nothing written made the store anew where it was.
			if _, err := os.Stat(filepath.Join(root, key)); err == nil {
				t.Errorf("a put wrote %s", key)
			}
		})
	}
}

// A store never written lists empty, its keys absent; one written has
// no deletes' directory until a delete, and that is no outage either.
func TestFSNeverWrittenListsEmpty(t *testing.T) {
	ctx := context.Background()
	s := openFS(t, filepath.Join(t.TempDir(), "store"))
	for _, prefix := range []string{"functions/", "bundles/", "deleting/x.", ""} {
		if l, err := s.List(ctx, prefix); err != nil || len(l) != 0 {
			t.Errorf("list %q: %v, %v; want none, no error", prefix, l, err)
		}
	}
	if _, err := s.Stat(ctx, "functions/f.json"); !errors.Is(err, ErrNotFound) {
		t.Errorf("stat: %v, want ErrNotFound", err)
	}
	if err := s.Put(ctx, "functions/f.json", strings.NewReader("{}"), 2); err != nil {
		t.Fatal(err)
	}
	if l, err := s.List(ctx, "deleting/x."); err != nil || len(l) != 0 {
		t.Errorf("list deleting/: %v, %v; want none, no error", l, err)
	}
}

func wantGone(t *testing.T, op string, err error) {
	t.Helper()
	switch {
	case err == nil:
		t.Errorf("%s: no error", op)
	case !errors.Is(err, ErrStoreGone) || errors.Is(err, ErrNotFound) || errors.Is(err, fs.ErrNotExist):
		t.Errorf("%s: %v; want ErrStoreGone, never ErrNotFound nor fs.ErrNotExist", op, err)
	case errdefs.KindOf(err) != errdefs.KindUnavailable:
		t.Errorf("%s: %v is of kind %d, want KindUnavailable (503)", op, err, errdefs.KindOf(err))
	}
}

func openFS(t *testing.T, root string) *FS {
	t.Helper()
	s, err := NewFS(root)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func removeAll(t *testing.T, p string) {
	t.Helper()
	if err := os.RemoveAll(p); err != nil {
		t.Fatal(err)
	}
}

func rename(t *testing.T, from, to string) {
	t.Helper()
	if err := os.Rename(from, to); err != nil {
		t.Fatal(err)
	}
}
