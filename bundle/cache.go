package bundle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/objectstore"
)

// Cache holds unpacked bundles on this node, one directory per sha256. A
// directory appears only by an atomic rename after its bundle was verified
// and unpacked, so a present directory is complete.
//
// The cache survives restarts, so a restarted server cold-starts from its
// disk. With a size limit, bundles that are not in use (see Get and
// Release) are evicted least recently used first.
type Cache struct {
	dir         string
	maxUnpacked int64
	maxBytes    int64 // 0: no limit

	// fetches bounds the bundles this node fetches and unpacks at once
	// for cold starts and pre-warms (deploys take the engine's own
	// turns): each writes an archive and its unpacked files of up to 4
	// GiB each and holds a zstd window, and a poll that brings many new
	// versions starts a pre-warm for each.
	fetches chan struct{}

	mu      sync.Mutex
	locks   map[string]*shaLock // only while held or waited for (lock)
	entries map[string]*cacheEntry
	total   int64
	// reserved is what pre-warms reserved (Reserve) and have not yet
	// released, by bundle in reservedBy: counted with the bundles in use.
	reserved   int64
	reservedBy map[string]*reservation
	// full is, by bundle, a fetch of it that found the disk full, which
	// the next ones within fullBackoff are answered with (stillFull).
	full map[string]fullDisk

	// OnRepair, when set, hears of a cached bundle whose files no longer
	// match what was unpacked: the entry is discarded and fetched again.
	OnRepair func(sha string, reason error)
	// WriteFault, when set, may fail the cache's writes of bundles (a
	// fetched archive, an unpacked file) as a full disk would: a test seam.
	WriteFault WriteFault

	now func() time.Time // a test's clock (nil: time.Now)
	// removeDir removes a directory set aside (nil: os.RemoveAll); a
	// test's window on when that happens.
	removeDir func(string) error
	// hashed counts the entries hashed at a Get (a test's window).
	hashed int
}

type cacheEntry struct {
	size     int64
	lastUsed time.Time
	inUse    int
	// verified: the entry's files as this process (or, read from
	// stampsFile, one before it) unpacked and hashed them, or last hashed
	// them and found them right, settled (nil: read stampsFile, else hash
	// them, at the next Get).
	verified stamps
}

// NewCache opens a bundle cache under dir, keeping at most maxBytes of
// unpacked bundles (0: no limit). It picks up bundles a previous run left
// and removes half-written work.
func NewCache(dir string, maxUnpacked, maxBytes int64) (*Cache, error) {
	// The server's alone: a worker reads its bundle through its stage's
	// descriptor, and every tenant's library and weights are here, which
	// a local user, or a worker of another uid on a kernel without
	// Landlock, could otherwise list and read.
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("bundle cache: %w", err)
	}
	// One made before (0755) is closed too: MkdirAll leaves its mode.
	if fi, err := os.Lstat(dir); err == nil && fi.IsDir() && fi.Mode().Perm()&0o077 != 0 {
		os.Chmod(dir, fi.Mode().Perm()&0o700)
	}
	if maxUnpacked <= 0 {
		maxUnpacked = DefaultMaxUnpacked
	}
	c := &Cache{dir: dir, maxUnpacked: maxUnpacked, maxBytes: maxBytes, fetches: make(chan struct{}, FetchTurns),
		locks: map[string]*shaLock{}, entries: map[string]*cacheEntry{}}
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("bundle cache: %w", err)
	}
	for _, de := range des {
		p := filepath.Join(dir, de.Name())
		if !ValidDigest(de.Name()) || !de.IsDir() {
			os.RemoveAll(p) // .fetch-*, .unpack-*, .verify-*, .evict-* from a crash
			continue
		}
		size, mtime, err := dirSize(p)
		if err != nil {
			return nil, fmt.Errorf("bundle cache: %w", err)
		}
		c.entries[de.Name()] = &cacheEntry{size: size, lastUsed: mtime}
		c.total += size
	}
	return c, nil
}

