package fileutil

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"syscall"
)

// MakeAgain makes dir, one of a server's own directories made at its
// start, again where err, of a call that makes a file in it, is dir being
// gone: a tmp cleaner, or an operator's rm -rf under a running server,
// had every such call fail until a restart. again says the caller may try
// its call once more: dir is there now, a directory of this process's
// user, not a link to one (made by os.Mkdir, never through a link planted
// in its place). The call that made it logs so, once (WARN, what naming
// the directory for the reader). gone is the failure to make it, naming
// dir, with its errno. Where err is not dir being gone (nil, or a file in
// dir that is gone), both are zero: the caller's error stands.
func MakeAgain(dir string, err error, log *slog.Logger, what string) (again bool, gone error) {
	if dir == "" || !errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if _, lerr := os.Lstat(dir); !errors.Is(lerr, fs.ErrNotExist) {
		return false, nil // dir is there: what is gone is in it
	}
	merr := os.Mkdir(dir, 0o700)
	if merr != nil && !errors.Is(merr, fs.ErrExist) { // ErrExist: another call made it at once
		return false, &GoneError{What: what, Err: merr}
	}
	if err := ownDir(dir); err != nil {
		return false, &GoneError{What: what, Err: err}
	}
	if merr == nil {
		log.Warn("a directory of the server's was removed under it: made again", "directory", what, "path", dir)
	}
	return true, nil
}

// ownDir checks that dir is a directory of this process's user, not a
// link to one.
func ownDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return &fs.PathError{Op: "lstat", Path: dir, Err: fmt.Errorf("not a directory of the server's (%v): %w", fi.Mode().Type(), syscall.ENOTDIR)}
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return &fs.PathError{Op: "lstat", Path: dir, Err: fmt.Errorf("owned by uid %d, not the server's: %w", st.Uid, syscall.EPERM)}
	}
	return nil
}

// GoneError is MakeAgain's failure to make a directory again: What names
// it for a reader, Err (a path error, with its errno) says why.
type GoneError struct {
	What string
	Err  error
}

func (e *GoneError) Error() string {
	return "the " + e.What + " directory was removed under the server and could not be made again: " + e.Err.Error()
}

func (e *GoneError) Unwrap() error { return e.Err }

// InDir runs op, which makes a file or directory in dir, and runs it once
// more where it failed for dir being gone and MakeAgain made dir again;
// where dir could not be made, the error is MakeAgain's *GoneError.
func InDir(dir string, log *slog.Logger, what string, op func() error) error {
	err := op()
	again, gone := MakeAgain(dir, err, log, what)
	switch {
	case gone != nil:
		return gone
	case again:
		return op()
	}
	return err
}
