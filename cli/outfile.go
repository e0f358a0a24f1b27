package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// outFile is an --out FILE being written. A regular file (or a new one) is
// written to a temporary file beside it and renamed over it by commit once
// the output is whole: a failed invoke left the answer's first part in
// place of what FILE held. A device or a pipe (/dev/null, a FIFO) has
// nothing to replace and is written through.
type outFile struct {
	name   string // --out, for messages
	path   string // the file replaced: --out, its links followed
	tmp    string // "" when written through
	f      *os.File
	perm   os.FileMode // the replaced file's mode; 0 for a new file
	closed bool
}

// createOut opens path for an output; its errors name --out and path.
func createOut(path string) (*outFile, error) {
	target := path
	if p, err := filepath.EvalSymlinks(path); err == nil {
		// A link is kept and its file replaced, as writing through it
		// would have.
		target = p
	}
	fi, err := os.Stat(target)
	switch {
	case err == nil && !fi.Mode().IsRegular():
		f, err := os.OpenFile(target, os.O_WRONLY, 0)
		if err != nil {
			return nil, fmt.Errorf("--out %s: %w", path, err)
		}
		return &outFile{name: path, path: target, f: f}, nil
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("--out %s: %w", path, err)
	}
	o := &outFile{name: path, path: target}
	if err == nil {
		o.perm = fi.Mode().Perm()
	}
	// Made with O_EXCL at 0666 rather than by os.CreateTemp (0600), so
	// that a new file gets the umask's mode, as os.Create gave it.
	dir, base := filepath.Split(target)
	for i := 0; ; i++ {
		o.tmp = filepath.Join(dir, fmt.Sprintf(".%s.plover-%d-%d", base, os.Getpid(), i))
		o.f, err = os.OpenFile(o.tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o666)
		if err == nil {
			return o, nil
		}
		if !errors.Is(err, fs.ErrExist) || i == 100 {
			return nil, fmt.Errorf("--out %s: a temporary file beside it to write the output to: %w", path, err)
		}
	}
}

func (o *outFile) Write(p []byte) (int, error) { return o.f.Write(p) }

// commit makes what was written the file.
func (o *outFile) commit() error {
	o.closed = true
	err := o.f.Close()
	if o.tmp == "" {
		return err
	}
	if err == nil && o.perm != 0 {
		err = os.Chmod(o.tmp, o.perm)
	}
	if err == nil {
		err = os.Rename(o.tmp, o.path)
	}
	if err != nil {
		os.Remove(o.tmp)
		return fmt.Errorf("--out %s: %w", o.name, err)
	}
	return nil
}

// abort drops what was written, leaving the file as it was; a no-op after
// commit.
func (o *outFile) abort() {
	if o.closed {
		return
	}
	o.closed = true
	o.f.Close()
	if o.tmp != "" {
		os.Remove(o.tmp)
	}
}
