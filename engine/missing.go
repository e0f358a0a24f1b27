package engine

import (
	"context"
	"time"

	"github.com/plover-run/plover/errdefs"
)

// bundleMissing is the error of v's bundle that the store says it does
// not have (err): deleted by hand or by a lifecycle rule, by a gc that
// raced a deploy, or with its function by another node's delete that this
// node has not polled yet. The store's 503 would be retried for ever, and
// a retry fetches nothing; the record, read again, says which it is: the
// function gone (404, as after a poll), or a bundle no retry brings back
// (500) until it is deployed again (a deploy of the same bytes stores a
// missing bundle again, registry.Publish).
//
// A record that no longer lists v is a later life of the name (deleted and
// deployed again on another node): this node follows it now, not at its
// next poll, and the client is told to retry (503), which then runs the
// new life. A 500 there told it to deploy a function served elsewhere.
func (e *Engine) bundleMissing(ctx context.Context, v *version, err error) error {
	rec, rerr := e.tab.record(ctx, v.fn.name)
	if rerr != nil {
		return rerr // 404 if gone; the store's 503, or the deadline's 504, if it could not be read
	}
	if !lists(rec, v.rec.ID) {
		if _, ferr := e.tab.follow(ctx, v.fn.name, true); ferr != nil {
			return ferr
		}
		rerr := errorf(errdefs.KindUnavailable, err, "function %s: deleted and deployed again on another node (its bundle %s went with the delete); this node follows the new deploy now: retry", v.fn.name, v.rec.SHA256[:min(12, len(v.rec.SHA256))])
		rerr.RetryAt = time.Now().Add(time.Second)
		return rerr
	}
	return errorf(errdefs.KindInternal, err, "function %s: its bundle %s is missing from the store: deploy it again", v.fn.name, v.rec.SHA256[:min(12, len(v.rec.SHA256))])
}
