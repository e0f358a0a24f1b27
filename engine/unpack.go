package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"syscall"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/fileutil"
)

// maxUnpacks bounds the deploys that unpack their bundles on a node at
// once (Cache.Verify). A bundle of a few KB can unpack to gigabytes
// (bundle.DefaultMaxUnpacked), written, synced and read back before it
// is refused or stored; without a bound, a deployer sending such bundles
// twenty at a time filled the disk, and every other function's cold
// starts and deploys on the node failed meanwhile. Two, not one: a small
// deploy need not wait out the whole of a large one's unpack.
const maxUnpacks = 2

// unpackSlots are the node's turns to unpack a deploy's bundle.
type unpackSlots struct {
	tok     chan struct{}
	waiting atomic.Int32 // deploys waiting for a turn (a test's window)
}

func newUnpackSlots() *unpackSlots {
	return &unpackSlots{tok: make(chan struct{}, maxUnpacks)}
}

// unpackTurn waits for a turn to unpack name's bundle, as long as ctx
// allows or, where ctx has no deadline (an HTTP deploy's has none), the
// engine's request timeout; it returns the turn's release, which may be
// called more than once. A deploy takes its turn once its upload is
// spooled, not before: the spool holds no more than the client sent
// (--max-body), and a turn held while a client trickled its body would
// stall every other deploy on the node. The turn is held until the
// unpacked bundle has left its scratch directory (removed, or adopted by
// the cache), so that the turns bound the disk those take, not only the
// unpacking.
func (e *Engine) unpackTurn(ctx context.Context, name string) (func(), error) {
	s := e.unpacks
	select {
	case s.tok <- struct{}{}:
	default:
		wait, cancel := e.waitFor(ctx)
		defer cancel()
		s.waiting.Add(1)
		select {
		case s.tok <- struct{}{}:
			s.waiting.Add(-1)
		case <-wait.Done():
			s.waiting.Add(-1)
			return nil, e.noTurn(ctx, name)
		}
	}
	held := true
	return func() {
		if held {
			held = false
			<-s.tok
		}
	}, nil
}

// waitFor is ctx for a deploy's wait for its turn to unpack: its own deadline,
// or, where it has none (an HTTP deploy's), the engine's request timeout.
func (e *Engine) waitFor(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); !ok && e.cfg.Timeout > 0 {
		return context.WithTimeout(ctx, e.cfg.Timeout)
	}
	return ctx, func() {}
}

// noTurn is the error of a deploy that gave up waiting for its turn to
// unpack: 504 if the request's deadline passed, else 503, which a client
// may retry.
func (e *Engine) noTurn(ctx context.Context, name string) error {
	busy := fmt.Sprintf("this node unpacks %d deploys' bundles at once, and others' held every turn", maxUnpacks)
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return errorf(errdefs.KindTimeout, ctx.Err(), "deploy %s: the request's deadline passed while it waited for its turn to unpack the bundle: %s", name, busy)
	case ctx.Err() != nil:
		return errorf(errdefs.KindUnavailable, ctx.Err(), "deploy %s: cancelled while it waited for its turn to unpack the bundle (the server is shutting down, or the client went away)", name)
	}
	return errorf(errdefs.KindUnavailable, nil, "deploy %s: waited %v for a turn to unpack the bundle: %s; try again", name, e.cfg.Timeout, busy)
}

// checkManifest checks a deploy's manifest, as soon as it is read, against
// the name it is deployed under and the node's targets: a bundle refused
// for either is refused before its files are unpacked (Cache.Verify).
func checkManifest(m *abi.Manifest, name string, targets []string) error {
	if m.Name != name {
		return errorf(errdefs.KindInvalid, nil, "name: the manifest names %q but the bundle is deployed as %q", m.Name, name)
	}
	if m.IsPipeline() {
		return nil // no library: its steps are checked against the store (checkPipeline)
	}
	if err := abi.RunsOn(m.Target, targets); err != nil {
		return errorf(errdefs.KindInvalid, nil, "%s", err.Error())
	}
	return nil
}

