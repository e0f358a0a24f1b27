package repository

// Reading a version folder that others than the server write: every file
// the repository opens is checked to be a regular file first.

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/errdefs"
)

// regular refuses dir/name (named by name alone: callers say where) unless it is a regular file (or a link to
// one), before anything opens it: opening a FIFO blocks until a writer
// comes (with the scan holding the turn, the whole repository would wait)
// and a device may read without end. A file swapped for one between this
// look and the open is not caught; the bundle package opens what it is
// given.
func regular(dir, name string) error {
	fi, err := os.Stat(filepath.Join(dir, name))
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is %s, not a regular file", name, fileKind(fi.Mode()))
	}
	return nil
}

// fileKind names a mode's file type for a message.
func fileKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m.IsDir():
		return "a directory"
	}
	return "a special file (" + m.Type().String() + ")"
}

// readManifest is bundle.ReadManifest of dir once its plover.json is
// found to be a regular file.
func readManifest(dir string) (*abi.Manifest, error) {
	if err := regular(dir, abi.ManifestFile); err != nil {
		return nil, err
	}
	return bundle.ReadManifest(dir)
}

// isPipeline reports whether dir's manifest is a pipeline's.
func isPipeline(dir string) bool {
	m, err := readManifest(dir)
	return err == nil && m.IsPipeline()
}

// pack packs the version folder dir (as name, unless "") in memory,
// reading only files within it (bundle.PackWithin), once the files it
// would open are found to be regular files; it stops, KindTooLarge, as
// soon as the bundle passes MaxBundleBytes (a model of some GiB is not
// packed whole to be refused then).
func (r *Repository) pack(dir, name string) ([]byte, string, *abi.Manifest, error) {
	m, err := readManifest(dir)
	if err != nil {
		return nil, "", nil, err
	}
	for _, f := range []string{m.Library, m.Constants} {
		if f == "" {
			continue
		}
		if err := regular(dir, f); err != nil {
			return nil, "", nil, err
		}
	}
	buf := &capped{max: r.cfg.MaxBundleBytes}
	if m, err = bundle.PackWithin(dir, name, buf); errors.Is(err, errTooLarge) {
		return nil, "", nil, errdefs.New(errdefs.KindTooLarge, nil, "bundle is larger than %d bytes", buf.max)
	} else if err != nil {
		return nil, "", nil, err
	}
	b := buf.b.Bytes()
	return b, bundle.Digest(b), m, nil
}

var errTooLarge = errors.New("bundle over the limit")

// capped is a buffer that refuses to grow past max bytes (0: no bound).
type capped struct {
	b   bytes.Buffer
	max int64
}

func (c *capped) Write(p []byte) (int, error) {
	if c.max > 0 && int64(c.b.Len())+int64(len(p)) > c.max {
		return 0, errTooLarge
	}
	return c.b.Write(p)
}