// UnpackedBytes is the bytes of an unpacked bundle's files in dir (Verify's
// directory): what the cache will hold of it.
func UnpackedBytes(dir string) (int64, error) {
	n, _, err := dirSize(dir)
	return n, err
}

func dirSize(dir string) (int64, time.Time, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return 0, time.Time{}, err
	}
	des, err := os.ReadDir(dir)
	if err != nil {
		return 0, time.Time{}, err
	}
	var n int64
	for _, de := range des {
		info, err := de.Info()
		if err != nil {
			return 0, time.Time{}, err
		}
		n += info.Size()
	}
	return n, fi.ModTime(), nil
}

// Dir is the directory the cache keeps its bundles in, on this node's disk.
func (c *Cache) Dir() string { return c.dir }

// MaxObject is the largest store object, a packed bundle, that the cache
// fetches (its limit on a bundle's unpacked bytes bounds its archive too).
// A deploy stores none larger: one a node took, every node with the same
// limit must be able to fetch.
func (c *Cache) MaxObject() int64 { return c.maxUnpacked }

// Limit is the most bytes of unpacked bundles the cache keeps in use
// beside each other (plover serve --cache-limit; 0: no limit). A bundle
// larger than it alone is never reserved (Reserve), whatever unloads:
// a pre-warm of it need not be tried again.
func (c *Cache) Limit() int64 { return c.maxBytes }

// CacheStats describes the cache for metrics and tests.
type CacheStats struct {
	Bundles int
	Bytes   int64
	InUse   int
}

// Stats reports the cache's contents.
func (c *Cache) Stats() CacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := CacheStats{Bundles: len(c.entries), Bytes: c.total}
	for _, e := range c.entries {
		if e.inUse > 0 {
			s.InUse++
		}
	}
	return s
}

// Reserve reports whether bundle sha, of at least size bytes (its size
// in the cache, where it is there), can be in use beside the bundles in
// use and those reserved, and the cache stay within its limit: true for
// one in use already, or without a limit. Where it can, size is reserved
// until release is called: a pre-warm reserves first and releases once its
// load holds the bundle in use. A version kept warm (min_instances) holds
// its bundle for as long as it is current, and bundles in use are never
// evicted, so warming past the limit would let a tenant fill the node's
// disk with large bundles, one deploy at a time; and a check that reserved
// nothing passed every one of the pre-warms a poll starts at once.
func (c *Cache) Reserve(sha string, size int64) (release func(), ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.maxBytes <= 0 {
		return func() {}, true
	}
	if e, found := c.entries[sha]; found {
		if e.inUse > 0 {
			return func() {}, true
		}
		size = max(size, e.size)
	}
	r := c.reservedBy[sha]
	if r == nil {
		// Counted once however many reserve it (two functions of one
		// bundle): the disk holds it once.
		held := size + c.reserved
		for _, e := range c.entries {
			if e.inUse > 0 {
				held += e.size
			}
		}
		if held > c.maxBytes {
			return func() {}, false
		}
		r = &reservation{size: size}
		if c.reservedBy == nil {
			c.reservedBy = map[string]*reservation{}
		}
		c.reservedBy[sha] = r
		c.reserved += size
	}
	r.n++
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			if r.n--; r.n == 0 {
				c.reserved -= r.size
				delete(c.reservedBy, sha)
			}
			c.mu.Unlock()
		})
	}, true
}

// reservation is what Reserve holds for one bundle: its size, and how
// many hold it.
type reservation struct {
	size int64
	n    int
}

// use marks sha used now and in use by one more holder, recording it, of
// size bytes, if new. It cannot fail: its caller has just renamed dir into
// place, and a directory there that no entry records would fail every
// later unpack's rename of sha.
func (c *Cache) use(sha, dir string, size int64) {
	c.mu.Lock()
	e, ok := c.entries[sha]
	if !ok {
		e = &cacheEntry{size: size}
		c.entries[sha] = e
		c.total += size
	}
	now := time.Now()
	e.lastUsed = now
	e.inUse++ // not evicted while in use: its directory stays
	gone := c.evictLocked()
	c.mu.Unlock()
	os.Chtimes(dir, now, now) // the order survives a restart
	c.removeAll(gone)
}

