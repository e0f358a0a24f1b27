package objectstore

import (
	"context"
	"errors"
	"testing"
)

// The Store contract where a key crosses an object or names a prefix of
// others, as S3 keeps it and the file store must too (its keys are paths):
// Get/Stat of "a/b" while "a" is an object is ErrNotFound (not a raw
// ENOTDIR, which callers map to 503 "store unavailable"), deleting a key
// that is no object is not an error (not "directory not empty"), and
// touching one is ErrNotFound (not a directory's time changed).
func TestKeyUnderAnObjectOrAPrefixIsNoObject(t *testing.T) {
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
