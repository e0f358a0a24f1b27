package bundle

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/iotest"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/objectstore"
	"golang.org/x/sys/unix"
)

// putBundle stores a bundle whose constants are size bytes of fill.
func putBundle(t *testing.T, store objectstore.Store, fill byte, size int) string {
	t.Helper()
	return putConsts(t, store, bytes.Repeat([]byte{fill}, size))
}

// storedBundle is a store holding a bundle with 4 KiB of constants, its
// sha256, and an empty cache.
func storedBundle(t *testing.T) (objectstore.Store, string, *Cache) {
	t.Helper()
	store, err := objectstore.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	sha := putBundle(t, store, 7, 4<<10)
	c, err := NewCache(t.TempDir(), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	return store, sha, c
}

func TestCacheLRUEvictionSparesBundlesInUse(t *testing.T) {
	ctx := context.Background()
	store, _ := objectstore.NewFS(t.TempDir())
	const size = 100 << 10
	a, b, c := putBundle(t, store, 1, size), putBundle(t, store, 2, size), putBundle(t, store, 3, size)
	dir := t.TempDir()
	cache, err := NewCache(dir, 0, 2*size+size/2) // room for two bundles
	if err != nil {
		t.Fatal(err)
	}
	get := func(sha string) {
		t.Helper()
		if _, _, _, err := cache.Get(ctx, store, sha); err != nil {
			t.Fatal(err)
		}
	}
	has := func(sha string) bool { _, err := os.Stat(filepath.Join(dir, sha)); return err == nil }

	get(a) // a in use
	get(b)
	cache.Release(b) // b idle, most recent
	get(c)           // over the limit: b is the only bundle not in use
	if !has(a) || has(b) || !has(c) {
		t.Fatalf("after c: a=%v b=%v c=%v, want b evicted (a is in use)", has(a), has(b), has(c))
	}
	cache.Release(c)
	cache.Release(a) // a is now the least recently used idle bundle
	get(b)
	cache.Release(b)
	if has(a) || !has(b) || !has(c) {
		t.Fatalf("after b again: a=%v b=%v c=%v, want a evicted", has(a), has(b), has(c))
	}
	// An evicted bundle's files are gone from the disk by then, not only
	// from its name.
	if aside, _ := filepath.Glob(filepath.Join(dir, ".evict-*")); len(aside) > 0 {
		t.Fatalf("evicted bundles still on the disk: %v", aside)
	}

	// A restarted node finds its bundles on disk: no fetch, same usage.
	os.MkdirAll(filepath.Join(dir, ".unpack-123"), 0o755) // crash leftover
	again, err := NewCache(dir, 0, 2*size+size/2)
	if err != nil {
		t.Fatal(err)
	}
	if st := again.Stats(); st.Bundles != 2 || st.Bytes != cache.Stats().Bytes {
		t.Fatalf("restart sees %+v, before %+v", st, cache.Stats())
	}
	if _, err := os.Stat(filepath.Join(dir, ".unpack-123")); err == nil {
		t.Fatal("crash leftover not cleaned")
	}
	store.Delete(ctx, ObjectKey(c))
	if _, _, fetched, err := again.Get(ctx, store, c); err != nil || fetched {
		t.Fatalf("restarted cache should serve c from disk: fetched=%v err=%v", fetched, err)
	}
}

// Eviction must never remove a bundle between a Get finding it and pinning
// it: with room for one bundle and four in turn, every Get still succeeds.
func TestCacheGetRacesEviction(t *testing.T) {
	ctx := context.Background()
	store, _ := objectstore.NewFS(t.TempDir())
	const size = 20 << 10
	shas := []string{putBundle(t, store, 1, size), putBundle(t, store, 2, size), putBundle(t, store, 3, size), putBundle(t, store, 4, size)}
	cache, err := NewCache(t.TempDir(), 0, size+size/2)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 150; i++ {
				sha := shas[(g+i)%len(shas)]
				if _, _, _, err := cache.Get(ctx, store, sha); err != nil {
					errs <- err
					return
				}
				cache.Release(sha)
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// failingStore serves every object as a stream that breaks after a few
// bytes: the store, not this node, fails a fetch.
type failingStore struct{ objectstore.Store }

func (s failingStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	return io.NopCloser(io.MultiReader(strings.NewReader("(zstd"), iotest.ErrReader(errors.New("connection reset by peer")))), nil
}

// TestCacheDiskFull: a write of the node's copy of a bundle that fails for
// a full disk (at the fetch, the unpacking into the cache, or a deploy's
// check) is reported as ENOSPC naming the file, and a Get's with its stage
// (StageError), not as a failure to read
// the store (FetchError) nor as a refused bundle (Error); it leaves nothing
// behind, and the same call succeeds once the disk has room. A stream the
// store breaks is still a FetchError.
func TestCacheDiskFull(t *testing.T) {
	for _, tc := range []struct {
		name    string
		full    string // writes to paths containing this fail with ENOSPC
		get     func(c *Cache, store objectstore.Store, sha string) error
		isFetch bool
		stage   string // StageError's, for a Get's failure on this node
	}{
		{"fetch", "/.fetch-", cacheGet, false, "fetching"},
		{"unpack", "/.unpack-", cacheGet, false, "unpacking"},
		{"deploy-check", "/.verify-", cacheVerify, false, ""},
		{"store-breaks", "", func(c *Cache, store objectstore.Store, sha string) error {
			return cacheGet(c, failingStore{store}, sha)
		}, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store, sha, c := storedBundle(t)
			var full atomic.Bool
			full.Store(true)
			c.WriteFault = func(path string, n int) error {
				if tc.full != "" && full.Load() && strings.Contains(path, tc.full) {
					return syscall.ENOSPC
				}
				return nil
			}
			err := tc.get(c, store, sha)
			var fe *FetchError
			var be *Error
			switch {
			case err == nil:
				t.Fatal("no error")
			case tc.isFetch != errors.As(err, &fe):
				t.Fatalf("FetchError is %v, want %v: %v", !tc.isFetch, tc.isFetch, err)
			case errors.As(err, &be):
				t.Fatalf("a full disk refused the bundle: %v", err)
			case !tc.isFetch && (!errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), c.Dir()+tc.full)):
				t.Fatalf("want ENOSPC naming the file under %s: %v", c.Dir(), err)
			}
			var se *StageError
			if tc.stage != "" && (!errors.As(err, &se) || se.Stage != tc.stage) {
				t.Errorf("want the stage %q said: %#v", tc.stage, err)
			}
			des, _ := os.ReadDir(c.Dir())
			for _, de := range des {
				t.Errorf("left in the cache: %s", de.Name())
			}
			full.Store(false)
			if tc.isFetch {
				return
			}
			if err := tc.get(c, store, sha); err != nil {
				t.Fatalf("with room again: %v", err)
			}
		})
	}
}