// Release ends one use of a bundle that Get returned.
func (c *Cache) Release(sha string) {
	c.mu.Lock()
	var gone []string
	if e, ok := c.entries[sha]; ok && e.inUse > 0 {
		if e.inUse--; e.inUse == 0 {
			clear(c.full) // a bundle the disk lacked room for may find it now (makeRoom)
		}
		gone = c.evictLocked()
	}
	c.mu.Unlock()
	c.removeAll(gone)
}

// removeAll removes directories set aside (by evictLocked, discard,
// rename), outside the cache's lock and any bundle's: a bundle of
// gigabytes takes a while, and every Get, Release and Stats, or every
// request for that bundle, waited on it.
func (c *Cache) removeAll(dirs []string) {
	for _, d := range dirs {
		if c.removeDir != nil {
			c.removeDir(d)
		} else {
			os.RemoveAll(d)
		}
	}
}

// evictLocked removes least recently used bundles not in use until the
// cache fits its limit. Bundles in use are never removed, so the cache can
// exceed the limit while they are.
func (c *Cache) evictLocked() (gone []string) {
	gone, _ = c.evictIdleLocked(func(int64) bool { return c.maxBytes <= 0 || c.total <= c.maxBytes })
	return gone
}

// evictIdleLocked sets aside least recently used bundles not in use until
// enough says the bytes set aside so far are enough, or none is left; it
// returns their directories, for the caller to remove once it let go of
// the lock, and their bytes.
func (c *Cache) evictIdleLocked(enough func(freed int64) bool) (gone []string, freed int64) {
	var stuck map[string]bool // victims that could not be renamed this pass
	for !enough(freed) {
		var victim string
		var oldest time.Time
		for sha, e := range c.entries {
			if e.inUse == 0 && !stuck[sha] && (victim == "" || e.lastUsed.Before(oldest)) {
				victim, oldest = sha, e.lastUsed
			}
		}
		if victim == "" {
			return gone, freed
		}
		// Renamed aside here, removed by the caller once it let go of the
		// lock: a crash mid-removal must not leave a half-deleted bundle
		// under its sha256 name.
		aside := c.asideName(victim)
		switch err := os.Rename(filepath.Join(c.dir, victim), aside); {
		case errors.Is(err, fs.ErrNotExist):
			// Removed behind the cache's back (an operator, a tmp
			// cleaner): forgotten. Left recorded, it was the victim of
			// every pass, which failed each time: nothing was evicted
			// again, and the cache grew past its limit for good.
		case err != nil:
			if stuck == nil {
				stuck = map[string]bool{}
			}
			stuck[victim] = true // the next one, this pass
			continue
		default:
			gone = append(gone, aside)
			freed += c.entries[victim].size
		}
		c.total -= c.entries[victim].size
		delete(c.entries, victim)
	}
	return gone, freed
}

// asideName is a name to set sha's directory aside under, for its removal
// (NewCache removes .evict-* leftovers of a crash). Named apart: the same
// bundle, fetched again, may be set aside again before the first removal
// ends.
func (c *Cache) asideName(sha string) string {
	return filepath.Join(c.dir, ".evict-"+sha+"-"+strconv.FormatInt(time.Now().UnixNano(), 36))
}

// ErrDamagedInUse is a cached bundle whose files no longer match what was
// unpacked, while a loaded version still uses them: it cannot be fetched
// again until that version unloads. Not the store's doing; the error
// wrapping it names the node's paths, for its log alone.
var ErrDamagedInUse = errors.New("a cached bundle is damaged and still in use")

// FetchError is a failure to read a bundle from the store (an outage, a
// missing object), as opposed to a bundle that was read and refused.
type FetchError struct{ Err error }

func (e *FetchError) Error() string { return "fetch bundle: " + e.Err.Error() }
func (e *FetchError) Unwrap() error { return e.Err }

