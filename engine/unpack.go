package engine

import (
	"errors"
	"os"
	"syscall"

	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/errdefs"
)

// unpackError classes a deploy's failed unpack (Cache.Verify). The
// bundle's own faults (a refused archive or manifest, a damaged stream)
// are 422 with their reason, which names files by their names in the
// bundle; this node's (an os error, with its errno) are diskError's.
func (e *Engine) unpackError(name string, err error) error {
	var be *bundle.Error
	if errors.As(err, &be) || isManifestRefusal(err) || !isNodeFault(err) {
		return errorf(errdefs.KindInvalid, err, "%s", err.Error())
	}
	return e.diskError(name, "unpacking", err)
}

// diskError is a deploy's failure to write or read this node's files
// while it was doing what (spooling, unpacking the bundle): 507 for a
// full disk, else 503, either naming the errno alone. A bundle that is
// fine is not refused for it, and the client is not told where the node
// keeps its files; the log has the whole of it.
func (e *Engine) diskError(name, doing string, err error) error {
	e.cfg.Log.Error("deploy: this node's files failed", "function", name, "doing", doing, "error", err)
	why := ""
	var errno syscall.Errno
	if errors.As(err, &errno) {
		why = " (" + errno.Error() + ")"
	}
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return errorf(errdefs.KindNoSpace, err, "deploy %s: %s the bundle: out of disk space%s", name, doing, why)
	}
	return errorf(errdefs.KindUnavailable, err, "deploy %s: %s the bundle failed on this node%s; see the server log", name, doing, why)
}

// isNodeFault reports whether err is a failure of this node's files or
// system calls rather than of the bytes it read.
func isNodeFault(err error) bool {
	var pe *os.PathError
	var le *os.LinkError
	var se *os.SyscallError
	var errno syscall.Errno
	return errors.As(err, &pe) || errors.As(err, &le) || errors.As(err, &se) || errors.As(err, &errno)
}
