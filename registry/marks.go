package registry

// The meeting of a bundle's delete and a deploy that reuses the bundle:
// the delete marks, the deploy checks the marks and stores the bundle
// again if it went.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/objectstore"
)

// ensureBundle stores the bundle again if it is gone, when its bytes can be
// read again. Its error completes "the record is written but ...".
func (g Registry) ensureBundle(ctx context.Context, key string, bundleBytes io.Reader, size int64) error {
	if err := g.awaitDelete(ctx, key); err != nil {
		return fmt.Errorf("whether a delete of its bundle %s is under way could not be checked (deploy again): %w", key, err)
	}
	_, err := g.Store.Stat(ctx, key)
	switch {
	case err == nil:
		return nil
	case !errors.Is(err, objectstore.ErrNotFound):
		// The store failed the check: the bundle may well be there.
		return fmt.Errorf("whether its bundle %s is there could not be checked (deploy again): %w", key, err)
	}
	rs, ok := bundleBytes.(io.ReadSeeker)
	if !ok {
		return fmt.Errorf("its bundle %s is missing (deploy again): %w", key, err)
	}
	if _, err := rs.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("its bundle %s is missing and could not be read again (deploy again): %w", key, err)
	}
	if err := g.Store.Put(ctx, key, rs, size); err != nil {
		return fmt.Errorf("its bundle %s is missing and could not be stored again (deploy again): %w", key, err)
	}
	return nil
}

// A bundle's delete (gc's, or a deleted function's) and a deploy that
// reuses the bundle meet by marks, deleting/<sha256>.<uuid>, one per
// delete, each side writing before it reads what the other wrote: the
// delete writes its mark, then reads the records and the bundle's age (a
// deploy touches the bundle it reuses) before it deletes; the deploy
// touches the bundle and writes its record, then lists the bundle's
// marks. So either the delete sees the record (or, within the grace, the
// touch) and keeps the bundle, or the deploy sees the mark,
// waits until no fresh mark is left, and stores the bundle again if it
// went (ensureBundle). A delete acts only within deleteBound of its mark,
// and a deploy waits on a mark until it is markStale, so a slow delete (a
// store's retries) cannot outlast the wait. Without the marks, a deploy
// that touched, recorded and checked the bundle between a delete's read
// of its age and its delete was acknowledged with its bundle deleted.

// deletingDir holds the marks of the bundle deletes under way.
const deletingDir = "deleting/"

// deletingPrefix is the prefix of the marks of the deletes of bundle key
// under way.
func deletingPrefix(key string) string {
	return deletingDir + strings.TrimSuffix(strings.TrimPrefix(key, "bundles/"), ".tar.zst") + "."
}

// Variables for tests.
var (
	// deleteBound is how long after writing its mark a delete may still
	// delete: past it the bundle is kept (a later gc takes it).
	deleteBound = 30 * time.Second
	// markStale is the age past which a mark is of a delete that can no
	// longer act (twice deleteBound: the nodes' clocks against the
	// store's may differ by the rest): no deploy waits on it, and gc
	// removes it (a delete that died before it removed its mark).
	markStale = time.Minute
)

// deleteBatch is the most bundles one deleteUnused marks at once: its
// marks, a reading of the records, and a stat and a delete each fit well
// within deleteBound at an S3 round trip of 30-50 ms.
const deleteBatch = 64

