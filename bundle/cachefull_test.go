package bundle

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/internal/tmpfs"
	"github.com/plover-run/plover/objectstore"
)

// putConsts stores a bundle whose constants are consts.
func putConsts(t *testing.T, store objectstore.Store, consts []byte) string {
	t.Helper()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, abi.ManifestFile), manifestJSON(t, "w.bin"), 0o644)
	os.WriteFile(filepath.Join(dir, "lib.so"), []byte("\x7fELF"), 0o644)
	os.WriteFile(filepath.Join(dir, "w.bin"), consts, 0o644)
	b, sha, _, err := PackBytes(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Put(context.Background(), ObjectKey(sha), bytes.NewReader(b), int64(len(b))); err != nil {
		t.Fatal(err)
	}
	return sha
}

// countingStore counts the stats and gets of bundles: a get is a download.
type countingStore struct {
	objectstore.Store
	stats, gets atomic.Int32
}

func (s *countingStore) Stat(ctx context.Context, key string) (objectstore.Info, error) {
	s.stats.Add(1)
	return s.Store.Stat(ctx, key)
}

func (s *countingStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	s.gets.Add(1)
	return s.Store.Get(ctx, key)
}

// smallDisk mounts a tmpfs of size bytes for the test, unmounted at its
// end: a disk the test can fill without filling the machine's.
func smallDisk(t *testing.T, size int64) string {
	t.Helper()
	dir := t.TempDir()
	tmpfs.Mount(t, dir, strconv.FormatInt(size, 10))
	return dir
}

