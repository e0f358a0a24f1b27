package cli

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// outFile is an --out FILE being written, as a shell's > FILE would write
// it but for one thing: a regular FILE gets the output only once it is
// whole (a failed invoke left the answer's first part in place of what
// FILE held). FILE is opened before the request, so that one the user may
// not write fails before the function runs; the output goes to a
// temporary file, which commit renames over FILE where that is the same as
// writing it (renamable), and copies into FILE otherwise. A device, a pipe,
// or a stream of this process (/dev/stdout, a file that is stdout) has
// nothing to replace and is written through.
type outFile struct {
	name    string    // --out, for messages
	path    string    // FILE, its links followed
	w       io.Writer // what Write writes to: tmp, or FILE written through
	dst     *os.File  // FILE opened; nil when written through env's stdout or stderr
	tmp     *os.File  // the output until commit; nil when written through
	beside  bool      // tmp is in FILE's directory: a rename can put it in place
	created bool      // FILE was made for this output, and abort removes it
	closed  bool
}

// createOut opens path for an output; its errors name --out and path.
func createOut(path string, env *Env) (*outFile, error) {
	if path == "" {
		// Said here: open's "open : no such file or directory" names
		// neither the flag nor the mistake.
		return nil, errors.New("--out: empty path")
	}
	o := &outFile{name: path, path: path}
	fd, own, named := fdPath(path)
	if own {
		return o, o.throughFD(fd, env)
	}
	flags := os.O_WRONLY
	if named {
		// Another process's descriptor, whose position is its own: where
		// it is a file, appending writes after what that process wrote,
		// never over it.
		flags |= os.O_APPEND
	}
	for tries := 0; o.dst == nil; tries++ {
		f, err := os.OpenFile(path, flags, 0)
		if errors.Is(err, fs.ErrNotExist) && tries < 3 {
			// Made where os.Create makes it: through a dangling link, at
			// its target. 0666, for the umask to give it the mode
			// os.Create gave it.
			o.path = linkTarget(path)
			f, err = os.OpenFile(o.path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o666)
			if errors.Is(err, fs.ErrExist) {
				continue // made meanwhile: opened as it is
			}
			o.created = err == nil
		}
		if err != nil {
			return nil, fmt.Errorf("--out %s: %w", path, err)
		}
		o.dst = f
	}
	fi, err := o.dst.Stat()
	if err != nil {
		o.abort()
		return nil, fmt.Errorf("--out %s: %w", path, err)
	}
	if w := sameStream(fi, env); w != nil {
		// Written at the shell's position, as the stream is: replaced, or
		// opened anew at its start, it lost what the shell wrote there.
		o.dst.Close()
		o.dst, o.w = nil, w
		return o, nil
	}
	if !fi.Mode().IsRegular() || named {
		o.w = o.dst
		return o, nil
	}
	if !o.created {
		o.path = linkTarget(path)
	}
	dir, base := filepath.Split(o.path)
	o.tmp, err = tempBeside(dir, base)
	o.beside = err == nil
	if err != nil {
		// A directory FILE is in but cannot be written to: the output
		// waits elsewhere and is copied in.
		var err2 error
		if o.tmp, err2 = os.CreateTemp("", ".plover-out-*"); err2 != nil {
			o.abort()
			return nil, fmt.Errorf("--out %s: no temporary file to hold the output: beside it (%v), nor in %s (%v)", path, err, os.TempDir(), err2)
		}
	}
	o.w = o.tmp
	return o, nil
}

// tempBeside makes a temporary file in dir for base, at 0600: it holds
// FILE's new contents, which at 0666&umask others could read while they
// were written (and in one left behind) beside a FILE that was 0600.
// commit gives it FILE's mode, which a FILE made for the output got from
// the umask, as os.Create gives it. A variable for the tests.
var tempBeside = func(dir, base string) (*os.File, error) {
	for i := 0; ; i++ {
		name := filepath.Join(dir, fmt.Sprintf(".%s.plover-%d-%d", base, os.Getpid(), i))
		f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600) // read back by a copy in place
		if err == nil || !errors.Is(err, fs.ErrExist) || i == 100 {
			return f, err
		}
	}
}

