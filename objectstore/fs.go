package objectstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/fileutil"
)

// ErrStoreGone is returned (wrapped, a 503) when a file store's directory
// is not there, or one of its top directories (functions/, bundles/) that
// the store had: its volume unmounted, or it was deleted or moved. It is
// the store's trouble, as ErrNoBucket is an S3 store's, never objects
// missing: a node that read it as an empty listing unloaded every
// function.
var ErrStoreGone = errors.New("the file store's directory is gone (its volume unmounted, or deleted or moved)")

// FS stores objects as files under a root directory.
type FS struct {
	root string
	mu   sync.Mutex
	// had holds the top directories this process found or made, true
	// where their marker (hadName) was written (tried once a process):
	// the store never removes a directory, so one of them missing now was
	// taken away (lost).
	had map[string]bool
}

// NewFS opens (creating if needed) a filesystem store rooted at dir.
func NewFS(dir string) (*FS, error) {
	if dir == "" {
		return nil, errors.New("filesystem store: empty directory")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("filesystem store %s: %w", dir, err)
	}
	if err := fileutil.MkdirAllDurable(abs, 0o755); err != nil { // its first write's durability rests on it
		return nil, fmt.Errorf("filesystem store: %w", err)
	}
	return &FS{root: abs, had: map[string]bool{}}, nil
}

func (s *FS) String() string { return "file://" + s.root }

func (s *FS) path(key string) (string, error) {
	if err := CheckKey(key); err != nil {
		return "", err
	}
	return filepath.Join(s.root, filepath.FromSlash(key)), nil
}

// Put writes under the key's lock where it has one (a record, which
// conditional writes lock), as Delete does: a write that came between a
// PutIf's check and its rename would be lost to it unseen, and two
// writes reading one mtime floor could stamp alike.
func (s *FS) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	p, err := s.path(key)
	if err != nil {
		return err
	}
	if _, err := os.Stat(lockName(p)); err == nil {
		unlock, err := s.lockKey(ctx, p)
		if err != nil {
			return fmt.Errorf("put %s: %w", key, err)
		}
		defer unlock()
	}
	return s.write(ctx, key, p, r, size)
}