// cacheGet fetches sha into the cache, as a cold start does.
func cacheGet(c *Cache, store objectstore.Store, sha string) error {
	_, _, _, err := c.Get(context.Background(), store, sha)
	if err == nil {
		c.Release(sha)
	}
	return err
}

// cacheVerify unpacks sha for a deploy's checks, as a deploy does.
func cacheVerify(c *Cache, store objectstore.Store, sha string) error {
	return verifyThen(c, store, sha, func(dir string) { os.RemoveAll(dir) })
}

// cacheAdopt unpacks sha for a deploy's checks and hands it to the cache,
// as a deploy that stored it does.
func cacheAdopt(c *Cache, store objectstore.Store, sha string) error {
	return verifyThen(c, store, sha, func(work string) { c.Adopt(work, sha) })
}

// verifyThen unpacks sha from store with Verify and puts its directory to
// then.
func verifyThen(c *Cache, store objectstore.Store, sha string, then func(dir string)) error {
	rc, err := store.Get(context.Background(), ObjectKey(sha))
	if err != nil {
		return err
	}
	defer rc.Close()
	dir, _, err := c.Verify(rc, nil)
	if err == nil {
		then(dir)
	}
	return err
}

// TestCacheTrustsStampsOnlyOfSettledFiles: a cached bundle without stamps
// (unstamp) is hashed at its first Get in a process and then, while its files keep the stamps
// they had, not again, though a worker's stage links and unlinks them
// between loads; a write (even of the same bytes) or another file in its
// place has it hashed again and any damage found; files written within
// racyWindow of the hash are hashed every time. A write whose mtime is set
// back by hand is not seen: the limit the stamps accept (sums.go).
func TestCacheTrustsStampsOnlyOfSettledFiles(t *testing.T) {
	flip := func(t *testing.T, dir string) {
		p := filepath.Join(dir, "w.bin")
		b, _ := os.ReadFile(p)
		b[0] ^= 0xff
		os.WriteFile(p, b, 0o644)
	}
	for _, tt := range []struct {
		name    string
		settled bool
		change  func(t *testing.T, dir string) // nil: none
		hashed  bool                           // hashed again after the change
		damaged bool
	}{
		{"unchanged", true, nil, false, false},
		{"unchanged but racy", false, nil, true, false},
		{"linked into a stage and unlinked", true, func(t *testing.T, dir string) {
			stage := filepath.Join(t.TempDir(), "w.bin")
			if err := os.Link(filepath.Join(dir, "w.bin"), stage); err != nil {
				t.Skipf("no hard links here: %v", err)
			}
			os.Remove(stage)
		}, false, false},
		{"a byte flipped, same size", true, flip, true, true},
		{"a byte flipped, mtime set back by hand", true, func(t *testing.T, dir string) {
			p := filepath.Join(dir, "w.bin")
			fi, _ := os.Stat(p)
			flip(t, dir)
			os.Chtimes(p, fi.ModTime(), fi.ModTime())
		}, false, false},
		{"another file in its place", true, func(t *testing.T, dir string) {
			p := filepath.Join(dir, "lib.so")
			b, _ := os.ReadFile(p)
			os.WriteFile(p+".new", append(b[:len(b)-1:len(b)-1], 'X'), 0o644)
			if err := os.Rename(p+".new", p); err != nil {
				t.Fatal(err)
			}
		}, true, true},
		{"rewritten with the same bytes", true, func(t *testing.T, dir string) {
			p := filepath.Join(dir, "w.bin")
			b, _ := os.ReadFile(p)
			os.WriteFile(p, b, 0o644)
		}, true, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			store, _ := objectstore.NewFS(t.TempDir())
			sha := putBundle(t, store, 7, 64<<10)
			cache, repaired := stampedCache(t, t.TempDir(), tt.settled)
			get := func() string { return getReleased(t, cache, store, sha) }
			hashed := func() int { cache.mu.Lock(); defer cache.mu.Unlock(); return cache.hashed }
			dir := get() // fetched: verified and stamped as it was unpacked
			unstamp(cache, sha)
			get() // the first Get from the cache hashes
			if hashed() != 1 {
				t.Fatalf("hashed %d times at the first Get from the cache, want 1", hashed())
			}
			if tt.change != nil {
				pastTick(t, filepath.Join(dir, "w.bin"))
				tt.change(t, dir)
			}
			get()
			wantHashes, wantRepairs := 1, int32(0)
			if tt.hashed {
				wantHashes = 2
			}
			if tt.damaged {
				wantRepairs = 1
			}
			if hashed() != wantHashes || repaired.Load() != wantRepairs {
				t.Fatalf("after the change: hashed %d times, repaired %d, want %d and %d", hashed(), repaired.Load(), wantHashes, wantRepairs)
			}
		})
	}
}

