// Package fileutil holds the file copies the worker's stage, plover build
// and the benchmark suite share.
package fileutil

import (
	"errors"
	"io"
	"os"
)

// Copy copies regular file src to dst, replacing dst.
func Copy(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// LinkOrCopy makes dst the file src: a hard link where both are on one
// file system, a copy otherwise. A dst already there is replaced, never
// written through (it may be a link to another file).
func LinkOrCopy(src, dst string) error {
	if err := os.Remove(dst); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if os.Link(src, dst) == nil {
		return nil
	}
	return Copy(src, dst)
}