// fill leaves about leave bytes free on dir's disk, with a file it
// returns the path of.
func fill(t *testing.T, dir string, leave int64) string {
	t.Helper()
	free, _, ok := diskFree(dir)
	if !ok || int64(free) < leave {
		t.Fatalf("the disk has %d free (%v), less than the %d to leave", free, ok, leave)
	}
	p := filepath.Join(dir, "filler")
	if err := os.WriteFile(p, make([]byte, int64(free)-leave), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func random(t *testing.T, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// A cold fetch on a disk without room for the bundle is refused before it
// writes (M2): its archive's room is claimed first, so nothing is
// downloaded and the disk is not filled under the node's other writers.
// Where the archive fits and its files do not, the next fetches within
// the back-off are answered at once, without downloading it again, until
// the back-off ends or the disk has the room; then the bundle is fetched.
func TestAColdFetchOnAFullDiskWritesNothingAndBacksOff(t *testing.T) {
	const size = 3 << 20
	for _, tc := range []struct {
		name   string
		consts []byte
		stage  string
		gets   [3]int32 // downloads after each of three fetches on the full disk
	}{
		{"the archive has no room", random(t, size), "fetching", [3]int32{0, 0, 0}},
		{"its files have no room", make([]byte, size), "unpacking", [3]int32{1, 1, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			disk := smallDisk(t, 8<<20)
			fs, err := objectstore.NewFS(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			store := &countingStore{Store: fs}
			sha := putConsts(t, store, tc.consts)
			c, err := NewCache(filepath.Join(disk, "cache"), 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			now := time.Now()
			c.now = func() time.Time { return now }
			filler := fill(t, disk, 3<<19)
			for i, want := range tc.gets {
				if i == 2 {
					now = now.Add(fullBackoff + time.Second)
				}
				err := cacheGet(c, store, sha)
				var se *StageError
				if !errors.Is(err, syscall.ENOSPC) || !errors.As(err, &se) || se.Stage != tc.stage {
					t.Fatalf("fetch %d on the full disk: %v, want ENOSPC at %s", i+1, err, tc.stage)
				}
				if n := store.gets.Load(); n != want {
					t.Errorf("after fetch %d on the full disk: %d downloads, want %d", i+1, n, want)
				}
				if left, _ := os.ReadDir(c.Dir()); len(left) > 0 {
					t.Errorf("fetch %d left %s in the cache", i+1, left[0].Name())
				}
			}
			os.Remove(filler)
			if err := cacheGet(c, store, sha); err != nil { // within the back-off: the room is there
				t.Fatalf("with room again: %v", err)
			}
		})
	}
}

// A cold start on a full disk evicts bundles not in use, least recently
// used first, for its room, and the repair of a damaged entry removes the
// damaged copy first, where a cache within its limit (--cache-limit is
// 10 GiB by default, whatever the disk) evicted nothing and every cold
// start failed for good (M3), and a repair failed its first request (L2).
// Bundles in use stay, and the cold start fails, 507.
func TestAFullDiskMakesRoomForAColdStart(t *testing.T) {
	const size = 3 << 20
	for _, tc := range []struct {
		name           string
		held, released []int // of a, b, c: taken before the disk fills, and let go
		damage         bool  // c's w.bin rewritten with a wrong byte before it fills
		full           bool  // c's fetch fails for a full disk
		gone, kept     []int
	}{
		{name: "bundles not in use", held: []int{0, 1}, released: []int{0, 1}, gone: []int{0}, kept: []int{1, 2}},
		{name: "bundles in use", held: []int{0, 1}, full: true, gone: []int{2}, kept: []int{0, 1}},
		{name: "a damaged copy of the bundle", held: []int{2}, released: []int{2}, damage: true, kept: []int{2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			disk := smallDisk(t, 16<<20)
			store, err := objectstore.NewFS(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			shas := []string{putBundle(t, store, 1, size), putBundle(t, store, 2, size), putBundle(t, store, 3, size)}
			c, err := NewCache(filepath.Join(disk, "cache"), 0, 1<<40)
			if err != nil {
				t.Fatal(err)
			}
			var repaired atomic.Int32
			c.OnRepair = func(string, error) { repaired.Add(1) }
			ctx := context.Background()
			for _, i := range tc.held {
				if _, _, _, err := c.Get(ctx, store, shas[i]); err != nil {
					t.Fatal(err)
				}
			}
			for _, i := range tc.released {
				c.Release(shas[i])
			}
			if tc.damage {
				f, err := os.OpenFile(filepath.Join(c.Dir(), shas[2], "w.bin"), os.O_WRONLY, 0)
				if err != nil {
					t.Fatal(err)
				}
				f.WriteAt([]byte{9}, size/2)
				f.Close()
			}
			fill(t, disk, 3<<19)
			_, _, _, err = c.Get(ctx, store, shas[2])
			if tc.full != errors.Is(err, syscall.ENOSPC) || (!tc.full && err != nil) {
				t.Fatalf("the cold start: %v, want a full disk %v", err, tc.full)
			}
			has := func(i int) bool { _, err := os.Stat(filepath.Join(c.Dir(), shas[i])); return err == nil }
			for _, i := range tc.gone {
				if has(i) {
					t.Errorf("bundle %c is still cached", 'a'+i)
				}
			}
			for _, i := range tc.kept {
				if !has(i) {
					t.Errorf("bundle %c is not cached", 'a'+i)
				}
			}
			if !tc.full {
				if b, _ := os.ReadFile(filepath.Join(c.Dir(), shas[2], "w.bin")); !bytes.Equal(b, bytes.Repeat([]byte{3}, size)) {
					t.Error("c's constants are not the bundle's")
				}
			}
			if n, want := repaired.Load(), map[bool]int32{true: 1}[tc.damage]; n != want {
				t.Errorf("%d repairs, want %d", n, want)
			}
			if aside, _ := filepath.Glob(filepath.Join(c.Dir(), ".*")); len(aside) > 0 {
				t.Errorf("left in the cache: %v", aside)
			}
		})
	}
}

// A program loaded again from a bundle its version holds (a worker
// restarted after a crash) has the bundle's files checked again first
// (Recheck; M1): damaged since Get, they are fetched again into their
// place under the holders, whose entry stays theirs to release; a store
// that fails the fetch leaves the entry to the next Recheck. Files as
// they were cost no download.
func TestRecheckFetchesADamagedBundleAgainUnderItsHolders(t *testing.T) {
	for _, tc := range []struct {
		name      string
		damage    func(dir string) error
		storeDown bool // the first Recheck's fetch fails
		gets      int32
	}{
		{"untouched", func(string) error { return nil }, false, 0},
		{"touched, same bytes", func(dir string) error {
			now := time.Now()
			return os.Chtimes(filepath.Join(dir, "w.bin"), now, now)
		}, false, 0},
		{"library truncated", func(dir string) error { return os.Truncate(filepath.Join(dir, "lib.so"), 2) }, false, 1},
		{"a constant's byte changed", func(dir string) error {
			f, err := os.OpenFile(filepath.Join(dir, "w.bin"), os.O_WRONLY, 0)
			if err == nil {
				_, err = f.WriteAt([]byte{8}, 100)
				f.Close()
			}
			return err
		}, false, 1},
		{"the entry's directory gone", os.RemoveAll, false, 1},
		{"the store down", func(dir string) error { return os.Truncate(filepath.Join(dir, "w.bin"), 10) }, true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			fs, sha, c := storedBundle(t)
			store := &countingStore{Store: fs}
			dir, _, _, err := c.Get(ctx, store, sha) // a loaded version holds it
			if err != nil {
				t.Fatal(err)
			}
			want, _ := os.ReadFile(filepath.Join(dir, "w.bin"))
			store.gets.Store(0)
			if err := tc.damage(dir); err != nil {
				t.Fatal(err)
			}
			if tc.storeDown {
				var fe *FetchError
				if err := c.Recheck(ctx, failingStore{store}, sha); !errors.As(err, &fe) {
					t.Fatalf("a recheck whose fetch the store broke: %v, want a FetchError", err)
				}
			}
			if err := c.Recheck(ctx, store, sha); err != nil {
				t.Fatalf("recheck: %v", err)
			}
			if n := store.gets.Load(); n != tc.gets {
				t.Errorf("%d downloads, want %d", n, tc.gets)
			}
			if got, _ := os.ReadFile(filepath.Join(dir, "w.bin")); !bytes.Equal(got, want) {
				t.Error("the constants are not the bundle's")
			}
			if lib, _ := os.ReadFile(filepath.Join(dir, "lib.so")); string(lib) != "\x7fELF" {
				t.Errorf("the library is %q", lib)
			}
			if _, _, _, err := c.Get(ctx, store, sha); err != nil { // another version of the bundle
				t.Fatalf("a Get after the recheck: %v", err)
			}
			size, _, _ := dirSize(dir)
			if st := c.Stats(); st.Bundles != 1 || st.InUse != 1 || st.Bytes != size {
				t.Errorf("the cache counts %+v, want the bundle, %d bytes, in use", st, size)
			}
			c.Release(sha)
			c.Release(sha)
			if st := c.Stats(); st.InUse != 0 {
				t.Errorf("held by %d once both holders let go", st.InUse)
			}
			if aside, _ := filepath.Glob(filepath.Join(c.Dir(), ".*")); len(aside) > 0 {
				t.Errorf("left in the cache: %v", aside)
			}
		})
	}
}

// The error of a claim that found no room names the file and what was
// free, and is ENOSPC.
func TestRoomsRefusalSaysWhy(t *testing.T) {
	err := error(&noRoomError{path: "/c/.fetch-1", size: 10, free: 4, others: 1})
	if !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "/c/.fetch-1: 10 bytes, and its disk has 4 free, 1 of them") {
		t.Fatalf("%v", err)
	}
}