// write puts r's bytes at p through a temporary file, a rename and an
// fsync of the directory, so the object survives a crash once Put returns.
func (s *FS) write(ctx context.Context, key, p string, r io.Reader, size int64) error {
	// Durably: the directory's sync below keeps the object's entry, not
	// the directory's own (functions/, bundles/ at a store's first write).
	if err := s.makeDir(key, p); err != nil {
		return err
	}
	var stamped time.Time
	// ".put-" names a half-written object: CleanTemp removes such files.
	err := fileutil.Replace(p, ".put-*", 0, func(f *os.File) error {
		n, err := io.Copy(f, ctxReader{ctx, r})
		if err == nil && size >= 0 && n != size {
			err = fmt.Errorf("got %d bytes, expected %d", n, size)
		}
		if err == nil {
			stamped, err = later(f, p)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	raiseFloor(p, stamped)
	return nil
}

// A key that conditional writes have locked (a record: PutIf, Delete) keeps
// its versions' mtimes rising, so that no version's tag is an earlier
// one's, the deleted ones' included: a rename or an unlink frees the old
// inode, which a later write may get again, and with the same size within
// one tick of a coarse clock (ext4 stamps at the kernel's tick; some
// mounts at a second or two) the tag would repeat, and a PutIf made on a
// stale read would pass (ABA), writing over a newer version. The key's
// lock file, which is never removed, keeps the floor (its mtime) across a
// delete. Other keys (bundles, named by their bytes) keep what the clock
// stamps: a bundle's mtime is its age for gc, which a floor carried from
// a clock ahead would postpone.

// later gives f, the next version of the file at p, an mtime after its
// key's floor (its lock file's mtime, and the version it replaces) and
// returns the mtime f has; the zero time where the key has no lock file.
// A mount that keeps none of the steps keeps what it stamped.
func later(f *os.File, p string) (time.Time, error) {
	lock, err := os.Stat(lockName(p))
	if err != nil {
		return time.Time{}, nil // never locked (or none this write can see)
	}
	floor := lock.ModTime()
	if prev, err := os.Stat(p); err == nil && prev.ModTime().After(floor) {
		floor = prev.ModTime()
	}
	cur, err := f.Stat()
	for _, step := range []time.Duration{time.Microsecond, time.Millisecond, time.Second, 2 * time.Second} {
		if err != nil || cur.ModTime().After(floor) {
			break
		}
		t := floor.Add(step)
		if err = os.Chtimes(f.Name(), t, t); err == nil {
			cur, err = f.Stat()
		}
	}
	if err != nil {
		return time.Time{}, err
	}
	return cur.ModTime(), nil
}

// raiseFloor makes t the floor of p's key where it is above it (the zero
// time: none). A floor not raised (the lock file gone, a mount refusing)
// leaves the next write above the version it replaces only.
func raiseFloor(p string, t time.Time) {
	if t.IsZero() {
		return
	}
	name := lockName(p)
	if lock, err := os.Stat(name); err == nil && lock.ModTime().Before(t) {
		_ = os.Chtimes(name, t, t)
	}
}

// lockName is the lock file of the object at p (lockKey).
func lockName(p string) string { return filepath.Join(filepath.Dir(p), ".lock-"+filepath.Base(p)) }

// fsTag is a file's version tag: a rename (every write) gives a new inode.
func fsTag(fi fs.FileInfo) string {
	var ino uint64
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		ino = st.Ino
	}
	return tag(ino, fi.Size(), fi.ModTime())
}

// tag is the version tag of a file of inode ino, size and mtime: List
// builds it from a stat of its own, and it must equal fsTag's for the
// same file (a node compares the two).
func tag(ino uint64, size int64, mtime time.Time) string {
	b := make([]byte, 0, 48)
	b = strconv.AppendUint(b, ino, 16)
	b = append(b, '-')
	b = strconv.AppendInt(b, size, 16)
	b = append(b, '-')
	b = strconv.AppendInt(b, mtime.UnixNano(), 16)
	return string(b)
}

func (s *FS) GetTagged(ctx context.Context, key string) (io.ReadCloser, Info, error) {
	rc, err := s.Get(ctx, key)
	if err != nil {
		return nil, Info{}, err
	}
	fi, err := rc.(*os.File).Stat()
	if err != nil {
		rc.Close()
		return nil, Info{}, fmt.Errorf("get %s: %w", key, err)
	}
	return rc, Info{Key: key, Size: fi.Size(), ModTime: fi.ModTime(), ETag: fsTag(fi)}, nil
}

// PutIf holds an exclusive lock on a lock file beside the object (flock,
// so other processes writing the same store wait too) while it checks the
// condition and writes.
func (s *FS) PutIf(ctx context.Context, key string, r io.Reader, size int64, ifMatch string) error {
	p, err := s.path(key)
	if err != nil {
		return err
	}
	if err := s.makeDir(key, p); err != nil { // as write's
		return err
	}
	unlock, err := s.lockKey(ctx, p)
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	defer unlock()
	fi, err := os.Stat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if ifMatch != "" {
			return fmt.Errorf("put %s: it no longer exists: %w", key, ErrPrecondition)
		}
	case err != nil:
		return fmt.Errorf("put %s: %w", key, err)
	case ifMatch == "" || fsTag(fi) != ifMatch:
		return fmt.Errorf("put %s: %w", key, ErrPrecondition)
	}
	return s.write(ctx, key, p, r, size)
}

func (s *FS) Touch(ctx context.Context, key string) error {
	p, err := s.path(key)
	if err != nil {
		return err
	}
	// A key that names a directory (a prefix of other keys) or crosses
	// an object is no object, as in S3: nothing to touch.
	if fi, err := os.Stat(p); noDir(err) || (err == nil && !fi.Mode().IsRegular()) {
		return s.absent("touch", key)
	}
	now := time.Now()
	if err := os.Chtimes(p, now, now); err != nil {
		if noDir(err) {
			return s.absent("touch", key)
		}
		return fmt.Errorf("touch %s: %w", key, err)
	}
	return nil
}

// CleanTemp removes the temporary files of writes older than age: leftovers
// of a process that died mid-write (a live write is younger). Lock files
// stay: removing one while it is held would let two writers in.
func (s *FS) CleanTemp(age time.Duration) ([]string, error) {
	var removed []string
	// The root with a trailing slash: a root behind a link (a store moved
	// to a larger disk) is walked as the directory it leads to, where the
	// walk's lstat took the link for a file and removed nothing. Not
	// resolved once and for all: a link such as /proc/PID/root names
	// another process's mounts, which resolving would leave.
	err := filepath.WalkDir(s.root+string(filepath.Separator), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if !strings.HasPrefix(d.Name(), ".put-") {
			return nil
		}
		if fi, err := d.Info(); err == nil && time.Since(fi.ModTime()) > age {
			if os.Remove(p) == nil {
				removed = append(removed, p)
			}
		}
		return nil
	})
	return removed, err
}