// StageError says at which stage a Get's work on this node's disk failed:
// "fetching" (the archive, from the store into the cache) or "unpacking"
// (the archive into its entry), so that a caller can tell its client where
// without quoting the paths Err names (those are the server log's). Its
// message is Err's.
type StageError struct {
	Stage string
	Err   error
}

func (e *StageError) Error() string { return e.Err.Error() }
func (e *StageError) Unwrap() error { return e.Err }

// Get returns the unpacked directory and manifest of bundle sha, fetching,
// verifying and unpacking it from store if this node does not have it yet;
// fetched says whether it did. On success the bundle is in use until the
// caller calls Release(sha).
func (c *Cache) Get(ctx context.Context, store objectstore.Store, sha string) (dir string, m *abi.Manifest, fetched bool, err error) {
	if !ValidDigest(sha) {
		return "", nil, false, refuse("invalid sha256 %q", sha)
	}
	unlock, err := c.lock(ctx, sha)
	if err != nil {
		return "", nil, false, &FetchError{Err: fmt.Errorf("waiting for another request's work on bundle %s: %w", sha, err)}
	}
	var aside []string // removed once sha's lock is let go
	defer func() {
		unlock()
		c.removeAll(aside)
	}()
	dir = filepath.Join(c.dir, sha)
	// Pin a cached bundle before reading it, so that eviction (which skips
	// bundles in use) cannot remove it under us.
	if c.pin(sha, dir) {
		err := c.check(sha, dir)
		if err == nil {
			// Read as stored: a version taken before a rule for new
			// manifests came still loads (abi.ParseStoredManifest).
			if m, err = readManifest(files{dir: dir}, abi.ParseStoredManifest); err == nil {
				return dir, m, false, nil
			}
		}
		c.Release(sha)
		if c.holders(sha) > 0 {
			// A loaded version still uses these files: they cannot be
			// replaced under it. It is repaired once that version unloads,
			// or loads a program from them again (Recheck).
			return "", nil, false, fmt.Errorf("cached bundle %s is damaged (%v) and still in use by a loaded version: %w", sha, err, ErrDamagedInUse)
		}
		aside = append(aside, c.discard(sha, dir)...)
		if c.OnRepair != nil {
			c.OnRepair(sha, err)
		}
	}
	m, st, size, err := c.fetch(ctx, store, sha, dir, &aside)
	if err != nil {
		return "", nil, true, err
	}
	c.use(sha, dir, size)
	c.keep(sha, st)
	return dir, m, true, nil
}

// Recheck checks the files of bundle sha, which the caller holds (Get),
// before a program is loaded from them again (a worker restarted after a
// crash): the disk may have damaged them since Get checked them, and a
// damaged library or constants, loaded as they are, were refused as the
// bundle's fault (422) or ran on wrong weights, for as long as the
// version stayed loaded. Checked as Get checks them (a few lstats while
// their stamps hold); damaged, they are fetched again from store into
// their place, while the entry stays, with its holders: they Release it
// as they unload (discarded, a new entry would count their releases), and
// the programs they loaded keep the files they opened (a worker's stage
// links its own names to them). An error leaves the entry without its
// files, fetched again at the next Recheck or, once no one holds it, the
// next Get.
func (c *Cache) Recheck(ctx context.Context, store objectstore.Store, sha string) error {
	unlock, err := c.lock(ctx, sha)
	if err != nil {
		return &FetchError{Err: fmt.Errorf("waiting for another request's work on bundle %s: %w", sha, err)}
	}
	var aside []string // removed once sha's lock is let go
	defer func() {
		unlock()
		c.removeAll(aside)
	}()
	if c.holders(sha) == 0 {
		return fmt.Errorf("bundle cache: a recheck of bundle %s, which no one holds", sha)
	}
	dir := filepath.Join(c.dir, sha)
	damage := c.check(sha, dir)
	if damage == nil {
		return nil
	}
	if c.OnRepair != nil {
		c.OnRepair(sha, damage)
	}
	gone := c.asideName(sha)
	switch err := os.Rename(dir, gone); {
	case err == nil:
		aside = append(aside, gone)
	case !errors.Is(err, fs.ErrNotExist): // gone already: a fetch before this one failed
		return fmt.Errorf("bundle cache: setting aside damaged bundle %s (%v): %w", sha, damage, err)
	}
	_, st, size, err := c.fetch(ctx, store, sha, dir, &aside)
	if err != nil {
		return err
	}
	c.mu.Lock()
	if e, ok := c.entries[sha]; ok { // held: neither evicted nor discarded
		c.total += size - e.size
		e.size, e.verified, e.lastUsed = size, st, time.Now()
	}
	aside = append(aside, c.evictLocked()...)
	c.mu.Unlock()
	return nil
}

