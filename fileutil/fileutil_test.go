package fileutil

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/iotest"
	"time"
)

// LinkOrCopy gives dst src's bytes, linked on one file system, and replaces
// a dst that was there (a link to another file stays untouched).
func TestLinkOrCopy(t *testing.T) {
	dir := t.TempDir()
	src, other, dst := filepath.Join(dir, "src"), filepath.Join(dir, "other"), filepath.Join(dir, "dst")
	os.WriteFile(src, []byte("new"), 0o644)
	os.WriteFile(other, []byte("old"), 0o644)
	if err := os.Link(other, dst); err != nil {
		t.Fatal(err)
	}
	if err := LinkOrCopy(src, dst); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(dst); string(b) != "new" {
		t.Fatalf("dst %q", b)
	}
	if b, _ := os.ReadFile(other); string(b) != "old" {
		t.Fatalf("the file dst linked to was written through: %q", b)
	}
	si, _ := os.Stat(src)
	di, _ := os.Stat(dst)
	if !os.SameFile(si, di) {
		t.Error("same file system, but dst is not a link to src")
	}
	if err := Copy(src, filepath.Join(dir, "copy")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "copy")); string(b) != "new" {
		t.Fatalf("copy %q", b)
	}
	if err := LinkOrCopy(filepath.Join(dir, "missing"), dst); err == nil {
		t.Error("a missing src gave no error")
	}
}

// LinkOrCopy onto src itself (the same path by another name, or a hard
// link of it) leaves it: removing dst first removed src, and plover build
// with its output in its source directory lost the constants.
func TestLinkOrCopyOntoItself(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "constants.bin")
	os.WriteFile(src, []byte("ab"), 0o644)
	if err := os.Link(src, filepath.Join(dir, "linked")); err != nil {
		t.Fatal(err)
	}
	for _, dst := range []string{src, filepath.Join(dir, ".", "constants.bin"), filepath.Join(dir, "linked")} {
		if err := LinkOrCopy(src, dst); err != nil {
			t.Errorf("onto %s: %v", dst, err)
		}
		for _, p := range []string{src, dst} {
			if b, err := os.ReadFile(p); string(b) != "ab" {
				t.Fatalf("after LinkOrCopy onto %s, %s holds %q (%v)", dst, p, b, err)
			}
		}
	}
}

// Copy makes a new file or nothing: a dst already there (a file, a link
// planted to another file) is refused and left as it was, and a copy that
// fails midway leaves no part of itself.
func TestCopyMakesNewFilesOnly(t *testing.T) {
	dir := t.TempDir()
	src, target := filepath.Join(dir, "src"), filepath.Join(dir, "target")
	os.WriteFile(src, []byte("new"), 0o644)
	os.WriteFile(target, []byte("theirs"), 0o644)
	for _, tt := range []struct {
		name  string
		plant func(dst string) // nil: none
		from  string
		made  bool
	}{
		{"a new file", nil, src, true},
		{"a file there", func(dst string) { os.WriteFile(dst, []byte("old"), 0o644) }, src, false},
		{"a link planted there", func(dst string) { os.Symlink(target, dst) }, src, false},
		{"a source that fails to read", nil, dir, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "dst")
			if tt.plant != nil {
				tt.plant(dst)
			}
			before, _ := os.ReadFile(dst)
			err := Copy(tt.from, dst)
			after, rerr := os.ReadFile(dst)
			switch {
			case tt.made && (err != nil || string(after) != "new"):
				t.Fatalf("Copy: %v, dst %q; want a copy", err, after)
			case !tt.made && err == nil:
				t.Fatalf("Copy made %q, want a refusal", after)
			case !tt.made && tt.plant == nil && !errors.Is(rerr, os.ErrNotExist):
				t.Errorf("a failed copy left dst (%q)", after)
			case !tt.made && tt.plant != nil && string(after) != string(before):
				t.Errorf("dst was %q, is %q: written through", before, after)
			}
			if b, _ := os.ReadFile(target); string(b) != "theirs" {
				t.Errorf("the link's target now holds %q", b)
			}
		})
	}
}

// Writer keeps the first failure of its own writes, and only those: an
// io.Copy that fails reading leaves Err nil.
func TestWriterKeepsItsFailure(t *testing.T) {
	full := &Writer{W: failAfter{n: 3}}
	if _, err := io.Copy(full, strings.NewReader("abcdef")); err == nil || full.Err != errFull {
		t.Fatalf("copy into a full disk: %v, Err %v", err, full.Err)
	}
	ok := &Writer{W: io.Discard}
	if _, err := io.Copy(ok, iotest.ErrReader(errors.New("client went"))); err == nil || ok.Err != nil {
		t.Fatalf("a failed read: %v, Err %v (want nil)", err, ok.Err)
	}
}

