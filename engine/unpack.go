package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/errdefs"
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
