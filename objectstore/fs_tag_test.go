package objectstore

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Each version of a file store's object has an mtime after the one it
// replaced, even when the clock has not moved past it (a coarse clock's
// tick, here a file stamped an hour ahead): its tag can then never be an
// earlier version's, whose inode the rename freed and a later write may get
// again, and a PutIf on a stale read fails. Before, a version written within
// one tick, of the same size, on a reused inode had the tag of the one
// before it.
func TestAVersionsTagFollowsTheOneItReplaces(t *testing.T) {
	ctx := context.Background()
	s, err := NewFS(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	const key = "functions/fn.json"
	ahead := time.Now().Add(time.Hour).Truncate(time.Second)
	for i, put := range []struct {
		name string
		put  func(tag string) error
	}{
		{"Put", func(string) error { return s.Put(ctx, key, strings.NewReader("v2"), 2) }},
		{"PutIf", func(tag string) error { return s.PutIf(ctx, key, strings.NewReader("v3"), 2, tag) }},
	} {
		t.Run(put.name, func(t *testing.T) {
			if i == 0 {
				if err := s.Put(ctx, key, strings.NewReader("v1"), 2); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Chtimes(filepath.Join(s.root, key), ahead, ahead); err != nil {
				t.Fatal(err)
			}
			before, err := s.Stat(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if err := put.put(before.ETag); err != nil {
				t.Fatal(err)
			}
			after, err := s.Stat(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if !after.ModTime.After(before.ModTime) {
				t.Errorf("the new version's mtime %v is not after the one it replaced, %v", after.ModTime, before.ModTime)
			}
		})
	}
}
