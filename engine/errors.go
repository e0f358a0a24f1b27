// Package engine owns deployed functions on one node: it resolves a function
// to its current version, loads versions onto devices (cold start), keeps a
// warm pool of instances per version and runs requests through them.
package engine

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/fileutil"
	"github.com/plover-run/plover/loader"
	"github.com/plover-run/plover/objectstore"
	"github.com/plover-run/plover/registry"
)

// The engine's errors are errdefs', made here with these two.
func errorf(k errdefs.Kind, err error, format string, a ...any) *errdefs.Error {
	return errdefs.New(k, err, format, a...)
}

// notFound is the 404 of a name no function has (errdefs.UnknownFunction).
func notFound(name string, err error, why string) *errdefs.Error {
	return errdefs.UnknownFunction(name, err, why)
}

// unavailable is the 503 of a store that failed, the error of every store
// call; a record that the store returned but that cannot be changed or
// read is no store's outage, and a retry would not mend it: one a change
// would make too large is a 409 (registry.ErrRecordTooLarge), one that
// does not decode a 500 (registry.ErrCorruptRecord), each saying what
// does. An S3 store's error names its bucket, prefix, objects and
// endpoint, which are no caller's business (any token's request may fail
// so): the client is told its class (objectstore.Fault), and the error's
// cause, which the transports log, keeps the rest.
func unavailable(err error, format string, a ...any) *errdefs.Error {
	switch {
	case errors.Is(err, registry.ErrRecordTooLarge):
		return errorf(errdefs.KindConflict, err, "%s", err.Error()) // it names the function and what to do
	case errors.Is(err, registry.ErrCorruptRecord):
		return errorf(errdefs.KindInternal, err, "%s", err.Error())
	}
	if class := objectstore.ClassOf(err); class != "" {
		return errorf(errdefs.KindUnavailable, err, "%s: %s", fmt.Sprintf(format, a...), class)
	}
	if gone := (*fileutil.GoneError)(nil); errors.As(err, &gone) {
		return errorf(errdefs.KindUnavailable, err, "%s: %s", fmt.Sprintf(format, a...), goneText(gone)) // a worker's stages'
	}
	if op, ok := nodeFile(err); ok {
		return errorf(errdefs.KindUnavailable, err, "%s: %s failed on this node (%v; the server's log names the file)", fmt.Sprintf(format, a...), op, errnoOf(err))
	}
	return errdefs.Unavailable(err, format, a...)
}

// nodeFile is the operation of a failure of this node's files (the file
// store, the bundle cache, a worker's stage), found by its path or link
// error: a client is told the operation and errno, never the paths, which
// are the node's alone (the front door logs every 5xx with its cause).
func nodeFile(err error) (op string, ok bool) {
	var pe *os.PathError
	var le *os.LinkError
	switch {
	case errors.As(err, &pe):
		return pe.Op, true
	case errors.As(err, &le):
		return le.Op, true
	}
	return "", false
}

// goneText tells a client that one of this node's directories was
// removed under the server and could not be made again (inDir), naming it
// by what it is for, with the errno: its path is the log's.
func goneText(gone *fileutil.GoneError) string {
	return fmt.Sprintf("the node's %s directory was removed and could not be made again (%v; see the server log)", gone.What, errnoOf(gone))
}

// errnoOf is err's errno where it has one, else what it says past its
// paths' error.
func errnoOf(err error) error {
	var errno syscall.Errno
	var pe *os.PathError
	var le *os.LinkError
	switch {
	case errors.As(err, &errno):
		return errno
	case errors.As(err, &pe):
		return pe.Err
	case errors.As(err, &le):
		return le.Err
	}
	return errors.New("see the server's log")
}

// inBundle names the library in a loader refusal by its file name in the
// bundle: the client should read "kernels.so", not where this node keeps
// its cache (dir, the unpacked bundle), in the path or in the reason
// (dlerror names the file: "<dir>/kernels.so: undefined symbol: ...").
func inBundle(err error, dir, library string) error {
	var le *loader.Error
	if errors.As(err, &le) {
		le.Path = library
		le.Reason = strings.ReplaceAll(le.Reason, filepath.Clean(dir)+string(filepath.Separator), "")
	}
	return err
}

// quoted and plural word lists in messages.
func quoted(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = strconv.Quote(s)
	}
	return out
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// isManifestRefusal reports whether err refuses a field of a version's
// manifest: the stored bundle's (abi.ParseStoredManifest) or a device's
// load (device.HostMemoryBound).
func isManifestRefusal(err error) bool {
	_, ok := abi.AsFieldError(err)
	return ok
}

// refusalKind is the class of a stored bundle's refusal: the bundle's fault
// (422), but for a field this node's plover does not know, which a newer
// server sharing the store admitted (a rolling upgrade): this node cannot
// run it, another may (503). Either way the refusal is kept, not fetched
// again at every request.
func refusalKind(err error) errdefs.Kind {
	if fe, ok := abi.AsFieldError(err); ok && strings.HasPrefix(fe.Reason, "no such field") {
		return errdefs.KindUnavailable
	}
	return errdefs.KindInvalid
}