func (s *FS) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	p, err := s.path(key)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if noDir(err) { // absent, or "a/b" while "a" is an object: none, as in S3
		return nil, s.absent("get", key)
	}
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	// A key that names a directory (a prefix of other keys) is no object,
	// as in S3.
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("get %s: %w", key, err)
		}
		return nil, fmt.Errorf("get %s: %w", key, ErrNotFound)
	}
	return f, nil
}

func (s *FS) Stat(ctx context.Context, key string) (Info, error) {
	p, err := s.path(key)
	if err != nil {
		return Info{}, err
	}
	fi, err := os.Stat(p)
	if noDir(err) {
		return Info{}, s.absent("stat", key)
	}
	if err == nil && !fi.Mode().IsRegular() {
		return Info{}, fmt.Errorf("stat %s: %w", key, ErrNotFound)
	}
	if err != nil {
		return Info{}, fmt.Errorf("stat %s: %w", key, err)
	}
	return Info{Key: key, Size: fi.Size(), ModTime: fi.ModTime(), ETag: fsTag(fi)}, nil
}

// List reads only the directories keys with prefix can be in, starting at
// the one the prefix names up to its last "/", and stats each entry
// relative to its directory: a node lists functions/ on every poll and
// every GET /v1/functions, and walking the whole store (every bundle
// too) and stating each record by its full path was most of a listing's
// cost with 1,000 functions. That directory missing is an empty listing
// only where the store never had it (lost).
func (s *FS) List(ctx context.Context, prefix string) ([]Info, error) {
	var out []Info
	dir := strings.TrimSuffix(prefix[:strings.LastIndex(prefix, "/")+1], "/")
	if dir != "" && CheckKey(dir) != nil {
		return nil, nil // no key has the prefix (and ".." must not leave the root)
	}
	err := s.listDir(ctx, dir, prefix, &out)
	if noDir(err) {
		if err := s.lost(fmt.Sprintf("list %q", prefix), dir); err != nil {
			return nil, err
		}
		return nil, nil // no key has the prefix
	}
	if err != nil {
		return nil, fmt.Errorf("list %q: %w", prefix, err)
	}
	s.found(topDir(dir))
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// makeDir makes the directory of key's object at p, unless the store's
// directory it goes in is gone (lost): a write then made the store anew
// where it was, and the next listing showed only what it wrote.
func (s *FS) makeDir(key, p string) error {
	dir := keyDir(key)
	if err := s.lost("put "+key, dir); err != nil {
		return err
	}
	if err := fileutil.MkdirAllDurable(filepath.Dir(p), 0o755); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	s.found(topDir(dir))
	return nil
}

// absent is op's error for key, not there: ErrNotFound, unless the
// store's directory that would hold it is gone (lost).
func (s *FS) absent(op, key string) error {
	if err := s.lost(op+" "+key, keyDir(key)); err != nil {
		return err
	}
	return fmt.Errorf("%s %s: %w", op, key, ErrNotFound)
}

// lost is the error of what (an operation on a key or prefix) where dir,
// the directory of keys it reads or writes, or one above it, is not there
// and that is the store's directory gone (ErrStoreGone, a 503) rather
// than no key there: the root missing (the store made it when opened and
// never removes it), or dir's top directory (functions, bundles) missing
// though the store had it, as this process found or its marker says (the
// store never removes a directory either). An empty store, never written,
// has no marker: its missing functions/ is no key there. nil where
// nothing is lost.
func (s *FS) lost(what, dir string) error {
	fi, err := os.Stat(s.root)
	if err == nil && !fi.IsDir() {
		err = &fs.PathError{Op: "stat", Path: s.root, Err: syscall.ENOTDIR}
	}
	if err != nil {
		return errdefs.New(errdefs.KindUnavailable, goneCause(err),
			"%s: file store %s is not there (nothing it held is taken as deleted): restore it; a server started again begins an empty store there", what, s.root)
	}
	top := topDir(dir)
	if top == "" {
		return nil
	}
	p := filepath.Join(s.root, top)
	if _, err = os.Stat(p); !noDir(err) {
		return nil
	}
	s.mu.Lock()
	_, had := s.had[top]
	s.mu.Unlock()
	if !had {
		if _, merr := os.Lstat(s.hadName(top)); merr != nil {
			return nil
		}
	}
	return errdefs.New(errdefs.KindUnavailable, goneCause(err),
		"%s: file store %s: its %s/ is not there, though the store had it (nothing it held is taken as deleted): restore it, or make it an empty directory to begin without what it held", what, s.root, top)
}

// goneCause is ErrStoreGone for err, the stat that found a directory
// missing, keeping its path error (a client is told its operation and
// reason, the log its path) but not its errno: "no such file or
// directory" alone told a client an object was missing.
func goneCause(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return &fs.PathError{Op: pe.Op, Path: pe.Path, Err: fmt.Errorf("%w: %v", ErrStoreGone, pe.Err)}
	}
	return fmt.Errorf("%w: %v", ErrStoreGone, err)
}