var errFull = errors.New("no space left on device")

type failAfter struct{ n int }

func (f failAfter) Write(p []byte) (int, error) {
	if len(p) > f.n {
		return f.n, errFull
	}
	return len(p), nil
}

// WriteAtomic replaces a file whole with the mode asked, and leaves no
// temporary file beside it.
func TestWriteAtomic(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state.json")
	for _, b := range []string{"first", "second, longer"} {
		if err := WriteAtomic(p, []byte(b), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(p)
		fi, _ := os.Stat(p)
		ents, _ := os.ReadDir(dir)
		if err != nil || string(got) != b || fi.Mode().Perm() != 0o600 || len(ents) != 1 {
			t.Errorf("after writing %q: %q %v, mode %v, %d files", b, got, err, fi.Mode().Perm(), len(ents))
		}
	}
}

// A directory whose file system cannot sync a directory (some FUSE and
// network mounts answer EINVAL or ENOTSUP) still gets the file replaced,
// and WriteAtomic says so: the rename is done, only its durability is the
// file system's. Another sync failure (EIO) is one, ErrNotDurable: the
// file replaced, a crash may bring the old one back.
func TestWriteAtomicDirSyncUnsupported(t *testing.T) {
	defer func(f func(*os.File) error) { syncDir = f }(syncDir)
	for _, c := range []struct {
		err  error
		fail bool
	}{{syscall.EINVAL, false}, {syscall.ENOTSUP, false}, {syscall.EIO, true}} {
		syncDir = func(*os.File) error { return &os.PathError{Op: "sync", Path: "dir", Err: c.err} }
		p := filepath.Join(t.TempDir(), "state.json")
		err := WriteAtomic(p, []byte("new"), 0o600)
		got, _ := os.ReadFile(p)
		if (err != nil) != c.fail || errors.Is(err, ErrNotDurable) != c.fail || string(got) != "new" {
			t.Errorf("dir sync %v: WriteAtomic %v, file %q; want failed %v and the file replaced", c.err, err, got, c.fail)
		}
	}
}

// A write that fails before its rename leaves the file as it was: not
// ErrNotDurable, which says the file was replaced.
func TestWriteAtomicFailedBeforeItsRename(t *testing.T) {
	err := WriteAtomic(filepath.Join(t.TempDir(), "missing", "state.json"), []byte("new"), 0o600)
	if err == nil || errors.Is(err, ErrNotDurable) {
		t.Errorf("WriteAtomic into a missing directory: %v, want an error that is not ErrNotDurable", err)
	}
}

// MkdirAllDurable makes the directories missing and syncs the parent of
// each it made, once: a directory already there syncs nothing. Whether the
// syncs make the entries survive a power loss is the kernel's part, not
// tested here.
func TestMkdirAllDurable(t *testing.T) {
	defer func(f func(*os.File) error) { syncDir = f }(syncDir)
	var synced []string
	syncDir = func(f *os.File) error { synced = append(synced, f.Name()); return f.Sync() }
	root := t.TempDir()
	dir := filepath.Join(root, "a", "b", "c")
	if err := MkdirAllDurable(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		t.Fatalf("%s not made: %v", dir, err)
	}
	want := []string{filepath.Join(root, "a", "b"), filepath.Join(root, "a"), root}
	if !slices.Equal(synced, want) {
		t.Errorf("synced %q, want the parents of what was made %q", synced, want)
	}
	synced = nil
	if err := MkdirAllDurable(dir, 0o755); err != nil || len(synced) != 0 {
		t.Errorf("again: %v, synced %q; want nil and no sync", err, synced)
	}
	if err := MkdirAllDurable(filepath.Join(dir, "d"), 0o755); err != nil || !slices.Equal(synced, []string{dir}) {
		t.Errorf("one more level: %v, synced %q; want %s alone", err, synced, dir)
	}
	// A file in the way is MkdirAll's error, as it was.
	os.WriteFile(filepath.Join(root, "f"), nil, 0o644)
	if err := MkdirAllDurable(filepath.Join(root, "f", "x"), 0o755); err == nil {
		t.Error("a file in the way: no error")
	}
}

// A sync MkdirAllDurable cannot do is its error, and the directories it
// made are gone, so that the next call makes them and syncs them again;
// a file system that does not sync directories (EINVAL) is none.
func TestMkdirAllDurableSyncFails(t *testing.T) {
	defer func(f func(*os.File) error) { syncDir = f }(syncDir)
	root := t.TempDir()
	syncDir = func(f *os.File) error { return &os.PathError{Op: "sync", Path: f.Name(), Err: syscall.EIO} }
	if err := MkdirAllDurable(filepath.Join(root, "a", "b"), 0o755); !errors.Is(err, syscall.EIO) {
		t.Fatalf("sync failing EIO: %v, want it", err)
	}
	if _, err := os.Stat(filepath.Join(root, "a")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after the failed sync, %s: %v, want it removed", filepath.Join(root, "a"), err)
	}
	syncDir = func(f *os.File) error { return &os.PathError{Op: "sync", Path: f.Name(), Err: syscall.EINVAL} }
	if err := MkdirAllDurable(filepath.Join(root, "a", "b"), 0o755); err != nil {
		t.Errorf("sync unsupported (EINVAL): %v, want nil", err)
	}
}

// A call that finds its directory, or one above it, made by another call
// whose sync has not ended waits for that sync instead of taking the
// directory as durable: a write into it would be acknowledged before the
// entry is, or go into a directory the other call removes when its sync
// fails. Where that sync failed, the waiting call makes the directory and
// syncs it itself, and its own sync's failure is its error.
func TestMkdirAllDurableWaitsForAnotherCall(t *testing.T) {
	defer func(f func(*os.File) error, w func(<-chan struct{})) { syncDir, awaitMaker = f, w }(syncDir, awaitMaker)
	for _, tt := range []struct {
		name               string
		below              string // the second call's directory, below the first's
		relative           bool   // the second call names it from the working directory
		firstErr, laterErr error  // the first call's first sync, every sync after it
	}{
		{"the same directory, synced", "", false, nil, nil},
		{"a directory below, synced", "c", false, nil, nil},
		{"the same directory by a relative path", "", true, nil, nil},
		{"the same directory, its sync failed", "", false, syscall.EIO, nil},
		{"a directory below, its sync failed", "c", false, syscall.EIO, nil},
		{"a relative path, its sync failed", "c", true, syscall.EIO, nil},
		{"its sync failed, and the second call's own", "", false, syscall.EIO, syscall.ENOSPC},
	} {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			first := filepath.Join(root, "a", "b")
			second := filepath.Join(first, tt.below)
			if tt.relative {
				t.Chdir(root)
				second = filepath.Join("a", "b", tt.below)
			}
			entered, release := make(chan struct{}), make(chan struct{})
			var mu sync.Mutex
			var syncs int
			var later []string // synced after the first call's first sync
			syncDir = func(f *os.File) error {
				mu.Lock()
				syncs++
				firstSync := syncs == 1
				if !firstSync {
					later = append(later, f.Name())
				}
				mu.Unlock()
				err := tt.laterErr
				if firstSync {
					close(entered)
					<-release
					err = tt.firstErr
				}
				if err != nil {
					return &os.PathError{Op: "sync", Path: f.Name(), Err: err}
				}
				return f.Sync()
			}
			waiting := make(chan struct{}, 1)
			awaitMaker = func(done <-chan struct{}) {
				select {
				case waiting <- struct{}{}:
				default:
				}
				<-done
			}
			var calls sync.WaitGroup
			var firstErr error
			secondDone := make(chan error, 1)
			let := sync.OnceFunc(func() { close(release) })
			defer func() { let(); calls.Wait() }() // the hooks go back once both calls have ended
			calls.Go(func() { firstErr = MkdirAllDurable(first, 0o755) })
			<-entered
			calls.Go(func() { secondDone <- MkdirAllDurable(second, 0o755) })
			// Either the second call returns or it waits: whichever it does
			// is seen, so a call returning at once fails here every time.
			select {
			case err := <-secondDone:
				t.Fatalf("the second call returned (%v) while the first call's sync had not ended", err)
			case <-waiting:
			}
			let()
			calls.Wait()
			if !errors.Is(firstErr, tt.firstErr) {
				t.Fatalf("first call: %v, want %v", firstErr, tt.firstErr)
			}
			err := <-secondDone
			if !errors.Is(err, tt.laterErr) {
				t.Fatalf("second call: %v, want its own sync's %v", err, tt.laterErr)
			}
			if err != nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if fi, err := os.Stat(second); err != nil || !fi.IsDir() || !slices.Contains(later, root) {
				t.Errorf("second call: nil, but %s is %v (%v), and %q synced after the first's sync; want it there and %s among them", second, fi, err, later, root)
			}
		})
	}
}