// check reports why sha's files in dir are no longer what was unpacked,
// nil where they are. The disk may have changed under the cache (a
// restore, a hand, a fault): the library and constants are checked before
// they are loaded, by their stamps, kept in the entry since it was
// unpacked (a model's weights are not read again at every warm-up, nor at
// every restart), or by their bytes where there are none to trust.
func (c *Cache) check(sha, dir string) error {
	if c.unchanged(sha, dir) {
		return nil
	}
	c.mu.Lock()
	c.hashed++
	c.mu.Unlock()
	began := c.clock()
	st, err := checkSums(dir)
	if err == nil {
		c.verify(sha, dir, st, began)
	}
	return err
}

// unchanged reports whether sha's files still have the stamps they had
// when this process, or one before it (stampsFile), last found their
// bytes right.
func (c *Cache) unchanged(sha, dir string) bool {
	c.mu.Lock()
	var st stamps
	if e, ok := c.entries[sha]; ok {
		st = e.verified
	}
	c.mu.Unlock()
	kept := st == nil
	if kept {
		if st = readStamps(dir); !st.coverSums(dir) {
			st = nil
		}
	}
	if st.unchanged(dir) {
		if kept {
			c.keep(sha, st)
		}
		return true
	}
	c.keep(sha, nil) // hashed again from now on, whatever it finds
	return false
}

// verify keeps st as sha's verified files, hashed from began on, when they
// had settled by then (a hash of a large bundle from a cold disk can take
// longer than racyWindow), in memory and in the entry's stampsFile.
func (c *Cache) verify(sha, dir string, st stamps, began time.Time) {
	if !st.settled(began) {
		st = nil
	}
	if st != nil && st.write(dir) != nil {
		os.Remove(filepath.Join(dir, stampsFile+".tmp")) // a full disk: the next process hashes
	}
	c.keep(sha, st)
}

func (c *Cache) keep(sha string, st stamps) {
	c.mu.Lock()
	if e, ok := c.entries[sha]; ok {
		e.verified = st
	}
	c.mu.Unlock()
}

func (c *Cache) clock() time.Time {
	if c.now != nil {
		return c.now()
	}
	return time.Now()
}

func (c *Cache) holders(sha string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.entries[sha]; ok {
		return e.inUse
	}
	return 0
}

// discard forgets a damaged entry (not in use by anyone but the caller,
// who just released it; a holder's open files stay valid after the unlink)
// and sets its directory aside, returning it for the caller to remove.
func (c *Cache) discard(sha, dir string) []string {
	c.mu.Lock()
	if e, ok := c.entries[sha]; ok {
		c.total -= e.size
		delete(c.entries, sha)
	}
	c.mu.Unlock()
	// This one's removal runs after sha's lock is let go, beside a later
	// discard of the same bundle.
	gone := c.asideName(sha)
	if os.Rename(dir, gone) != nil {
		return nil
	}
	return []string{gone}
}

// pin marks a cached bundle in use and recently used; false if the cache
// does not hold sha.
func (c *Cache) pin(sha, dir string) bool {
	c.mu.Lock()
	e, ok := c.entries[sha]
	if !ok {
		c.mu.Unlock()
		return false
	}
	e.inUse++
	now := time.Now()
	e.lastUsed = now
	c.mu.Unlock()
	// The order survives a restart. After the lock, which every Get,
	// Release and metrics scrape takes: a stalled disk must not hold
	// them. The entry is pinned, so it is not evicted meanwhile.
	os.Chtimes(dir, now, now)
	return true
}

