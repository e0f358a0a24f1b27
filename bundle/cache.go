package bundle

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/objectstore"
)

// Cache holds unpacked bundles on this node, one directory per sha256. A
// directory appears only by an atomic rename after its bundle was verified
// and unpacked, so a present directory is complete.
type Cache struct {
	dir         string
	maxUnpacked int64

	mu    sync.Mutex
	locks map[string]*sync.Mutex
}

// NewCache opens a bundle cache under dir.
func NewCache(dir string, maxUnpacked int64) (*Cache, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("bundle cache: %w", err)
	}
	if maxUnpacked <= 0 {
		maxUnpacked = DefaultMaxUnpacked
	}
	return &Cache{dir: dir, maxUnpacked: maxUnpacked, locks: map[string]*sync.Mutex{}}, nil
}

// FetchError is a failure to read a bundle from the store (an outage, a
// missing object), as opposed to a bundle that was read and refused.
type FetchError struct{ Err error }

func (e *FetchError) Error() string { return "fetch bundle: " + e.Err.Error() }
func (e *FetchError) Unwrap() error { return e.Err }

// Get returns the unpacked directory and manifest of bundle sha, fetching,
// verifying and unpacking it from store if this node does not have it yet;
// fetched says whether it did.
func (c *Cache) Get(ctx context.Context, store objectstore.Store, sha string) (dir string, m *abi.Manifest, fetched bool, err error) {
	if !ValidDigest(sha) {
		return "", nil, false, refuse("invalid sha256 %q", sha)
	}
	lock := c.lock(sha)
	lock.Lock()
	defer lock.Unlock()
	dir = filepath.Join(c.dir, sha)
	if m, err := ReadManifest(dir); err == nil {
		return dir, m, false, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", nil, false, fmt.Errorf("cached bundle %s: %w", sha, err)
	}
	m, err = c.fetch(ctx, store, sha, dir)
	if err != nil {
		return "", nil, true, err
	}
	return dir, m, true, nil
}

func (c *Cache) lock(sha string) *sync.Mutex {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.locks[sha]
	if !ok {
		l = &sync.Mutex{}
		c.locks[sha] = l
	}
	return l
}

func (c *Cache) fetch(ctx context.Context, store objectstore.Store, sha, dir string) (*abi.Manifest, error) {
	rc, err := store.Get(ctx, ObjectKey(sha))
	if err != nil {
		return nil, &FetchError{Err: err}
	}
	defer rc.Close()
	tmp, err := os.CreateTemp(c.dir, ".fetch-*")
	if err != nil {
		return nil, fmt.Errorf("bundle cache: %w", err)
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(rc, c.maxUnpacked+1))
	if err != nil {
		return nil, &FetchError{Err: err}
	}
	if n > c.maxUnpacked {
		return nil, refuse("object %s is larger than %d bytes", ObjectKey(sha), c.maxUnpacked)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != sha {
		return nil, refuse("sha256 mismatch for %s: content hashes to %s", ObjectKey(sha), got)
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("bundle cache: %w", err)
	}
	return c.unpackInto(tmp, dir)
}

// unpackInto unpacks r into a temporary sibling of dir, then renames it into
// place.
func (c *Cache) unpackInto(r io.Reader, dir string) (*abi.Manifest, error) {
	work, err := os.MkdirTemp(c.dir, ".unpack-*")
	if err != nil {
		return nil, fmt.Errorf("bundle cache: %w", err)
	}
	m, err := Unpack(r, work, c.maxUnpacked)
	if err == nil {
		err = os.Rename(work, dir)
	}
	if err != nil {
		os.RemoveAll(work)
		return nil, err
	}
	return m, nil
}

// Verify unpacks a bundle into a scratch directory under the cache and
// returns it with its manifest, for checks before a deploy is accepted. The
// caller removes the directory.
func (c *Cache) Verify(r io.Reader) (string, *abi.Manifest, error) {
	work, err := os.MkdirTemp(c.dir, ".verify-*")
	if err != nil {
		return "", nil, fmt.Errorf("bundle cache: %w", err)
	}
	m, err := Unpack(r, work, c.maxUnpacked)
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
	lock := c.lock(sha)
	lock.Lock()
	defer lock.Unlock()
	if err := os.Rename(work, filepath.Join(c.dir, sha)); err != nil {
		os.RemoveAll(work)
	}
}
