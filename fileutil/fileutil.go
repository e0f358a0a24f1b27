// Package fileutil holds the file copies the worker's stage, plover build
// and the benchmark suite share, and the writer that tells a failed write
// from a failed read in a copy (the deploy spool, the bundle cache), a
// small file's atomic replacement (WriteAtomic), and directories made and
// synced durably (SyncDir, MkdirAllDurable).
package fileutil

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"iter"
	"os"
	"path/filepath"
	"sync"
	"syscall"
)

// Copy copies regular file src to a new file dst. A dst already there is
// refused, never replaced nor written through: in a worker's stage, a
// process of the worker's user could have planted a link there.
func Copy(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(dst) // ours (O_EXCL made it): no part of a copy stays
	}
	return err
}

// LinkOrCopy makes dst the file src: a hard link where both are on one
// file system, a copy otherwise. A dst already there is replaced, never
// written through (it may be a link to another file); one that is src
// already (the same path, a hard link of it) is left, as removing it
// first removed src.
func LinkOrCopy(src, dst string) error {
	if si, err := os.Stat(src); err == nil {
		if di, err := os.Lstat(dst); err == nil && os.SameFile(si, di) {
			return nil
		}
	}
	if err := os.Remove(dst); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	err := os.Link(src, dst)
	if err == nil || errors.Is(err, os.ErrExist) {
		return err // something put there meanwhile: not ours to replace
	}
	return Copy(src, dst) // another file system, or one without (more) hard links
}

// Writer passes writes on to W and keeps the first that failed in Err:
// after io.Copy it tells a failure of the writing side (this node's disk,
// full) from one of the reader (a client, a store).
type Writer struct {
	W   io.Writer
	Err error
}

func (w *Writer) Write(p []byte) (int, error) {
	n, err := w.W.Write(p)
	if err != nil && w.Err == nil {
		w.Err = err
	}
	return n, err
}

// WriteAtomic replaces path with b whole, at perm (Replace).
func WriteAtomic(path string, b []byte, perm os.FileMode) error {
	return Replace(path, TempPattern(path), perm, func(f *os.File) error {
		_, err := f.Write(b)
		return err
	})
}

// TempPattern is the os.CreateTemp pattern of WriteAtomic's temporary
// files beside path: hidden, named for it.
func TempPattern(path string) string { return "." + filepath.Base(path) + ".tmp-*" }

// Replace replaces path with what fill writes: to a temporary file beside
// it named by pattern (os.CreateTemp's), synced, at perm (0: CreateTemp's
// 0600), renamed over it and the directory synced, so that a crash leaves
// the old file or the new one, never a torn one. A failure after the
// rename is ErrNotDurable; a directory sync the file system does not do
// (EINVAL, ENOTSUP: some FUSE and network mounts) is not one.
func Replace(path, pattern string, perm os.FileMode, fill func(*os.File) error) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), pattern)
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	err = fill(tmp)
	if err == nil && perm != 0 {
		err = tmp.Chmod(perm)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return err
	}
	if err := SyncDir(filepath.Dir(path)); err != nil {
		return fmt.Errorf("%w: %w", ErrNotDurable, err)
	}
	return nil
}

// SyncDir syncs directory dir, making durable the changes to its entries
// (a rename, an unlink, a directory made). A file system that does not
// sync directories (EINVAL, ENOTSUP: some FUSE and network mounts) is no
// failure: how durable its entries are is the mount's own.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	err = syncDir(d)
	if err == nil || errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOTSUP) {
		return nil
	}
	return err
}

// MkdirAllDurable is os.MkdirAll that also syncs the parent of each
// directory it makes, so that a crash cannot take back a directory, and
// with it a file made durable in it (Replace syncs the file's own
// directory, not the entry that makes that directory visible). A
// directory already there costs a stat and no sync.
//
// Where a sync fails, the directories it made are removed again, those
// still empty, so that the next call makes them and syncs again instead
// of finding them there and taking them as durable. A call that finds its
// directory, or one above it, being made by another call in this process
// waits until that call's syncs end, and looks again: where they failed,
// it makes and syncs the directory itself. What is left: a directory
// another process made and has not synced yet is taken as it is (a write
// into it may be acknowledged before that sync, or fail where that
// process's sync failed and it removed the directory), and so is one this
// process makes by another path (through a symbolic link) or other than
// through MkdirAllDurable, and one a MkdirAll that failed partway made
// and left. The wait takes no context: it lasts as long as the other
// call's mkdirs and syncs.
func MkdirAllDurable(dir string, perm os.FileMode) error {
	dir = filepath.Clean(dir)
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs // a relative spelling is still the directory another call makes
	}
	for {
		seen := makes.generation()
		fi, err := os.Stat(dir)
		present := err == nil && fi.IsDir()
		var absent []string
		if !present {
			absent = missing(dir)
		}
		m, busy := makes.claim(dir, absent, seen)
		switch {
		case busy != nil:
			awaitMaker(busy)
		case m != nil:
			return makes.made(m, dir, perm, absent)
		case present:
			return nil
		default:
			return os.MkdirAll(dir, perm) // nothing missing: it says what is in the way
		}
	}
}