// deleteUnused deletes each bundle of keys (deleteBatch at most) unless it
// is gone, a record names it, or it was written or touched within grace,
// and returns those it deleted; under marks of its own that a deploy
// reusing one meanwhile waits on. The records are read once for all of
// them: a gc of many unused bundles read them once a bundle.
func (g Registry) deleteUnused(ctx context.Context, keys []string, grace time.Duration) ([]string, error) {
	marked := time.Now() // before the first mark: each delete's bound counts from it
	marks := map[string]string{}
	// Each removed once its bundle is decided, and the rest on return,
	// even when ctx has ended: a mark left makes each deploy of the
	// bundle wait until it is stale. Each removal bounded from its own
	// start: one bound from the first mark ended with a slow reading of
	// the records, and every mark was left.
	unmark := func(key string) {
		if m, ok := marks[key]; ok {
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deleteBound)
			g.Store.Delete(uctx, m)
			cancel()
			delete(marks, key)
		}
	}
	defer func() {
		for key := range marks {
			unmark(key)
		}
	}()
	for _, key := range keys {
		mark := deletingPrefix(key) + uuid.NewString()
		if err := g.Store.Put(ctx, mark, bytes.NewReader(nil), 0); err != nil {
			return nil, err
		}
		marks[key] = mark
	}
	// The records again, under the marks: a deploy whose check of the
	// marks came before them wrote its record before that check, so this
	// reading has it. The age alone let a deploy's reuse go where the
	// grace is 0 or the gc node's clock runs ahead of the store's.
	named, err := g.named(ctx)
	if err != nil {
		return nil, err
	}
	if named == nil {
		// A record that no longer decodes may name any of them (it
		// decoded at the caller's listing).
		return nil, fmt.Errorf("%w: a record that cannot be decoded may name them (the server log names it: function record passed over; plover rm it)", ErrBundlesKept)
	}
	readAt := time.Now()
	// Past its bound (a deploy waits on a mark no longer): the bundles
	// left are kept for a later gc, and said so.
	pastBound := func(deleted []string, note string) error {
		return fmt.Errorf("%d %w: their deletes ran past their bound of %s since marking them (the records took %s to read)%s",
			len(keys)-len(deleted), ErrBundlesKept, deleteBound, readAt.Sub(marked).Round(time.Millisecond), note)
	}
	dctx, cancel := context.WithDeadline(ctx, marked.Add(deleteBound))
	defer cancel()
	var deleted []string
	for _, key := range keys {
		if named[key] {
			unmark(key)
			continue
		}
		in, err := g.Store.Stat(ctx, key)
		switch {
		case errors.Is(err, objectstore.ErrNotFound):
			unmark(key)
			continue
		case err != nil:
			return deleted, err
		case time.Since(in.ModTime) < grace:
			unmark(key)
			continue // reused by a deploy since it was listed
		}
		if dctx.Err() != nil && ctx.Err() == nil {
			// Past its bound before its delete was sent (the records
			// were slow to read): its mark goes with the rest's, no
			// deploy made to wait on it.
			return deleted, pastBound(deleted, "")
		}
		if err = g.Store.Delete(dctx, key); err != nil {
			// Sent, perhaps: a store may carry a delete out after its
			// caller gave up (at its bound, or on an error it answered
			// late). Its mark stays, not removed, so that a deploy
			// reusing the bundle waits on it until it is stale (the
			// margin past deleteBound for such a delete to land), and
			// then stores the bundle again if it went; gc removes the
			// mark after. Unmarked at once, the deploy was acknowledged
			// with the bundle there, and the delete landed under it.
			delete(marks, key)
			if dctx.Err() != nil && ctx.Err() == nil {
				return deleted, pastBound(deleted, "; whether the one cut there went is not known")
			}
			return deleted, err
		}
		unmark(key)
		deleted = append(deleted, key)
	}
	return deleted, nil
}

// named is the bundle keys the records name; nil if a record does not
// decode (it may name any).
func (g Registry) named(ctx context.Context) (map[string]bool, error) {
	recs, bad, err := g.list(ctx)
	if err != nil || len(bad) > 0 {
		return nil, err
	}
	keys := map[string]bool{}
	for _, r := range recs {
		for _, v := range r.Versions {
			keys[bundle.ObjectKey(v.SHA256)] = true
		}
	}
	return keys, nil
}

// awaitDelete returns once no delete of bundle key is under way: no mark
// of one fresher than markStale.
func (g Registry) awaitDelete(ctx context.Context, key string) error {
	prefix := deletingPrefix(key)
	for {
		marks, err := g.Store.List(ctx, prefix)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(marks, func(m objectstore.Info) bool { return time.Since(m.ModTime) < markStale }) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond): // a listing a tenth of a second, only while a delete is under way
		}
	}
}
