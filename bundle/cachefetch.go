package bundle

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/fileutil"
	"github.com/plover-run/plover/objectstore"
)

// FetchTurns is how many bundles a node fetches and unpacks at once (Get),
// besides the deploys the engine lets unpack.
const FetchTurns = 2

// fullBackoff is how long a fetch of a bundle that found the disk full
// answers the next fetches of it at once (stillFull).
const fullBackoff = 5 * time.Second

// fullDisk is a fetch that found the disk full: its error, and the bytes
// it needed free.
type fullDisk struct {
	until time.Time
	need  int64
	err   error
}

// fetch reads bundle sha from store into dir, in one of the cache's
// turns; a directory in dir's way is set aside and added to aside, for the
// caller to remove once it let go of sha's lock. A disk too full for it
// has bundles not in use evicted for the room (makeRoom), and is tried
// once more.
func (c *Cache) fetch(ctx context.Context, store objectstore.Store, sha, dir string, aside *[]string) (*abi.Manifest, stamps, int64, error) {
	if err := c.stillFull(sha); err != nil {
		return nil, nil, 0, err
	}
	select {
	case c.fetches <- struct{}{}:
		defer func() { <-c.fetches }()
	case <-ctx.Done():
		return nil, nil, 0, &FetchError{Err: fmt.Errorf("waiting for a turn to fetch bundle %s (this node fetches and unpacks %d at once): %w", sha, FetchTurns, ctx.Err())}
	}
	tmp, packed, err := c.download(ctx, store, sha, aside)
	if err != nil {
		c.noteFull(sha, packed, err)
		return nil, nil, 0, err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	var m *abi.Manifest
	var st stamps
	size, err := c.twice(aside, func() (int64, error) {
		if _, err := tmp.Seek(0, io.SeekStart); err != nil {
			return 0, fmt.Errorf("bundle cache: %w", err)
		}
		var n int64
		var err error
		m, st, n, err = c.unpackInto(tmp, dir, aside)
		return n, err
	})
	if err != nil {
		err = &StageError{Stage: "unpacking", Err: err}
		c.noteFull(sha, packed+size, err) // the archive is removed before the next try
		return nil, nil, 0, err
	}
	c.noteFull(sha, 0, nil)
	return m, st, size, nil
}

// download fetches bundle sha's archive into a file of the cache, its
// hash checked, and returns it open at its start, with the bytes the
// store says it has. Its room on the disk is claimed (room) before any of
// it is read: a cold start on a disk too small for it was written until
// the disk was full, failing the node's other writers meanwhile, and read
// the whole object again at each request.
func (c *Cache) download(ctx context.Context, store objectstore.Store, sha string, aside *[]string) (*os.File, int64, error) {
	info, err := store.Stat(ctx, ObjectKey(sha))
	if err != nil {
		return nil, 0, &FetchError{Err: err}
	}
	if info.Size > c.MaxObject() {
		return nil, 0, refuse("object %s is larger than %d bytes", ObjectKey(sha), c.MaxObject())
	}
	var tmp *os.File
	_, err = c.twice(aside, func() (int64, error) {
		var err error
		tmp, err = c.downloadOnce(ctx, store, sha, info.Size)
		return info.Size, err
	})
	return tmp, info.Size, err
}

// downloadOnce is one try of download, size being the object's size.
func (c *Cache) downloadOnce(ctx context.Context, store objectstore.Store, sha string, size int64) (_ *os.File, err error) {
	tmp, err := os.CreateTemp(c.dir, ".fetch-*")
	if err != nil {
		return nil, &StageError{Stage: "fetching", Err: fmt.Errorf("bundle cache: %w", err)}
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	cl, err := room(tmp.Name(), size)
	if err != nil {
		return nil, &StageError{Stage: "fetching", Err: fmt.Errorf("bundle cache: %w", err)}
	}
	defer cl.done()
	rc, err := store.Get(ctx, ObjectKey(sha))
	if err != nil {
		return nil, &FetchError{Err: err}
	}
	defer rc.Close()
	h := sha256.New()
	sink := &fileutil.Writer{W: claimWriter{w: c.WriteFault.Wrap(tmp, tmp.Name()), cl: cl}}
	n, err := io.Copy(io.MultiWriter(sink, h), io.LimitReader(rc, c.MaxObject()+1))
	if sink.Err != nil {
		// This node's disk (full, most likely), not the store: the caller
		// must not report a store that is fine as the cause.
		return nil, &StageError{Stage: "fetching", Err: fmt.Errorf("bundle cache: %w", sink.Err)}
	}
	if err != nil {
		return nil, &FetchError{Err: err}
	}
	if n > c.MaxObject() {
		return nil, refuse("object %s is larger than %d bytes", ObjectKey(sha), c.MaxObject())
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != sha {
		return nil, refuse("sha256 mismatch for %s: content hashes to %s (the stored object is damaged: plover deploy --force of the same bundle stores it anew)", ObjectKey(sha), got)
	}
	return tmp, nil
}

// twice runs try, which returns the bytes it needs free where it finds the
// disk full, and runs it once more where makeRoom freed some.
func (c *Cache) twice(aside *[]string, try func() (int64, error)) (int64, error) {
	n, err := try()
	if isFull(err) && c.makeRoom(n, aside) {
		n, err = try()
	}
	return n, err
}

func isFull(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// makeRoom frees the cache's disk for a write of need bytes that found it
// full, and says whether it freed any of it: first the directories this
// Get set aside (a damaged copy of the bundle it fetches again, removed
// after the fetch where the disk has room), then bundles not in use, least
// recently used first, until the disk has need bytes free besides what
// other writes under way have claimed, or none is left. The cache's limit
// (--cache-limit, by default larger than many disks) alone evicted
// nothing while the disk was full, and every cold start failed until an
// operator emptied the cache. Removed here, under the bundle's lock: the
// next try needs the room, and the requests waiting for that lock wait
// for that try anyway; the cache's lock is let go first.
func (c *Cache) makeRoom(need int64, aside *[]string) bool {
	freed := len(*aside) > 0
	c.removeAll(*aside)
	*aside = nil
	short := need
	if free, _, ok := diskFree(c.dir); ok {
		short = need - (int64(free) - claimedOn(c.dir))
	}
	c.mu.Lock()
	gone, _ := c.evictIdleLocked(func(n int64) bool { return n >= short })
	c.mu.Unlock()
	c.removeAll(gone)
	return freed || len(gone) > 0
}

// claimedOn is what writes under way have claimed on dir's disk (room)
// and not written yet.
func claimedOn(dir string) int64 {
	_, fsid, ok := diskFree(dir)
	if !ok {
		return 0
	}
	unwritten.Lock()
	defer unwritten.Unlock()
	return unwritten.by[fsid]
}

// stillFull answers a fetch of sha at once with the full disk that a fetch
// of it found within fullBackoff, while the disk still lacks the room that
// one needed: a flood of cold requests for a bundle the disk cannot hold
// cost a download each (a GET per request, on S3), written until the disk
// was full, failing the node's other writers meanwhile. A bundle released
// (which may be evicted for the room now) ends every back-off.
func (c *Cache) stillFull(sha string) error {
	c.mu.Lock()
	f, ok := c.full[sha]
	c.mu.Unlock()
	if !ok {
		return nil
	}
	if c.clock().Before(f.until) {
		free, _, known := diskFree(c.dir)
		if !known || int64(free)-claimedOn(c.dir) < f.need {
			stage := "fetching"
			var se *StageError
			if errors.As(f.err, &se) {
				stage = se.Stage
			}
			return &StageError{Stage: stage, Err: fmt.Errorf("bundle %s is not fetched again for %s after its fetch found this node's disk full, unless %d bytes are free: %w", sha, fullBackoff, f.need, f.err)}
		}
	}
	c.mu.Lock()
	delete(c.full, sha)
	c.mu.Unlock()
	return nil
}

// noteFull starts sha's back-off where err is a full disk's (stillFull),
// needing need bytes free; any other outcome ends it.
func (c *Cache) noteFull(sha string, need int64, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !isFull(err) {
		delete(c.full, sha)
		return
	}
	now := c.clock()
	for k, f := range c.full { // bundles not asked for again: forgotten
		if !now.Before(f.until) {
			delete(c.full, k)
		}
	}
	if c.full == nil {
		c.full = map[string]fullDisk{}
	}
	c.full[sha] = fullDisk{until: now.Add(fullBackoff), need: need, err: err}
}

// unpackInto unpacks r into a temporary sibling of dir, stamped
// (stampUnpacked), then renames it into place; it returns the bytes the
// entry takes, counted before the rename (use cannot fail after it), or,
// where it found the disk full, at least the bytes it needs free (those it
// wrote, and the file it was refused room for). A directory in dir's way
// is set aside into aside (rename).
func (c *Cache) unpackInto(r io.Reader, dir string, aside *[]string) (*abi.Manifest, stamps, int64, error) {
	work, err := mkdirShared(c.dir, ".unpack-*")
	if err != nil {
		return nil, nil, 0, fmt.Errorf("bundle cache: %w", err)
	}
	m, err := unpack(r, work, c.maxUnpacked, c.WriteFault, abi.ParseStoredManifest, nil)
	var st stamps
	var size int64
	if err == nil {
		st, err = writeSums(work)
	}
	if err == nil {
		size, _, err = dirSize(work)
	}
	if err == nil {
		err = c.rename(work, dir, aside) // which keeps each file's stamp
	}
	if err != nil {
		var need int64
		if isFull(err) {
			need, _, _ = dirSize(work)
			if nr := (*noRoomError)(nil); errors.As(err, &nr) {
				need += nr.size
			}
		}
		os.RemoveAll(work)
		return nil, nil, need, err
	}
	// Best effort: the entry is complete in place, its files durable; were
	// the rename lost to a crash, the bundle would only be fetched again.
	// (Failed, the whole would leave a directory no entry records, where
	// every later fetch's rename would fail.)
	syncDir(c.dir)
	return m, st, size, nil
}

// rename moves work into place as dir, an entry no one holds (its sha's
// lock is held, and no entry records it): a directory found there is
// one no entry records (a discard whose rename failed, a copy put there
// by hand), set aside for the new one. Left, it would fail this rename,
// and every later fetch's, until a restart. The directory set aside is
// added to aside, not removed here: sha's lock is held, and a large one
// would hold up every request for the bundle while it went.
func (c *Cache) rename(work, dir string, aside *[]string) error {
	err := os.Rename(work, dir)
	if !errors.Is(err, syscall.ENOTEMPTY) && !errors.Is(err, syscall.EEXIST) {
		return err
	}
	gone, err := os.MkdirTemp(c.dir, ".evict-*")
	if err != nil {
		return fmt.Errorf("bundle cache: setting aside %s, which no entry records: %w", filepath.Base(dir), err)
	}
	*aside = append(*aside, gone) // empty, or holding dir: removed either way
	if err := os.Rename(dir, filepath.Join(gone, filepath.Base(dir))); err != nil {
		return fmt.Errorf("bundle cache: setting aside %s, which no entry records: %w", filepath.Base(dir), err)
	}
	return os.Rename(work, dir)
}