// missing is what MkdirAll will make of dir, the deepest first.
func missing(dir string) []string {
	var absent []string
	for d := range upFrom(dir) {
		if _, err := os.Lstat(d); !errors.Is(err, fs.ErrNotExist) {
			break // there, or unreadable: MkdirAll says which
		}
		absent = append(absent, d)
	}
	return absent
}

// mkdirSynced makes dir and syncs the parent of each of made, removing
// made again where a sync fails.
func mkdirSynced(dir string, perm os.FileMode, made []string) error {
	if err := os.MkdirAll(dir, perm); err != nil {
		return err
	}
	for _, d := range made {
		if err := SyncDir(filepath.Dir(d)); err != nil {
			for _, d := range made {
				os.Remove(d) // fails, harmlessly, on one that holds something
			}
			return err
		}
	}
	return nil
}

// upFrom yields dir, then each directory above it up to the root.
func upFrom(dir string) iter.Seq[string] {
	return func(yield func(string) bool) {
		for {
			if !yield(dir) {
				return
			}
			up := filepath.Dir(dir)
			if up == dir {
				return
			}
			dir = up
		}
	}
}

// makes holds the directories this process's MkdirAllDurable calls have
// claimed and not yet synced.
var makes = registry{pending: map[string]*making{}}

// registry's lock guards the map and the count alone: the mkdirs and
// syncs run outside it, each making's done channel telling its waiters
// when they have ended.
type registry struct {
	mu sync.Mutex
	// pending is keyed by the topmost directory a call makes: every other
	// one it makes is below it, on the way to the directory asked for.
	pending map[string]*making
	// failed counts the makes that failed, and may have removed what they
	// made. A call that saw a directory there and finds no making of it
	// pending cannot tell one that synced from one that failed and
	// removed the directory after the stat; the count moved says the
	// latter may have happened, and to look again.
	failed uint64
}

type making struct {
	top  string
	done chan struct{} // closed once the syncs have ended, either way
}

// lookAgain is a wait that is already over: a claim made on a stale
// look at the disk is retried at once.
var lookAgain = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// awaitMaker waits for another call's making to end (tests watch it).
var awaitMaker = func(done <-chan struct{}) { <-done }

func (r *registry) generation() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

// claim decides for a call that looked at the disk while r.failed was
// seen, and found absent (the directories missing) of dir: it is to wait on the channel
// returned (a making of dir or of one above it is pending, or a make
// failed since the look), to make absent under the making returned, or,
// with neither, to make nothing of its own.
func (r *registry) claim(dir string, absent []string, seen uint64) (*making, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failed != seen {
		return nil, lookAgain
	}
	for d := range upFrom(dir) {
		if m := r.pending[d]; m != nil {
			return nil, m.done
		}
	}
	if len(absent) == 0 {
		return nil, nil
	}
	m := &making{top: absent[len(absent)-1], done: make(chan struct{})}
	r.pending[m.top] = m
	return m, nil
}

// made makes absent under m, the claim of this call, and settles it, as
// failed should the making panic: a claim left pending would hold every
// later call for dir, or below it, for good.
func (r *registry) made(m *making, dir string, perm os.FileMode, absent []string) error {
	settled := false
	defer func() {
		if !settled {
			r.settle(m, errMakePanicked)
		}
	}()
	err := mkdirSynced(dir, perm, absent)
	settled = true
	return r.settle(m, err)
}

var errMakePanicked = errors.New("making the directories panicked")

// settle ends m with err, which it returns. A failed make counts before
// its waiters wake, so that one which saw its directory before the
// removal does not take it as there.
func (r *registry) settle(m *making, err error) error {
	r.mu.Lock()
	delete(r.pending, m.top)
	if err != nil {
		r.failed++
	}
	r.mu.Unlock()
	close(m.done)
	return err
}

// ErrNotDurable is a Replace that failed after its rename: the file
// holds the new bytes, but a crash may bring the old ones back. A caller
// remembering what the file says knows it no more.
var ErrNotDurable = errors.New("replaced, but not durably")

// syncDir syncs a directory (tests fail it).
var syncDir = (*os.File).Sync