// TestCacheStampsOutliveTheProcess: a restarted server (a new Cache over
// the same directory) trusts the stamps a process before it kept at a
// hash (the entry unstamped after its fetch), and
// hashes an entry whose files changed since, whose stamps were never
// kept (racy) or whose stamps file is missing or torn.
func TestCacheStampsOutliveTheProcess(t *testing.T) {
	for _, tt := range []struct {
		name    string
		settled bool
		change  func(t *testing.T, dir string) // between the two processes
		hashed  bool                           // by the second process
		damaged bool
	}{
		{"unchanged", true, nil, false, false},
		{"racy at the first process's hash", false, nil, true, false},
		{"a byte flipped while no server ran", true, func(t *testing.T, dir string) {
			p := filepath.Join(dir, "w.bin")
			b, _ := os.ReadFile(p)
			b[1] ^= 0xff
			os.WriteFile(p, b, 0o644)
		}, true, true},
		{"stamps file removed", true, func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, stampsFile)) }, true, false},
		{"stamps file torn", true, func(t *testing.T, dir string) {
			p := filepath.Join(dir, stampsFile)
			b, _ := os.ReadFile(p)
			os.WriteFile(p, b[:len(b)/2], 0o644)
		}, true, false},
		{"stamps file cut at a line's end, a file it no longer names damaged", true, func(t *testing.T, dir string) {
			p := filepath.Join(dir, stampsFile)
			b, _ := os.ReadFile(p)
			lines := strings.SplitAfter(string(b), "\n")
			os.WriteFile(p, []byte(strings.Join(lines[:2], "")), 0o644) // the list and its first file
			for _, l := range lines[2:] {
				if f := strings.Fields(l); len(f) == 5 {
					q := filepath.Join(dir, f[4])
					c, _ := os.ReadFile(q)
					c[0] ^= 0xff
					os.WriteFile(q, c, 0o644)
				}
			}
		}, true, true},
		{"stamps file of another entry's files", true, func(t *testing.T, dir string) {
			p := filepath.Join(dir, stampsFile)
			b, _ := os.ReadFile(p)
			os.WriteFile(p, bytes.Replace(b, []byte("w.bin"), []byte("x.bin"), 1), 0o644)
		}, true, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			store, _ := objectstore.NewFS(t.TempDir())
			sha := putBundle(t, store, 7, 64<<10)
			cdir := t.TempDir()
			open := func() (*Cache, *atomic.Int32) { return stampedCache(t, cdir, tt.settled) }
			get := func(cache *Cache) string { return getReleased(t, cache, store, sha) }
			first, _ := open()
			dir := get(first) // fetched, stamped
			unstamp(first, sha)
			get(first) // hashed, stamps kept if settled
			if tt.change != nil {
				pastTick(t, filepath.Join(dir, "w.bin"))
				tt.change(t, dir)
			}
			second, repaired := open()
			get(second)
			second.mu.Lock()
			hashed := second.hashed
			second.mu.Unlock()
			if (hashed == 1) != tt.hashed || (repaired.Load() == 1) != tt.damaged {
				t.Fatalf("the restarted cache hashed %d times and repaired %d, want hashed %v, damaged %v", hashed, repaired.Load(), tt.hashed, tt.damaged)
			}
			get(second) // then trusts what it found (settled) or fetched anew (stamped), or hashes again: racy
			second.mu.Lock()
			again := second.hashed - hashed
			second.mu.Unlock()
			if want := map[bool]int{true: 1, false: 0}[!tt.settled && !tt.damaged]; again != want {
				t.Fatalf("the restarted cache's next Get hashed %d times, want %d", again, want)
			}
		})
	}
}

