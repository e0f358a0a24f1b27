package objectstore

import (
	"context"
	"errors"
	"testing"
)

// The Store contract, as the S3 backend keeps it, broken by the file
// store where a key crosses an object or names a prefix of others:
// Get/Stat of "a/b" while "a" is an object is ErrNotFound (FS: a raw
// ENOTDIR, which callers map to 503 "store unavailable"), deleting a key
// that is no object is not an error (FS: "directory not empty"), and
// touching one is ErrNotFound (FS: nil, a directory's time changed).
func TestHuntKeyNamesPrefixOrCrossesObject(t *testing.T) {
	ctx := context.Background()
	for _, be := range backends() {
		t.Run(be.name, func(t *testing.T) {
			open, _ := be.setup(t)
			s := open(t)
			put(t, s, "a", []byte("object"))
			put(t, s, "p/x", []byte("object"))
			if _, err := s.Get(ctx, "a/b"); !errors.Is(err, ErrNotFound) {
				t.Errorf("get a/b with a an object: %v, want ErrNotFound", err)
			}
			if _, err := s.Stat(ctx, "a/b"); !errors.Is(err, ErrNotFound) {
				t.Errorf("stat a/b with a an object: %v, want ErrNotFound", err)
			}
			if err := s.Delete(ctx, "p"); err != nil {
				t.Errorf("delete p, no object (a prefix of p/x): %v, want nil", err)
			}
			if err := s.Touch(ctx, "p"); !errors.Is(err, ErrNotFound) {
				t.Errorf("touch p, no object (a prefix of p/x): %v, want ErrNotFound", err)
			}
		})
	}
}