// fdPath says whether path names an open file descriptor (named):
// /dev/stdout, /dev/stderr, /dev/stdin, /dev/fd/N, /proc/PID/fd/N; and which
// of this process's, if one of them (own).
func fdPath(path string) (fd int, own, named bool) {
	p := filepath.Clean(path)
	switch p {
	case "/dev/stdin":
		return 0, true, true
	case "/dev/stdout":
		return 1, true, true
	case "/dev/stderr":
		return 2, true, true
	}
	dir, base := filepath.Split(p)
	n, err := strconv.Atoi(base)
	if err != nil || n < 0 {
		return 0, false, false
	}
	switch dir {
	case "/dev/fd/", "/proc/self/fd/", "/proc/thread-self/fd/", "/proc/" + strconv.Itoa(os.Getpid()) + "/fd/":
		return n, true, true
	}
	return 0, false, strings.HasPrefix(dir, "/proc/") && strings.HasSuffix(dir, "/fd/")
}

// throughFD writes the output to this process's descriptor fd: stdout and
// stderr as env has them, another by a duplicate, which shares its
// position (opening /proc/self/fd/N anew would start at the file's start).
func (o *outFile) throughFD(fd int, env *Env) error {
	switch fd {
	case 1:
		o.w = env.Stdout
		return nil
	case 2:
		o.w = env.Stderr
		return nil
	}
	d, err := syscall.Dup(fd)
	if err != nil {
		return fmt.Errorf("--out %s: descriptor %d: %w", o.name, fd, err)
	}
	o.dst = os.NewFile(uintptr(d), o.name)
	o.w = o.dst
	return nil
}

// sameStream is env's stdout or stderr where fi is its file.
func sameStream(fi os.FileInfo, env *Env) io.Writer {
	for _, w := range []io.Writer{env.Stdout, env.Stderr} {
		if f, ok := w.(*os.File); ok {
			if si, err := f.Stat(); err == nil && os.SameFile(fi, si) {
				return w
			}
		}
	}
	return nil
}

// linkTarget is the file path names, its links followed as the kernel
// follows them, whether or not that file is there: a dangling link's
// target is where os.Create would make it. Nothing is cleaned before its
// links are followed: the kernel takes link/.. as the parent of link's
// target, where filepath.Clean takes it as link's own directory (a new
// FILE named dir/link/../f was made in dir, not beside link's target).
func linkTarget(p string) string {
	for range 40 { // the kernel's own bound on links followed
		dir, base := splitPath(p)
		if d, err := filepath.EvalSymlinks(dir); err == nil { // follows links before each ..
			p = filepath.Join(d, base)
		}
		l, err := os.Readlink(p)
		if err != nil {
			return p
		}
		if !filepath.IsAbs(l) {
			dir, _ := splitPath(p)
			l = dir + "/" + l // not Join: it would clean a .. in l before the links before it
		}
		p = l
	}
	return p
}

// splitPath is p's directory and last element, as the kernel reads them:
// nothing cleaned.
func splitPath(p string) (dir, base string) {
	i := strings.LastIndexByte(p, '/')
	switch {
	case i < 0:
		return ".", p
	case i == 0:
		return "/", p[1:]
	}
	return p[:i], p[i+1:]
}

func (o *outFile) Write(p []byte) (int, error) { return o.w.Write(p) }

// whole says whether the output goes to FILE only once it is whole (what a
// failed invoke leaves FILE as it was).
func (o *outFile) whole() bool { return o.tmp != nil }