// TestCacheStampsWhatItUnpacks: a bundle this process fetched, or a
// deploy's unpacked and adopted, is stamped as it is unpacked: no Get
// hashes it, in this process nor after a restart, until a write changes
// a file, even one made at once, within the file system's clock tick of
// the unpack (its mtime was set unpackedAge back): that Get hashes it, and
// damage is repaired by a fetch, which stamps it again. A fetch keeps its
// stamps in memory too: its stamps file lost costs a restarted server a
// hash, not this process.
func TestCacheStampsWhatItUnpacks(t *testing.T) {
	type change func(t *testing.T, dir string, deploy func())
	rewrite := func(name string, flip bool) change {
		return func(t *testing.T, dir string, _ func()) {
			p := filepath.Join(dir, name)
			b, _ := os.ReadFile(p)
			if flip {
				b[3] ^= 0xff
			}
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	flip, lose := rewrite("w.bin", true), func(t *testing.T, dir string, _ func()) { os.Remove(filepath.Join(dir, stampsFile)) }
	for _, tt := range []struct {
		name     string
		deployed bool // Verify and Adopt, as a deploy does, instead of a fetch
		restart  bool // the Get after the change from a new Cache over the same directory
		change   change
		hashed   int // by that Get and the next
		repaired int32
	}{
		{"fetched", false, false, nil, 0, 0},
		{"fetched, restarted", false, true, nil, 0, 0},
		{"fetched, a byte flipped at once", false, false, flip, 1, 1},
		{"fetched, a byte flipped at once, restarted", false, true, flip, 1, 1},
		{"fetched, the digest list rewritten as it was (racy now: hashed at each Get)", false, false, rewrite(sumsFile, false), 2, 0},
		{"fetched, its stamps file lost", false, false, lose, 0, 0},
		{"fetched, its stamps file lost, restarted", false, true, lose, 1, 0},
		{"deployed", true, false, nil, 0, 0},
		{"deployed, restarted", true, true, nil, 0, 0},
		{"deployed twice (the second adopts nothing)", true, false, func(_ *testing.T, _ string, deploy func()) { deploy() }, 0, 0},
		{"fetched, its directory removed by hand, deployed", false, false, func(_ *testing.T, dir string, deploy func()) { os.RemoveAll(dir); deploy() }, 0, 0},
		{"deployed, a byte flipped at once", true, false, flip, 1, 1},
		{"deployed, a byte flipped at once, restarted", true, true, flip, 1, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			store, _ := objectstore.NewFS(t.TempDir())
			sha := putBundle(t, store, 5, 64<<10)
			cdir := t.TempDir()
			open := func() (*Cache, *atomic.Int32) {
				cache, err := NewCache(cdir, 0, 0)
				if err != nil {
					t.Fatal(err)
				}
				var repaired atomic.Int32
				cache.OnRepair = func(string, error) { repaired.Add(1) }
				return cache, &repaired
			}
			cache, repaired := open()
			deploy := func() {
				if err := cacheAdopt(cache, store, sha); err != nil {
					t.Fatal(err)
				}
			}
			if tt.deployed {
				deploy()
			} else {
				getReleased(t, cache, store, sha)
				if cache.entries[sha].verified == nil {
					t.Fatal("the fetch kept no stamps in memory")
				}
			}
			dir := filepath.Join(cdir, sha)
			// Not racy though just written: a write from now on cannot
			// leave a file's mtime as stamped, on any clock tick.
			if st := readStamps(dir); !st.coverSums(dir) || !st.unchanged(dir) || !st.settled(time.Now()) {
				t.Fatalf("the unpacked entry's stamps %v do not cover its files, or are racy", st)
			}
			if tt.change != nil {
				tt.change(t, dir, deploy)
			}
			if tt.restart {
				cache, repaired = open()
			}
			getReleased(t, cache, store, sha)
			getReleased(t, cache, store, sha) // repaired or not, trusted from here
			if cache.hashed != tt.hashed || repaired.Load() != tt.repaired {
				t.Fatalf("hashed %d times and repaired %d, want %d and %d", cache.hashed, repaired.Load(), tt.hashed, tt.repaired)
			}
			if b, _ := os.ReadFile(filepath.Join(dir, "w.bin")); len(b) != 64<<10 || b[3] != 5 {
				t.Fatal("the constants served are not the bundle's")
			}
		})
	}
}

// unstamp leaves sha's entry as a build before stampUnpacked unpacked it:
// no stamps, on disk or in memory, and its files' mtimes of the present.
func unstamp(cache *Cache, sha string) {
	dir := filepath.Join(cache.dir, sha)
	os.Remove(filepath.Join(dir, stampsFile))
	des, _ := os.ReadDir(dir)
	now := time.Now()
	for _, de := range des {
		os.Chtimes(filepath.Join(dir, de.Name()), now, now)
	}
	cache.keep(sha, nil)
}

// stampedCache is a cache over dir counting its repairs, whose clock is
// racyWindow past the files' writes when settled (then they are old).
func stampedCache(t *testing.T, dir string, settled bool) (*Cache, *atomic.Int32) {
	t.Helper()
	cache, err := NewCache(dir, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var repaired atomic.Int32
	cache.OnRepair = func(string, error) { repaired.Add(1) }
	now := time.Now()
	if settled {
		now = now.Add(2 * racyWindow)
	}
	cache.now = func() time.Time { return now }
	return cache, &repaired
}

// getReleased takes sha from cache for a load and lets it go; it returns
// the entry's directory.
func getReleased(t *testing.T, cache *Cache, store objectstore.Store, sha string) string {
	t.Helper()
	dir, _, _, err := cache.Get(context.Background(), store, sha)
	if err != nil {
		t.Fatal(err)
	}
	cache.Release(sha)
	return dir
}

// BenchmarkCacheGetWarm: a cached bundle of 256 MiB of constants taken
// again for a load (a function warmed up again after its instances were
// evicted): "hashed" as at a process's first load of it, "stamped" after.
func BenchmarkCacheGetWarm(b *testing.B) {
	ctx := context.Background()
	store, _ := objectstore.NewFS(b.TempDir())
	dir := b.TempDir()
	os.WriteFile(filepath.Join(dir, abi.ManifestFile), manifestJSON(b, "w.bin"), 0o644)
	os.WriteFile(filepath.Join(dir, "lib.so"), []byte("\x7fELF"), 0o644)
	os.WriteFile(filepath.Join(dir, "w.bin"), bytes.Repeat([]byte{9}, 256<<20), 0o644)
	raw, sha, _, err := PackBytes(dir)
	if err != nil {
		b.Fatal(err)
	}
	store.Put(ctx, ObjectKey(sha), bytes.NewReader(raw), int64(len(raw)))
	for _, stamped := range []bool{false, true} {
		name := map[bool]string{false: "hashed", true: "stamped"}[stamped]
		b.Run(name, func(b *testing.B) {
			cache, err := NewCache(b.TempDir(), 0, 0)
			if err != nil {
				b.Fatal(err)
			}
			cache.now = func() time.Time { return time.Now().Add(2 * racyWindow) }
			get := func() {
				if _, _, _, err := cache.Get(ctx, store, sha); err != nil {
					b.Fatal(err)
				}
				cache.Release(sha)
			}
			get()
			get()
			for b.Loop() {
				if !stamped {
					cache.keep(sha, nil)
					os.Remove(filepath.Join(cache.dir, sha, stampsFile))
				}
				get()
			}
		})
	}
}

// pastTick waits until a file written now gets another mtime than path
// has: a write made after it shows in the stamps whatever the file
// system's timestamp tick (a jiffy on kernels before 6.13).
func pastTick(t *testing.T, path string) {
	t.Helper()
	mtime := func(p string) int64 {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		return st.Mtim.Nano()
	}
	was := mtime(path)
	probe := filepath.Join(t.TempDir(), "tick")
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if err := os.WriteFile(probe, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if mtime(probe) != was {
			return
		}
	}
	t.Fatal("the file system's clock did not move in 5 s")
}

// A directory under a bundle's name that no entry records (one a failed
// discard left, or one whose record was never made: its size was read
// after the rename, and a failed read left it unrecorded) is set aside
// by the next fetch of that bundle, which takes its place. Left, it
// failed that fetch's rename, and every later one's (ENOTEMPTY), until
// a restart: a 503 for the function on the node.
func TestCacheGetReplacesADirectoryNoEntryRecords(t *testing.T) {
	store, sha, c := storedBundle(t)
	stale := filepath.Join(c.Dir(), sha)
	if err := os.Mkdir(stale, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stale, "w.bin"), []byte("stale"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir, m, fetched, err := c.Get(context.Background(), store, sha)
	if err != nil || !fetched {
		t.Fatalf("Get over an unrecorded directory: fetched %v, %v", fetched, err)
	}
	c.Release(sha)
	if got, err := os.ReadFile(filepath.Join(dir, m.Constants)); err != nil || !bytes.Equal(got, bytes.Repeat([]byte{7}, 4<<10)) {
		t.Errorf("the constants are not the bundle's: %.20q, %v", got, err)
	}
	size, _, err := dirSize(dir)
	if err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.Bundles != 1 || st.Bytes != size {
		t.Errorf("cache stats %+v, want 1 bundle of %d bytes", st, size)
	}
	des, _ := os.ReadDir(c.Dir())
	for _, de := range des {
		if de.Name() != sha {
			t.Errorf("left in the cache: %s", de.Name())
		}
	}
}

// heldStore holds every Get until release is closed (or its context
// ends), as a distant store's slow download would.
type heldStore struct {
	objectstore.Store
	began   chan struct{}
	release chan struct{}
}

func (s heldStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	s.began <- struct{}{}
	select {
	case <-s.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.Store.Get(ctx, key)
}

// A Get waiting for another's fetch of the same bundle gives up with its
// own context (a 504 for its request), where it waited until the fetch
// before it ended; the fetch it waited for goes on, and a Get after it
// finds the bundle cached.
func TestCacheGetWaitsForAnotherFetchWithinItsContext(t *testing.T) {
	store, sha, c := storedBundle(t)
	held := heldStore{Store: store, began: make(chan struct{}, 1), release: make(chan struct{})}
	first := make(chan error, 1)
	go func() {
		_, _, _, err := c.Get(context.Background(), held, sha)
		first <- err
	}()
	<-held.began // the first holds the bundle's lock, fetching
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, _, _, err := c.Get(ctx, held, sha)
	var fe *FetchError
	if !errors.As(err, &fe) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the second Get: %v; want a FetchError at its deadline", err)
	}
	select {
	case <-held.began:
		t.Fatal("the second Get fetched too")
	default:
	}
	close(held.release)
	if err := <-first; err != nil {
		t.Fatalf("the first Get: %v", err)
	}
	c.Release(sha)
	if _, _, fetched, err := c.Get(context.Background(), held, sha); err != nil || fetched {
		t.Fatalf("a Get after the fetch: fetched %v, %v; want the cached bundle", fetched, err)
	}
	c.Release(sha)
	c.mu.Lock()
	locks := len(c.locks)
	c.mu.Unlock()
	if locks != 0 {
		t.Errorf("%d bundle locks kept with no holder or waiter", locks)
	}
}

// Reserve counts the bundles in use and the one asked of (its size on the
// disk where the cache holds it), never those it would evict.
func TestCacheReserveCountsBundlesInUse(t *testing.T) {
	ctx := context.Background()
	store, _ := objectstore.NewFS(t.TempDir())
	const size = 100 << 10
	a, b, c := putBundle(t, store, 1, size), putBundle(t, store, 2, size), putBundle(t, store, 3, size)
	cache, err := NewCache(t.TempDir(), 0, 2*size+size/2) // two bundles in use, not three
	if err != nil {
		t.Fatal(err)
	}
	for _, sha := range []string{a, b} {
		if _, _, _, err := cache.Get(ctx, store, sha); err != nil {
			t.Fatal(err)
		}
	}
	cache.Release(b) // held, not in use
	for _, tc := range []struct {
		what string
		sha  string
		size int64
		want bool
	}{
		{"in use already", a, size, true},
		{"held, not in use (the cache is within its limit)", b, size, true},
		{"absent, fits beside a", c, size, true},
		{"absent, too large beside a", c, 2 * size, false},
	} {
		release, got := cache.Reserve(tc.sha, tc.size)
		release()
		if got != tc.want {
			t.Errorf("%s: Reserve = %v, want %v", tc.what, got, tc.want)
		}
	}
	if _, _, _, err := cache.Get(ctx, store, b); err != nil { // a and b in use
		t.Fatal(err)
	}
	if _, ok := cache.Reserve(c, size); ok {
		t.Error("Reserve for a third bundle beside two in use: true, want false")
	}
	unlimited, _ := NewCache(t.TempDir(), 0, 0)
	if _, ok := unlimited.Reserve(c, 1<<40); !ok {
		t.Error("Reserve without a limit: false")
	}
}

// A deploy's unpacked bundle is hashed and synced when the cache adopts
// it, not as Verify unpacks it: a bundle the deploy's checks refuse costs
// neither. The adopted entry has its digests, and serves without a fetch.
func TestVerifyLeavesTheHashingToAdopt(t *testing.T) {
	store, _ := objectstore.NewFS(t.TempDir())
	sha := putBundle(t, store, 1, 10<<10)
	c, err := NewCache(t.TempDir(), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var sums error
	if err := verifyThen(c, store, sha, func(work string) {
		_, sums = os.Stat(filepath.Join(work, sumsFile))
		c.Adopt(work, sha)
	}); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(sums, fs.ErrNotExist) {
		t.Errorf("Verify's directory: %s %v, want none yet", sumsFile, sums)
	}
	if _, err := os.Stat(filepath.Join(c.Dir(), sha, sumsFile)); err != nil {
		t.Errorf("the adopted entry's %s: %v", sumsFile, err)
	}
	empty, _ := objectstore.NewFS(t.TempDir())
	if _, _, fetched, err := c.Get(context.Background(), empty, sha); err != nil || fetched {
		t.Errorf("Get of the adopted bundle: fetched %v, %v", fetched, err)
	}
}

// An idle entry's directory removed behind the cache's back (an operator,
// a tmp cleaner) stopped every later eviction: each pass picked it, failed
// to rename it, and gave up, so the cache grew past its limit for good (a
// review's finding). It is forgotten now, and the next victim taken.
func TestEvictionOutlivesAMissingEntry(t *testing.T) {
	ctx := context.Background()
	store, err := objectstore.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	const size = 100 << 10
	dir := t.TempDir()
	c, err := NewCache(dir, 0, 2*size+size/2)
	if err != nil {
		t.Fatal(err)
	}
	var shas []string
	for i := range 6 {
		shas = append(shas, putBundle(t, store, byte(i+1), size))
	}
	for i, sha := range shas {
		if _, _, _, err := c.Get(ctx, store, sha); err != nil {
			t.Fatal(err)
		}
		c.Release(sha)
		if i == 1 {
			os.RemoveAll(filepath.Join(dir, shas[0])) // the least recently used
		}
	}
	n := 0
	des, _ := os.ReadDir(dir)
	for _, de := range des {
		if ValidDigest(de.Name()) {
			n++
		}
	}
	if st := c.Stats(); n > 2 || st.Bundles > 2 {
		t.Fatalf("%d bundles on disk, %d counted (%d bytes), where the limit fits 2", n, st.Bundles, st.Bytes)
	}
}

// The pre-warms a poll starts at once each asked whether their bundle fit
// beside those in use, and each was told yes before any had loaded one (a
// review's HIGH): what one reserves counts for the next, until released.
func TestReserveCountsWhatIsReserved(t *testing.T) {
	const size = 100 << 10
	c, err := NewCache(t.TempDir(), 0, 2*size+size/2)
	if err != nil {
		t.Fatal(err)
	}
	sha := func(b byte) string { return hex.EncodeToString(bytes.Repeat([]byte{b}, 32)) }
	r1, ok1 := c.Reserve(sha(1), size)
	r2, ok2 := c.Reserve(sha(2), size)
	_, ok3 := c.Reserve(sha(3), size)
	if !ok1 || !ok2 || ok3 {
		t.Fatalf("three reservations of %d bytes against %d: %v %v %v, want the third refused", size, 2*size+size/2, ok1, ok2, ok3)
	}
	r1()
	r1() // a second release gives nothing back twice
	r3, ok := c.Reserve(sha(3), size)
	if !ok {
		t.Fatal("a reservation after one was released: refused")
	}
	if _, ok := c.Reserve(sha(4), size); ok {
		t.Fatal("a fourth reservation beside two held: granted (a release counted twice?)")
	}
	r2()
	r3()
	// One bundle reserved twice (two functions of the same bytes) is
	// counted once: the disk holds it once.
	a1, ok1 := c.Reserve(sha(5), 2*size)
	a2, ok2 := c.Reserve(sha(5), 2*size)
	if !ok1 || !ok2 {
		t.Fatalf("one bundle of %d bytes reserved twice against %d: %v %v, want both granted", 2*size, 2*size+size/2, ok1, ok2)
	}
	a1()
	if _, ok := c.Reserve(sha(6), size); ok {
		t.Fatal("a reservation beside a bundle still reserved once: granted")
	}
	a2()
	if r, ok := c.Reserve(sha(6), size); !ok {
		t.Fatal("a reservation once every other was released: refused")
	} else {
		r()
	}
}

// A cache made here is the server's alone (0700): every tenant's library
// and weights are in it, and it was 0755, readable by any local user and
// by a worker of another uid where Landlock is missing (a review's
// finding). Workers read their bundles through their stage's descriptor.
func TestANewCacheIsTheServersAlone(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cache")
	if _, err := NewCache(dir, 0, 0); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		t.Fatalf("a new cache's directory is %v, want no access but its owner's", fi.Mode().Perm())
	}
}

// A damaged entry still held by a loaded version was a FetchError, which
// the engine answers as the store's outage, quoting the error: the node's
// cache paths reached the client (a review's finding). It is
// ErrDamagedInUse now, which the engine answers without them.
func TestADamagedEntryInUseIsNotTheStores(t *testing.T) {
	ctx := context.Background()
	store, sha, c := storedBundle(t)
	if _, _, _, err := c.Get(ctx, store, sha); err != nil { // a loaded version holds it
		t.Fatal(err)
	}
	os.Remove(filepath.Join(c.Dir(), sha, sumsFile))
	os.Remove(filepath.Join(c.Dir(), sha, stampsFile))
	c.keep(sha, nil)
	_, _, _, err := c.Get(ctx, store, sha)
	var fe *FetchError
	if !errors.Is(err, ErrDamagedInUse) || errors.As(err, &fe) {
		t.Fatalf("a damaged entry in use: %v; want ErrDamagedInUse, not a FetchError", err)
	}
}
