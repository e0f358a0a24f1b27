package engine

import (
	"context"

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
func (e *Engine) bundleMissing(ctx context.Context, v *version, err error) error {
	if _, rerr := e.tab.record(ctx, v.fn.name); rerr != nil {
		return rerr // 404 if gone; the store's 503, or the deadline's 504, if it could not be read
	}
	return errorf(errdefs.KindInternal, err, "function %s: its bundle %s is missing from the store: deploy it again", v.fn.name, v.rec.SHA256[:min(12, len(v.rec.SHA256))])
}