// found records that the store has top, a top directory ("": none), and
// writes its marker, once a process where it can (a read-only store
// keeps the memory alone): a process started after it went tells it
// from one never made.
func (s *FS) found(top string) {
	if top == "" {
		return
	}
	s.mu.Lock()
	_, tried := s.had[top]
	s.mu.Unlock()
	if tried { // once a process: on a store it cannot write, not at every call
		return
	}
	f, err := os.OpenFile(s.hadName(top), os.O_WRONLY|os.O_CREATE, 0o644)
	if err == nil {
		err = f.Close()
	}
	s.mu.Lock()
	s.had[top] = s.had[top] || err == nil
	s.mu.Unlock()
}

// hadName is the marker of top directory top: its name starts with "."
// as no key's does.
func (s *FS) hadName(top string) string { return filepath.Join(s.root, ".had-"+top) }

// keyDir is the directory of keys key is in ("" for the root's).
func keyDir(key string) string {
	if i := strings.LastIndexByte(key, '/'); i >= 0 {
		return key[:i]
	}
	return ""
}

// topDir is the top directory of dir, a directory of keys ("" for the
// root).
func topDir(dir string) string {
	top, _, _ := strings.Cut(dir, "/")
	return top
}

// noDir is whether err says a directory is not there (any more): missing,
// or a file.
func noDir(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)
}