// claim tells a call that looked at the disk to wait where a making of its
// directory or of one above it is pending, or where a make failed since
// the look (it may have removed what the look saw), and otherwise to make
// what was missing, or nothing.
func TestRegistryClaim(t *testing.T) {
	failOther := func(r *registry) {
		m, _ := r.claim("/z", []string{"/z"}, r.generation())
		r.settle(m, syscall.EIO)
	}
	syncOther := func(r *registry) {
		m, _ := r.claim("/z", []string{"/z"}, r.generation())
		r.settle(m, nil)
	}
	for _, tt := range []struct {
		name    string
		pending []string          // tops claimed by other calls, not settled
		since   func(r *registry) // between the look and the claim
		dir     string
		todo    []string // what the look found missing
		want    string   // "wait", "make" or "none"
	}{
		{"nothing pending, nothing missing", nil, nil, "/r/a", nil, "none"},
		{"nothing pending, missing", nil, nil, "/r/a/b", []string{"/r/a/b", "/r/a"}, "make"},
		{"its directory pending", []string{"/r/a"}, nil, "/r/a", nil, "wait"},
		{"one above it pending", []string{"/r"}, nil, "/r/a/b", []string{"/r/a/b"}, "wait"},
		{"one beside it pending", []string{"/r/x"}, nil, "/r/a", nil, "none"},
		{"one below it pending", []string{"/r/a/b"}, nil, "/r/a", nil, "none"},
		{"a make failed since the look", nil, failOther, "/r/a", nil, "wait"},
		{"a make synced since the look", nil, syncOther, "/r/a", nil, "none"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := &registry{pending: map[string]*making{}}
			for _, top := range tt.pending {
				r.claim(top, []string{top}, r.generation())
			}
			seen := r.generation()
			if tt.since != nil {
				tt.since(r)
			}
			m, wait := r.claim(tt.dir, tt.todo, seen)
			got := "none"
			switch {
			case wait != nil:
				got = "wait"
			case m != nil:
				got = "make"
				if top := tt.todo[len(tt.todo)-1]; m.top != top || r.pending[top] != m {
					t.Errorf("made under %q, pending %v; want it pending under %q", m.top, r.pending, top)
				}
			}
			if got != tt.want {
				t.Errorf("claim: %s, want %s", got, tt.want)
			}
		})
	}
}