// shaLock serialises the work on one bundle's entry; refs counts those
// that hold it or wait for it. Held is holding its one token: a waiter
// gives up with its context, where a mutex held it until the fetch before
// it ended (a download from a distant store, up to that request's
// deadline).
type shaLock struct {
	held chan struct{}
	refs int
}

// lock takes sha's lock within ctx and returns its unlock. The lock leaves
// c.locks when its last holder or waiter lets go: kept, one per bundle
// ever asked for stayed for the process's life. refs is counted under
// c.mu, so a newcomer finds the lock others wait for, never a second one
// beside it.
func (c *Cache) lock(ctx context.Context, sha string) (unlock func(), err error) {
	c.mu.Lock()
	l, ok := c.locks[sha]
	if !ok {
		l = &shaLock{held: make(chan struct{}, 1)}
		c.locks[sha] = l
	}
	l.refs++
	c.mu.Unlock()
	letGo := func() {
		c.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(c.locks, sha)
		}
		c.mu.Unlock()
	}
	select {
	case l.held <- struct{}{}:
	case <-ctx.Done():
		letGo()
		return nil, ctx.Err()
	}
	return func() {
		<-l.held
		letGo()
	}, nil
}

// Verify unpacks a bundle into a scratch directory under the cache and
// returns it with its manifest, for checks before a deploy is accepted
// (its files neither hashed nor synced yet: Adopt does that). The caller
// removes the directory. check (nil: none) is put the manifest as
// soon as it is read, and its error returned as it is, before any file is
// written: a bundle deployed under another name, or for a device the node
// lacks, is refused before its gigabytes of constants are unpacked.
func (c *Cache) Verify(r io.Reader, check func(*abi.Manifest) error) (string, *abi.Manifest, error) {
	work, err := mkdirShared(c.dir, ".verify-*")
	if err != nil {
		return "", nil, fmt.Errorf("bundle cache: %w", err)
	}
	m, err := unpack(r, work, c.maxUnpacked, c.WriteFault, abi.ParseManifest, check)
	if err != nil {
		os.RemoveAll(work)
		return "", nil, err
	}
	return work, m, nil
}

// Adopt moves a directory that Verify produced for a bundle whose sha256 the
// caller computed into the cache, so a deploy's first invoke needs no fetch.
// It is a no-op if the cache already has that bundle.
func (c *Cache) Adopt(work, sha string) {
	if !ValidDigest(sha) {
		return
	}
	var aside []string
	defer func() { c.removeAll(aside) }()          // after the lock below is let go (defers run last first)
	unlock, _ := c.lock(context.Background(), sha) // no context: never fails
	defer unlock()                                 // let go on every path, a panic's too
	dir := filepath.Join(c.dir, sha)
	// Hashed and synced here, not by Verify: a bundle the deploy's checks
	// refuse costs no hashing of its files nor syncing them to the disk.
	// Its stamps are read at its first Get.
	_, err := writeSums(work)
	var size int64
	if err == nil {
		size, _, err = dirSize(work) // before the rename: use cannot fail after it
	}
	if err == nil {
		err = os.Rename(work, dir)
	}
	if err != nil {
		// The first Get fetches it. Removed once sha's lock is let go: a
		// bundle deployed again is a copy of gigabytes, which would hold
		// up every request for it meanwhile.
		aside = append(aside, work)
		return
	}
	syncDir(c.dir)
	c.keep(sha, nil) // any kept were of files no longer there: read the new ones
	c.use(sha, dir, size)
	c.Release(sha)
}

// mkdirShared is os.MkdirTemp with the directory searchable by others: a
// worker running as an unprivileged user opens its bundle's files through
// a directory descriptor the server hands it, which needs that right (the
// cache's parent directories may still be private).
func mkdirShared(parent, pattern string) (string, error) {
	dir, err := os.MkdirTemp(parent, pattern)
	if err == nil {
		if err = os.Chmod(dir, 0o755); err != nil {
			os.RemoveAll(dir)
		}
	}
	return dir, err
}