// unpackError classes a deploy's failed unpack (Cache.Verify). The
// bundle's own faults (a refused archive or manifest, a damaged stream)
// are 422 with their reason, which names files by their names in the
// bundle; this node's (an os error, with its errno) are diskError's.
func (e *Engine) unpackError(name string, err error) error {
	var de *errdefs.Error
	if errors.As(err, &de) {
		return de // checkManifest's
	}
	var be *bundle.Error
	if errors.As(err, &be) || isManifestRefusal(err) || !isNodeFault(err) {
		return errorf(errdefs.KindInvalid, err, "%s", err.Error())
	}
	return e.diskError(name, "unpacking", err)
}

// diskError is a deploy's failure to write or read this node's files
// while it was doing what (spooling, unpacking the bundle): 507 for a
// full disk, else 503, either naming the errno alone (and the directory,
// by what it is for, where one removed under the server could not be made
// again: inDir). A bundle that is fine is not refused for it, and the
// client is not told where the node keeps its files; the log has the
// whole of it, at most a line a second per function (logDisk).
func (e *Engine) diskError(name, doing string, err error) error {
	e.logDisk(name, "deploy: this node's files failed", "doing", doing, "error", err)
	var gone *fileutil.GoneError
	if errors.As(err, &gone) && !errors.Is(err, syscall.ENOSPC) && !errors.Is(err, syscall.EDQUOT) {
		return errorf(errdefs.KindUnavailable, err, "deploy %s: %s the bundle failed on this node: %s", name, doing, goneText(gone))
	}
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

// logDisk logs msg, a failure of this node's disk met by a request for
// function name, at ERROR: at most a line a second per function and 20 a
// second in all (netguard.LogThrottle.AllowKey), a line saying how many of the
// function's were held back before it (not_logged). Every request that
// meets a full disk fails with it, at its clients' rate: 300 requests
// wrote 300 lines, past the front door's throttle, to a log that may be
// on that disk.
func (e *Engine) logDisk(name, msg string, attrs ...any) {
	key := errdefs.KeptName(name) // the throttle keeps its keys
	ok, held := e.diskLog.AllowKey(key)
	if !ok {
		return
	}
	attrs = append([]any{"function", key}, attrs...)
	if held > 0 {
		attrs = append(attrs, "not_logged", held)
	}
	e.cfg.Log.Error(msg, attrs...)
}

// inDir runs op, which makes a file or directory in dir, one of this
// node's own made at the server's start (what names it), and runs it
// once more where it failed for dir being gone and dir was made again
// (fileutil.MakeAgain): before, a tmp cleaner's or an operator's rm -rf
// failed every deploy or cold start until a restart. Where dir could not
// be made, the error is a *fileutil.GoneError.
func (e *Engine) inDir(dir, what string, op func() error) error {
	return fileutil.InDir(dir, e.cfg.Log, what, op)
}

// spoolFile is a deploy's spool file, in the spool directory.
func (e *Engine) spoolFile(name string) (*os.File, error) {
	var f *os.File
	err := e.inDir(e.cfg.SpoolDir, "spool", func() (err error) {
		f, err = os.CreateTemp(e.cfg.SpoolDir, "plover-deploy-*")
		return err
	})
	if err != nil {
		return nil, e.diskError(name, "spooling", err)
	}
	return f, nil
}

// verify is Cache.Verify of a deploy's spooled bundle, read from where r
// is; a second try (inDir) reads it from there again, not from where the
// first left off, which would refuse a bundle that is fine.
func (e *Engine) verify(r io.ReadSeeker, check func(*abi.Manifest) error) (dir string, m *abi.Manifest, err error) {
	at, err := r.Seek(0, io.SeekCurrent)
	if err != nil {
		return "", nil, err
	}
	err = e.inDir(e.cfg.Cache.Dir(), "bundle cache", func() (err error) {
		if _, err := r.Seek(at, io.SeekStart); err != nil {
			return err
		}
		dir, m, err = e.cfg.Cache.Verify(r, check)
		return err
	})
	return dir, m, err
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