// SyncDir, which FS.Delete runs after an unlink: a failed sync is its
// error, one the file system does not do (EINVAL, ENOTSUP) none.
func TestSyncDir(t *testing.T) {
	defer func(f func(*os.File) error) { syncDir = f }(syncDir)
	dir := t.TempDir()
	if err := SyncDir(dir); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		err  error
		fail bool
	}{{syscall.EINVAL, false}, {syscall.ENOTSUP, false}, {syscall.EIO, true}} {
		syncDir = func(f *os.File) error { return &os.PathError{Op: "sync", Path: f.Name(), Err: c.err} }
		if err := SyncDir(dir); (err != nil) != c.fail {
			t.Errorf("sync %v: SyncDir %v, want failed %v", c.err, err, c.fail)
		}
	}
	if err := SyncDir(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing directory: no error")
	}
}

// A making that panics (a bug under a sync) settles its claim as failed:
// left pending, every later call for its directory, or one below it,
// waited for it for good. The next call makes and syncs the directory
// itself.
func TestMkdirAllDurableAfterAPanic(t *testing.T) {
	defer func(f func(*os.File) error) { syncDir = f }(syncDir)
	dir := filepath.Join(t.TempDir(), "a", "b")
	syncDir = func(*os.File) error { panic("a sync bug") }
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the first call did not panic")
			}
		}()
		MkdirAllDurable(dir, 0o755)
	}()
	var synced int
	syncDir = func(*os.File) error { synced++; return nil }
	done := make(chan error, 1)
	go func() { done <- MkdirAllDurable(filepath.Join(dir, "c"), 0o755) }()
	select {
	case err := <-done:
		if err != nil || synced == 0 {
			t.Errorf("the call after the panic: %v, %d syncs; want the directories made and synced", err, synced)
		}
	case <-time.After(10 * time.Second): // a bound for a hang, not a timing
		t.Fatal("the call after a panicked making waited for its claim")
	}
}
