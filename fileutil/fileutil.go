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
	"os"
	"path/filepath"
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
	return Replace(path, "."+filepath.Base(path)+".tmp-*", perm, func(f *os.File) error {
		_, err := f.Write(b)
		return err
	})
}

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
// of finding them there and taking them as durable. A directory another
// call made just before (in this process or another) and has not synced
// yet is taken as it is: a write into it may be acknowledged before that
// sync, or fail where that call's sync failed and it removed the
// directory (helper-383's LOW, left: a lock here would be held across the
// syncs).
func MkdirAllDurable(dir string, perm os.FileMode) error {
	if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
		return nil
	}
	var made []string // what MkdirAll will make, the deepest first
	for d := filepath.Clean(dir); ; {
		if _, err := os.Lstat(d); !errors.Is(err, fs.ErrNotExist) {
			break // there, or unreadable: MkdirAll says which
		}
		made = append(made, d)
		up := filepath.Dir(d)
		if up == d {
			break
		}
		d = up
	}
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

// ErrNotDurable is a Replace that failed after its rename: the file
// holds the new bytes, but a crash may bring the old ones back. A caller
// remembering what the file says knows it no more.
var ErrNotDurable = errors.New("replaced, but not durably")

// syncDir syncs a directory (tests fail it).
var syncDir = (*os.File).Sync
