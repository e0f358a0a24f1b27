package engine

import (
	"context"
	"errors"
	"syscall"

	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/fileutil"
	"github.com/plover-run/plover/objectstore"
)

// prepareFailed is the error for v's client of a failed preparation of
// its bundle on this node (Cache.Get, or Cache.Recheck of a version loaded
// again), and the refusal to keep where the bundle itself is refused:
// that will not change.
func (e *Engine) prepareFailed(ctx context.Context, v *version, err error) (refused *errdefs.Error, _ error) {
	var fe *bundle.FetchError
	var be *bundle.Error
	switch {
	case errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) || errors.As(err, new(*fileutil.GoneError)):
		// Writing the bundle into the cache failed: the store is fine,
		// and the disk to free or mend is this node's.
		return nil, e.cacheFailed(v, err)
	case errors.As(err, &fe) && errors.Is(ctx.Err(), context.DeadlineExceeded):
		// The request's deadline bounds the fetch: its 504, as for a
		// record read cut by it (readCut), not the store's 503.
		return nil, errorf(errdefs.KindTimeout, err, "function %s: the request's deadline passed while bundle %s was fetched from the store", v.fn.name, v.rec.SHA256[:12])
	case errors.Is(err, bundle.ErrDamagedInUse):
		// The node's disk, not the store: its paths are the log's.
		e.logDisk(v.fn.name, "a cached bundle is damaged and still in use", "version", v.rec.ID, "error", err)
		return nil, errorf(errdefs.KindUnavailable, err, "function %s: bundle %s in this node's cache is damaged and still in use by a loaded version; it is fetched again once that version unloads (the server log says what is damaged)", v.fn.name, v.rec.SHA256[:12])
	case errors.As(err, &fe) && errors.Is(err, objectstore.ErrNotFound):
		return nil, e.bundleMissing(ctx, v, err) // no outage: retries would not mend it
	case errors.As(err, &fe):
		return nil, unavailable(err, "function %s: cannot fetch bundle %s from the store", v.fn.name, v.rec.SHA256[:12])
	case errors.As(err, &be) || isManifestRefusal(err):
		// The bundle itself is refused, its manifest included: that
		// will not change, and it is not fetched again at every
		// request (a 503 a client retries forever).
		why := err.Error()
		if be != nil {
			why = be.Error()
		}
		rf := errorf(refusalKind(err), err, "function %s version %s: %s", v.fn.name, v.rec.ID, why)
		return rf, rf
	default: // local trouble (a read-only disk, a race with eviction): try again later
		return nil, e.cacheFailed(v, err)
	}
}

// cacheFailed is the error of a cold start whose fetch or unpack of v's
// bundle into the bundle cache failed on this node's disk: 507 where the
// disk is full, else 503. The client is told the stage and the errno (and
// the directory, by what it is for, where one removed under the server
// could not be made again); where the node keeps its files is the log's
// alone, at most a line a second per function (logDisk).
func (e *Engine) cacheFailed(v *version, err error) error {
	sha := v.rec.SHA256[:12]
	stage := "preparing" // a fault past Get's writes (a race with eviction)
	var se *bundle.StageError
	if errors.As(err, &se) {
		stage = se.Stage
	}
	why := errnoOf(err)
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		e.logDisk(v.fn.name, "cold start: this node's disk is full", "sha256", sha, "cache", e.cfg.Cache.Dir(), "error", err)
		return errorf(errdefs.KindNoSpace, err, "function %s: cold start: this node's disk is full: %s bundle %s into the node's bundle cache failed (%v)", v.fn.name, stage, sha, why)
	}
	e.logDisk(v.fn.name, "cold start: cannot prepare the bundle on this node", "sha256", sha, "cache", e.cfg.Cache.Dir(), "error", err)
	see := "see the server log" // no errno to tell
	if _, ok := nodeFile(err); ok || errors.As(err, new(syscall.Errno)) {
		see = why.Error() + "; " + see
	}
	var gone *fileutil.GoneError
	if errors.As(err, &gone) {
		return errorf(errdefs.KindUnavailable, err, "function %s: cold start: %s", v.fn.name, goneText(gone))
	}
	return errorf(errdefs.KindUnavailable, err, "function %s: cold start: %s bundle %s into the node's bundle cache failed (%s)", v.fn.name, stage, sha, see)
}