// listDir adds the objects under rel (a key prefix without its trailing
// "/", "" for the root) whose keys have prefix to out.
func (s *FS) listDir(ctx context.Context, rel, prefix string, out *[]Info) error {
	d, err := os.Open(filepath.Join(s.root, filepath.FromSlash(rel)))
	if err != nil {
		return err
	}
	defer d.Close()
	ents, err := d.ReadDir(-1)
	if err != nil {
		return err
	}
	raw, err := d.SyscallConn()
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := ctx.Err(); err != nil {
			return err
		}
		name := e.Name()
		key := name
		if rel != "" {
			key = rel + "/" + name
		}
		if e.IsDir() {
			// Only directories whose keys can have the prefix.
			if sub := key + "/"; strings.HasPrefix(sub, prefix) || strings.HasPrefix(prefix, sub) {
				if err := s.listDir(ctx, key, prefix, out); err != nil && !noDir(err) {
					return err // gone since read is not an error
				}
			}
			continue
		}
		// Temporary and lock files start with "." and are no keys.
		if !strings.HasPrefix(key, prefix) || CheckKey(key) != nil {
			continue
		}
		var st unix.Stat_t
		var serr error
		if err := raw.Control(func(fd uintptr) {
			// Followed, as Stat and Get follow a link: the tags must agree.
			serr = unix.Fstatat(int(fd), name, &st, 0)
		}); err != nil {
			return err
		}
		if errors.Is(serr, unix.ENOENT) || errors.Is(serr, unix.ELOOP) || errors.Is(serr, unix.ENOTDIR) || errors.Is(serr, unix.EACCES) {
			// Deleted since the directory was read, or a link that leads
			// nowhere Get could read (dangling, a loop, through a file or
			// a directory closed to the server): no object, and no reason
			// to fail the listing of every other.
			continue
		}
		if serr != nil {
			return &fs.PathError{Op: "stat", Path: filepath.Join(s.root, filepath.FromSlash(key)), Err: serr}
		}
		if st.Mode&unix.S_IFMT != unix.S_IFREG {
			continue // a link to a directory, a FIFO: no object, as Get says
		}
		mtime := time.Unix(st.Mtim.Unix())
		*out = append(*out, Info{Key: key, Size: st.Size, ModTime: mtime, ETag: tag(st.Ino, st.Size, mtime)})
	}
	return nil
}

func (s *FS) Delete(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("delete %s: %w", key, err) // as S3's client: no request once ctx has ended
	}
	p, err := s.path(key)
	if err != nil {
		return err
	}
	// Under the key's lock when it has one (a record), so that a
	// conditional write that checked the old object cannot rename it back.
	if _, err := os.Stat(lockName(p)); err == nil {
		unlock, err := s.lockKey(ctx, p)
		if err != nil {
			return fmt.Errorf("delete %s: %w", key, err)
		}
		defer unlock()
		if fi, err := os.Stat(p); err == nil {
			raiseFloor(p, fi.ModTime()) // a version written again after it follows it
		}
	}
	// unlink, not os.Remove: a directory is never removed (a Put may be
	// about to write in it).
	err = unix.Unlink(p)
	if noDir(err) {
		if err := s.lost("delete "+key, keyDir(key)); err != nil {
			return err
		}
	}
	if err != nil && !noDir(err) {
		if fi, lerr := os.Lstat(p); lerr == nil && fi.IsDir() {
			return nil // a prefix of other keys names no object, as in S3
		}
		return fmt.Errorf("delete %s: %w", key, &fs.PathError{Op: "unlink", Path: p, Err: err})
	}
	if err == nil {
		// A delete answered is one a crash does not take back: a deleted
		// record brought back would be a function deleted coming back.
		if err := fileutil.SyncDir(filepath.Dir(p)); err != nil {
			return fmt.Errorf("delete %s: removed, but not durably (a crash may bring it back): %w", key, err)
		}
	}
	return nil
}