// renamable says whether renaming the temporary file over FILE gives what
// writing FILE in place would: the same file at the same path, its only
// name (a rename splits hard links), its owner and group (a rename gives
// ours), no set-id or sticky bit, no extended attributes (ACLs, labels),
// and a directory that lets us rename (ours is the temporary file in it,
// and the file is ours: a sticky one refuses only others' files).
func (o *outFile) renamable() bool {
	if !o.beside {
		return false
	}
	di, err := o.dst.Stat()
	if err != nil {
		return false
	}
	ti, err := o.tmp.Stat()
	if err != nil {
		return false
	}
	pi, err := os.Stat(o.path)
	if err != nil || !os.SameFile(di, pi) {
		return false
	}
	d, t := di.Sys().(*syscall.Stat_t), ti.Sys().(*syscall.Stat_t)
	if d == nil || t == nil || d.Nlink != 1 || d.Uid != t.Uid || d.Gid != t.Gid || di.Mode()&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky) != 0 {
		return false
	}
	n, err := unix.Flistxattr(int(o.dst.Fd()), nil)
	return err == nil && n == 0
}

// commit makes what was written the file: renamed over it where that is
// the same as writing it, else (or where the rename fails) copied into it.
func (o *outFile) commit() error {
	if o.closed {
		return nil
	}
	if o.tmp == nil {
		o.closed = true
		if o.dst == nil {
			return nil
		}
		if err := o.dst.Close(); err != nil {
			return fmt.Errorf("--out %s: %w", o.name, err)
		}
		return nil
	}
	if o.renamable() {
		renamed, err := o.renameOver()
		switch {
		case err != nil:
			o.abort() // a no-op where renameOver kept the output
			return err
		case renamed:
			o.closed = true
			o.dst.Close() // FILE's old file, never written: its close loses nothing
			return nil
		}
	}
	o.closed = true
	return o.copyIn()
}

// renameOver renames the temporary file over FILE, synced and closed
// first, their errors checked: a write error that shows only then (NFS, a
// quota) put a short file in place of the old one. It says false, with no
// error, where the output is to be copied in instead (tmp open for it).
func (o *outFile) renameOver() (bool, error) {
	fi, err := o.dst.Stat()
	if err != nil || o.tmp.Chmod(fi.Mode().Perm()) != nil {
		return false, nil
	}
	name := o.tmp.Name()
	if err := o.tmp.Sync(); err != nil {
		return false, fmt.Errorf("--out %s: writing the output to %s: %w (the file is left as it was)", o.name, name, err)
	}
	if err := o.tmp.Close(); err != nil {
		return false, fmt.Errorf("--out %s: writing the output to %s: %w (the file is left as it was)", o.name, name, err)
	}
	if os.Rename(name, o.path) == nil {
		return true, nil
	}
	f, err := os.Open(name)
	if err != nil {
		o.closed = true // abort keeps the output
		return false, fmt.Errorf("--out %s: the rename over it failed, and %s, read back to copy it in instead: %w (the file is left as it was; the whole output is in %s)", o.name, name, err, name)
	}
	o.tmp = f
	return false, nil
}

// copyIn writes the output into FILE in place. FILE's close is checked: a
// write error that shows only then reported a copy that had failed.
func (o *outFile) copyIn() error {
	defer o.tmp.Close() // only read here: its close says nothing of FILE
	n, err := o.tmp.Seek(0, io.SeekStart)
	if err == nil {
		n, err = io.Copy(o.dst, o.tmp)
	}
	if err == nil {
		err = o.dst.Truncate(n)
	}
	if cerr := o.dst.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		// The function ran: its output is kept, and said where.
		return fmt.Errorf("--out %s: writing the output into it: %w (it may hold part of it; the whole output is in %s)", o.name, err, o.tmp.Name())
	}
	os.Remove(o.tmp.Name())
	return nil
}

// abort drops what was written, leaving FILE as it was (a FILE made for
// the output removed); a no-op after commit.
func (o *outFile) abort() {
	if o.closed {
		return
	}
	o.closed = true
	if o.tmp != nil {
		o.tmp.Close()
		os.Remove(o.tmp.Name())
	}
	if o.dst == nil {
		return
	}
	if o.created {
		// Only if the path still names the file made: another may have
		// put its own there since.
		if di, err := o.dst.Stat(); err == nil {
			if pi, err := os.Lstat(o.path); err == nil && os.SameFile(di, pi) {
				os.Remove(o.path)
			}
		}
	}
	o.dst.Close()
}
