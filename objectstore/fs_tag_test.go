package objectstore

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A record's versions (a key conditional writes lock) have rising mtimes,
// even when the clock has not moved past the last one (a coarse clock's
// tick, here a file stamped an hour ahead), and a version written after a
// delete follows the deleted one: a tag can then never be an earlier
// version's, whose inode the rename or unlink freed and a later write may
// get again, so a PutIf on a stale read fails. Before, a version written
// within one tick, of the same size, on a reused inode had the tag of the
// one before it (a review reproduced it after a delete: 197 of 200 rounds
// with a second's stamps). A key never locked (a bundle, whose mtime is
// its age for gc) keeps the clock's stamp.
func TestAVersionsTagFollowsTheOneItReplaces(t *testing.T) {
	ctx := context.Background()
	s, err := NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	ahead := time.Now().Add(time.Hour).Truncate(time.Second)
	for _, tc := range []struct {
		name, key  string
		first, put func(key, tag string) error
		follows    bool
	}{
		{"PutIf over a version", "functions/a.json",
			func(key, _ string) error { return s.PutIf(ctx, key, strings.NewReader("v1"), 2, "") },
			func(key, tag string) error { return s.PutIf(ctx, key, strings.NewReader("v2"), 2, tag) }, true},
		{"a version after a delete", "functions/b.json",
			func(key, _ string) error { return s.PutIf(ctx, key, strings.NewReader("v1"), 2, "") },
			func(key, _ string) error {
				if err := s.Delete(ctx, key); err != nil {
					return err
				}
				return s.PutIf(ctx, key, strings.NewReader("v2"), 2, "")
			}, true},
		{"a key never locked keeps the clock's stamp", "bundles/c",
			func(key, _ string) error { return s.Put(ctx, key, strings.NewReader("v1"), 2) },
			func(key, _ string) error { return s.Put(ctx, key, strings.NewReader("v1"), 2) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.first(tc.key, ""); err != nil {
				t.Fatal(err)
			}
			if err := os.Chtimes(filepath.Join(s.root, tc.key), ahead, ahead); err != nil {
				t.Fatal(err)
			}
			before, err := s.Stat(ctx, tc.key)
			if err != nil {
				t.Fatal(err)
			}
			if err := tc.put(tc.key, before.ETag); err != nil {
				t.Fatal(err)
			}
			after, err := s.Stat(ctx, tc.key)
			if err != nil {
				t.Fatal(err)
			}
			if follows := after.ModTime.After(before.ModTime); follows != tc.follows {
				t.Errorf("the new version's mtime %v after the one before it, %v: %v, want %v", after.ModTime, before.ModTime, follows, tc.follows)
			}
			if tc.follows && after.ETag == before.ETag {
				t.Errorf("the new version has the tag of the one before it, %s", after.ETag)
			}
		})
	}
}

// A link in the store (a key linked to another's file) lists with the tag
// Stat gives it, as the engine and the registry compare the two; a link to
// a directory, a dangling one, a loop or one through a file lists as no
// object, as Get says, and fails no listing of the others. Before,
// List stat'ed the link itself: its tag never matched, and a node read the
// record again at every poll.
func TestFSListFollowsLinksAsStatDoes(t *testing.T) {
	ctx := context.Background()
	s, err := NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, "functions/a.json", strings.NewReader("{}"), 2); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(s.root, "functions")
	for name, target := range map[string]string{"b.json": "a.json", "c.json": ".", "d.json": "gone.json", "e.json": "e.json", "f.json": "a.json/x"} {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	infos, err := s.List(ctx, "functions/")
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, in := range infos {
		keys = append(keys, in.Key)
		st, err := s.Stat(ctx, in.Key)
		if err != nil {
			t.Errorf("%s listed, but Stat: %v", in.Key, err)
			continue
		}
		if st.ETag != in.ETag {
			t.Errorf("%s: List's tag %s, Stat's %s", in.Key, in.ETag, st.ETag)
		}
	}
	if got := strings.Join(keys, " "); got != "functions/a.json functions/b.json" {
		t.Errorf("listed %q, want the file and the link to it", got)
	}
}

// A store whose root is a link (a store moved to a larger disk) has its
// leftover temporary files removed: CleanTemp walked the link as a file
// and removed nothing.
func TestCleanTempUnderALinkedRoot(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "disk", "bundles"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "disk"), filepath.Join(dir, "store")); err != nil {
		t.Fatal(err)
	}
	s, err := NewFS(filepath.Join(dir, "store"))
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "disk", "bundles", ".put-123")
	if err := os.WriteFile(tmp, []byte("half"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(tmp, old, old); err != nil {
		t.Fatal(err)
	}
	removed, err := s.CleanTemp(time.Minute)
	if err != nil || len(removed) != 1 {
		t.Errorf("CleanTemp removed %v (%v), want the one leftover", removed, err)
	}
	if _, err := os.Stat(tmp); err == nil {
		t.Error("the leftover is still there")
	}
}
