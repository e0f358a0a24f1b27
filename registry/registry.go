// Package registry keeps function records in an object store: which bundle
// versions a function has and which one is current. Bundles themselves are
// content-addressed objects (see package bundle).
package registry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/objectstore"
)

// ErrNoFunction is returned (wrapped) for a function without a record.
var ErrNoFunction = errors.New("no such function")

const recordPrefix = "functions/"

func recordKey(name string) string { return recordPrefix + name + ".json" }

// ErrCorruptRecord is returned (wrapped) for a record whose bytes do not
// decode to the function's record: cut short, over maxRecordRead, or not
// one. Delete still deletes it: short of a repair by hand, the one way
// past it.
var ErrCorruptRecord = errors.New("its record cannot be decoded")

// ErrRecordTooLarge is returned (wrapped) for a change that would make a
// record larger than MaxRecordBytes: it is not written.
var ErrRecordTooLarge = errors.New("its record would be too large")

// A record is read whole and at most maxRecordRead bytes of it: past that
// it does not decode, and every reader of it (a listing of all functions
// among them) fails. Writes stop at MaxRecordBytes, well short of it, so
// that what is written reads back. Each version copies its manifest's
// tensors, so a function with many versions, or many tensors and a few
// versions, reaches it: compact, an ordinary version takes some 200 bytes,
// one declaring the most tensors (abi.MaxTensors a side) a few hundred KB.
const (
	MaxRecordBytes = 4 << 20
	maxRecordRead  = 8 << 20
)

// Registry reads and writes records in one store. The zero Cache reads
// every record on every List; a server keeps one (NewCache). Log gets the
// records a listing passes over (nil: slog's default).
type Registry struct {
	Store objectstore.Store
	Cache *Cache
	Log   *slog.Logger
}

// Cache keeps the records List read, by name with their version tags, so
// that a listing reads only the records that changed since the last one
// (a store listing gives every record's tag): a node with a thousand
// functions lists them in a stat each, not a read and a decode each.
type Cache struct {
	mu   sync.Mutex
	recs map[string]cachedRecord
}

type cachedRecord struct {
	tag string
	rec *api.Record
	bad error // rec is nil: the record at tag does not decode (ErrCorruptRecord)
}

// NewCache returns an empty Cache for a Registry.
func NewCache() *Cache { return &Cache{recs: map[string]cachedRecord{}} }

// get is what was read of name's record if its tag is still tag.
func (c *Cache) get(name, tag string) (cachedRecord, bool) {
	if c == nil || tag == "" {
		return cachedRecord{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	cr, ok := c.recs[name]
	if !ok || cr.tag != tag {
		return cachedRecord{}, false
	}
	return cr, true
}

// keep replaces the cache's records with those of the last listing.
func (c *Cache) keep(recs map[string]cachedRecord) {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.recs = recs
	c.mu.Unlock()
}

// GetTagged reads a function's record and its version tag (the ETag).
func (g Registry) GetTagged(ctx context.Context, name string) (*api.Record, string, error) {
	r, in, err := g.getTagged(ctx, name)
	return r, in.ETag, err
}

// Tags lists every record's version tag by function name, in one listing
// of the store: what a node polls to see which records changed, instead of
// reading each.
func (g Registry) Tags(ctx context.Context) (map[string]string, error) {
	infos, err := g.Store.List(ctx, recordPrefix)
	if err != nil {
		return nil, err
	}
	tags := make(map[string]string, len(infos))
	for _, in := range infos {
		tags[strings.TrimSuffix(strings.TrimPrefix(in.Key, recordPrefix), ".json")] = in.ETag
	}
	return tags, nil
}

// Get reads a function's record.
func (g Registry) Get(ctx context.Context, name string) (*api.Record, error) {
	r, _, err := g.getTagged(ctx, name)
	return r, err
}

// getTagged reads a record and what the store said of it: the ETag its
// next write is conditioned on, and its size; again if it was replaced
// while being read.
func (g Registry) getTagged(ctx context.Context, name string) (*api.Record, objectstore.Info, error) {
	for attempt := 0; ; attempt++ {
		r, in, err := g.readTagged(ctx, name)
		if !errors.Is(err, objectstore.ErrPrecondition) || attempt == casAttempts {
			return r, in, err
		}
		if err := backoff(ctx, attempt); err != nil {
			return nil, objectstore.Info{}, err
		}
	}
}

// backoff waits a little (jittered, longer each attempt) before a read
// again after a lost race: an update's rounds each read up to
// casAttempts times, and without a wait all of them at once.
func backoff(ctx context.Context, attempt int) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Duration(1+rand.IntN(5*(attempt+1))) * time.Millisecond):
		return nil
	}
}

func (g Registry) readTagged(ctx context.Context, name string) (*api.Record, objectstore.Info, error) {
	if !abi.ValidName(name) {
		return nil, objectstore.Info{}, fmt.Errorf("function %q: %w", name, ErrNoFunction)
	}
	rc, info, err := g.Store.GetTagged(ctx, recordKey(name))
	if errors.Is(err, objectstore.ErrNotFound) {
		return nil, objectstore.Info{}, fmt.Errorf("function %s: %w", name, ErrNoFunction)
	}
	if err != nil {
		return nil, objectstore.Info{}, fmt.Errorf("function %s: %w", name, err)
	}
	defer rc.Close()
	var r api.Record
	rr := &recordReader{r: io.LimitReader(rc, maxRecordRead)}
	if err := json.NewDecoder(rr).Decode(&r); err != nil {
		switch {
		case errors.Is(err, objectstore.ErrPrecondition):
			return nil, objectstore.Info{}, fmt.Errorf("function %s: its record was replaced while read: %w", name, err)
		case errors.Is(err, objectstore.ErrNotFound):
			// Deleted between the store's answer and its body (S3: the
			// HEAD, then the GET): gone, as if before the read.
			return nil, objectstore.Info{}, fmt.Errorf("function %s: %w", name, ErrNoFunction)
		case rr.err != nil:
			// The store failed mid-read: the record may well be whole.
			return nil, objectstore.Info{}, fmt.Errorf("function %s: reading its record: %w", name, rr.err)
		case rr.n >= maxRecordRead:
			err = fmt.Errorf("it is larger than the %d bytes a record is read to", maxRecordRead)
		}
		return nil, objectstore.Info{}, corrupt(name, err)
	}
	if r.Name != name {
		return nil, objectstore.Info{}, corrupt(name, fmt.Errorf("it is for %q", r.Name))
	}
	if _, err := r.CurrentVersion(); err != nil {
		err = fmt.Errorf("it names current version %q, which it does not list", r.Current)
		// Every write names a current version (Publish): one that does
		// not (a hand edit) made each listing of the functions fail, for
		// every tenant, where a record that does not decode is passed over.
		return nil, objectstore.Info{}, corrupt(name, err)
	}
	return &r, info, nil
}

// corrupt is the error of name's record that does not decode, for why.
func corrupt(name string, why error) error {
	return fmt.Errorf("function %s: %w (delete the function to recover: plover rm %s): %w", name, ErrCorruptRecord, name, why)
}

// recordReader counts the bytes a record's decoder read and keeps the
// store's own read error apart: a connection cut mid-read is the store
// failing, not a corrupt record, which List passes over.
type recordReader struct {
	r   io.Reader
	n   int64
	err error
}

func (rr *recordReader) Read(p []byte) (int, error) {
	n, err := rr.r.Read(p)
	rr.n += int64(n)
	if err != nil && err != io.EOF {
		rr.err = err
	}
	return n, err
}

// ErrConflict is returned (wrapped) when a record kept changing under an
// update (other writers) for every attempt.
var ErrConflict = errors.New("the function's record kept changing under concurrent updates; retry")

// casAttempts bounds an update's read-modify-write rounds; each lost round
// means another writer's update landed, so progress is made.
const casAttempts = 32

// update applies change to a function's record (nil: none yet) and writes
// it back only if nobody wrote it since it was read, retrying otherwise:
// concurrent deploys and rollbacks from any number of servers and clients
// all land. change returns the record to write, or nil to write nothing.
func (g Registry) update(ctx context.Context, name string, change func(*api.Record) (*api.Record, error)) (*api.Record, error) {
	for attempt := 0; attempt < casAttempts; attempt++ {
		r, in, err := g.getTagged(ctx, name)
		if errors.Is(err, ErrNoFunction) {
			r, err = nil, nil
		}
		if err != nil {
			return nil, err
		}
		next, err := change(r)
		if err != nil || next == nil {
			return r, err
		}
		// Compact: indented, a version declaring many tensors took
		// about four times the bytes.
		b, err := json.Marshal(next)
		if err != nil {
			return nil, fmt.Errorf("function %s: encode record: %w", name, err)
		}
		if err := checkSize(name, in.Size, next, len(b)); err != nil {
			return nil, err
		}
		err = g.Store.PutIf(ctx, recordKey(name), bytes.NewReader(b), int64(len(b)), in.ETag)
		if err == nil {
			return next, nil
		}
		if !errors.Is(err, objectstore.ErrPrecondition) {
			return nil, fmt.Errorf("function %s: write record: %w", name, err)
		}
		// Lost the race: back off a little and read again.
		if err := backoff(ctx, attempt); err != nil {
			return nil, err
		}
	}
	return nil, fmt.Errorf("function %s: %w", name, ErrConflict)
}

// checkSize refuses next, n bytes encoded, over MaxRecordBytes, unless it
// is no larger than the record it replaces (was bytes; 0: none): a
// rollback or an unlabel of a record written larger before the limit
// still lands. Never past maxRecordRead: it would not read back.
func checkSize(name string, was int64, next *api.Record, n int) error {
	if n <= MaxRecordBytes || int64(n) <= min(was, maxRecordRead) {
		return nil
	}
	return fmt.Errorf("function %s: %w: %d versions would take %d bytes, over the %d a record may hold (every version keeps a copy of its manifest's tensors); old versions are not pruned: delete the function (plover rm %s) and deploy it again", name, ErrRecordTooLarge, len(next.Versions), n, MaxRecordBytes, name)
}

// List reads every record, sorted by name: from the Cache where the
// store lists the tag it was read at. The records are shared with the
// cache: callers must not modify them. A record that does not decode is
// passed over and logged (with a Cache, once for each version of it), so
// that one function's record fails no other's listing (every tenant's GET
// /v1/functions, a start's pre-warm); a failing store fails the List.
func (g Registry) List(ctx context.Context) ([]*api.Record, error) {
	recs, _, err := g.list(ctx)
	return recs, err
}

// list is List with the errors of the records it passed over
// (ErrCorruptRecord), for the callers that must not take them for absent:
// their versions may name any bundle.
func (g Registry) list(ctx context.Context) ([]*api.Record, []error, error) {
	infos, err := g.Store.List(ctx, recordPrefix)
	if err != nil {
		return nil, nil, err
	}
	var out []*api.Record
	var bad []error
	seen := make(map[string]cachedRecord, len(infos))
	for _, in := range infos {
		name := strings.TrimSuffix(strings.TrimPrefix(in.Key, recordPrefix), ".json")
		cr, ok := g.Cache.get(name, in.ETag)
		if !ok {
			r, got, err := g.getTagged(ctx, name)
			switch {
			case errors.Is(err, ErrNoFunction):
				continue // deleted since List
			case errors.Is(err, ErrCorruptRecord):
				g.logger().Error("function record passed over", "function", name, "err", err)
				cr = cachedRecord{tag: in.ETag, bad: err}
			case err != nil:
				return nil, nil, err
			default:
				cr = cachedRecord{tag: got.ETag, rec: r}
			}
		}
		seen[name] = cr
		if cr.bad != nil {
			bad = append(bad, cr.bad)
			continue
		}
		out = append(out, cr.rec)
	}
	g.Cache.keep(seen)
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, bad, nil
}

func (g Registry) logger() *slog.Logger {
	if g.Log != nil {
		return g.Log
	}
	return slog.Default()
}

// Publish stores a bundle (if the store lacks it) and makes it the current
// version of the function m names. The bundle must already be verified.
// Unless force is set, a bundle equal to the current version's (same
// sha256) creates no version: the current one is returned with created
// false (its object is still stored again if missing or of another size).
// With force the object is stored again whatever the store holds: the way
// to mend one damaged at its size, which only a node's fetch can tell.
func (g Registry) Publish(ctx context.Context, m *abi.Manifest, bundleBytes io.Reader, sha string, size int64, force bool) (v api.Version, created bool, err error) {
	p, err := g.PublishWith(ctx, m, bundleBytes, sha, size, PublishOptions{Force: force})
	return p.Version, p.Created, err
}

// PublishOptions are how a version is published (Registry.PublishWith).
type PublishOptions struct {
	// Force makes a version of bytes equal to the current version's.
	Force bool
	// Label is recorded with the version (a model repository's version
	// folder, "2"): a bundle equal to the current version's is unchanged
	// only under the same label, so that two version folders of equal
	// bytes still make two versions a request can name.
	Label string
	// Aside adds the version without making it current, unless the
	// function has no version yet (a model repository's lower version
	// folder, deployed after a higher one).
	Aside bool
	// Tenant is recorded with the version (api.Version.Tenant: the
	// deploying token's name, never the token). A bundle equal to the
	// current version's is unchanged only for the same tenant: another
	// token's deploy makes a version of its own, so that the function
	// runs as the tenant who deployed it last.
	Tenant string
	// Bound, where set, bounds each of the publish's store steps on its
	// own: an upload of the bundle at Bound(size), every other step at
	// Bound(0). One bound over the whole publish left a record write
	// after a slow upload that succeeded near it no time of its own.
	// A step cut at its bound fails wrapping ErrPastBound.
	Bound func(upload int64) time.Duration
	// Unpacked is recorded with the version (api.Version.Unpacked): the
	// bundle's files' bytes, as the deploy's check unpacked them.
	Unpacked int64
}

// ErrPastBound is a publish step cut at its PublishOptions.Bound while
// the caller's context was still live.
var ErrPastBound = errors.New("passed its bound")

// step runs f under o.Bound(n) and says which bound cut it.
func (o PublishOptions) step(ctx context.Context, n int64, what string, f func(context.Context) error) error {
	if o.Bound == nil {
		return f(ctx)
	}
	b := o.Bound(n)
	sctx, cancel := context.WithTimeout(ctx, b)
	defer cancel()
	err := f(sctx)
	if err != nil && sctx.Err() != nil && ctx.Err() == nil {
		return fmt.Errorf("%s %w (%v): %w", what, ErrPastBound, b, err)
	}
	return err
}

// Published is what PublishWith did.
type Published struct {
	Version api.Version
	// Created: a version was made (false: the bundle equals the current
	// version's, returned as Version). Current: Version is the
	// function's current one.
	Created, Current bool
	// Record is the record as the publish left it: a node running a
	// version it does not list runs an earlier function of the name,
	// deleted since.
	Record *api.Record
}

// PublishWith is Publish with options.
func (g Registry) PublishWith(ctx context.Context, m *abi.Manifest, bundleBytes io.Reader, sha string, size int64, o PublishOptions) (Published, error) {
	name, force, label, tenant := m.Name, o.Force, o.Label, o.Tenant

	// Bundles are content-addressed, so an object already there is reused;
	// one of the wrong size is damaged and is uploaded again. Damage that
	// keeps the size is caught by the sha256 check when a node fetches it,
	// whose refusal says to deploy again with force, which uploads anew.
	key := bundle.ObjectKey(sha)
	put := func() error {
		return o.step(ctx, size, "the upload to the store", func(ctx context.Context) error {
			return g.Store.Put(ctx, key, bundleBytes, size)
		})
	}
	var info objectstore.Info
	err := o.step(ctx, 0, "the bundle's check in the store", func(ctx context.Context) (err error) {
		info, err = g.Store.Stat(ctx, key)
		return err
	})
	if errors.Is(err, objectstore.ErrNotFound) || (err == nil && (info.Size != size || force)) {
		if err := put(); err != nil {
			return Published{}, fmt.Errorf("publish %s: %w", name, err)
		}
	} else if err != nil {
		return Published{}, fmt.Errorf("publish %s: %w", name, err)
	} else if err := o.step(ctx, 0, "the bundle's touch in the store", func(ctx context.Context) error { return g.Store.Touch(ctx, key) }); errors.Is(err, objectstore.ErrNotFound) {
		// Deleted since the Stat: store it again.
		if err := put(); err != nil {
			return Published{}, fmt.Errorf("publish %s: %w", name, err)
		}
	} else if err != nil {
		// Reused: its grace starts again, so that a delete or gc that read
		// the records before this deploy's record lands keeps it.
		return Published{}, fmt.Errorf("publish %s: %w", name, err)
	}
	var unchanged *api.Version
	var p Published
	// The id is minted once, not at each round of update: a round whose
	// write landed but whose answer was lost (the connection cut after
	// the store committed the PUT; S3's client sends it again and gets
	// 412) is run again on a record that lists it. A fresh id there made
	// a second version, or, the new version being current, found the
	// bytes unchanged and said no version was made.
	id := uuid.NewString()
	var rec *api.Record
	err = o.step(ctx, 0, "the record's write", func(ctx context.Context) (err error) {
		rec, err = g.update(ctx, name, func(r *api.Record) (*api.Record, error) {
			if r == nil {
				r = &api.Record{Name: name}
			}
			if slices.ContainsFunc(r.Versions, func(v api.Version) bool { return v.ID == id }) {
				unchanged = nil // an earlier round's write landed: p.Version is its
				p.Current = r.Current == id
				return nil, nil
			}
			// After the object step, so that an unchanged deploy still
			// repairs a missing or damaged bundle object.
			if cv, err := r.CurrentVersion(); !force && err == nil && cv.SHA256 == sha && cv.Label == label && cv.Tenant == tenant {
				unchanged = &cv
				return fillCopies(r, unchanged, m, o.Unpacked), nil
			}
			unchanged = nil
			v := api.Version{ID: id, SHA256: sha, Size: size, Unpacked: o.Unpacked, Created: time.Now().UTC().Truncate(time.Millisecond), MinInstances: m.MinInstances, MaxInputBytes: m.MaxInputBytes, OutBytes: m.RequestOutBytes(), Tensors: m.Tensors, Share: m.Share, Target: m.Target, Label: label, Tenant: tenant}
			if m.IsPipeline() {
				v.Kind, v.Steps = m.Kind, m.Steps
			}
			if m.Priority != "default" {
				v.Priority = m.Priority
			}
			if cv, err := r.CurrentVersion(); label != "" && err == nil && cv.Label == "" {
				v.Over = cv.ID // a model repository takes over a version made otherwise
			}
			r.Versions = append(r.Versions, v)
			p.Version, p.Current = v, !o.Aside || r.Current == ""
			if p.Current {
				r.Current = v.ID
			}
			return r, nil
		})
		return err
	})
	if err != nil {
		return Published{}, err
	}
	if unchanged != nil {
		return Published{Version: *unchanged, Current: true, Record: rec}, nil
	}
	p.Record = rec
	// A delete of another function may have listed the records before this
	// one landed and removed the bundle as unused (its grace protects a
	// bundle touched or written just now; this covers a shorter grace).
	if err := o.step(ctx, size, "the bundle's check after the record", func(ctx context.Context) error { return g.ensureBundle(ctx, key, bundleBytes, size) }); err != nil {
		return Published{}, fmt.Errorf("publish %s: the record is written but %w", name, err)
	}
	p.Created = true
	return p, nil
}

// fillCopies fills in, on an unchanged deploy of cv, the manifest's copies
// a record written before them lacks (cv's and r's), and returns r to be
// written, or nil where there was none to fill: a pipeline reckons a
// version's outputs by its out_bytes before it is loaded (else at 1 GiB),
// and a front door bounds its bodies by max_input_bytes. An old build's
// node may write the record without them again; a later deploy fills them.
func fillCopies(r *api.Record, cv *api.Version, m *abi.Manifest, unpacked int64) *api.Record {
	lacks := cv.OutBytes == 0 && m.RequestOutBytes() > 0 || cv.MaxInputBytes == 0 && m.MaxInputBytes > 0 || cv.Unpacked == 0 && unpacked > 0
	if m.IsPipeline() || !lacks {
		return nil
	}
	i := slices.IndexFunc(r.Versions, func(v api.Version) bool { return v.ID == cv.ID })
	if i < 0 {
		return nil
	}
	was := r.Versions[i]
	r.Versions[i].OutBytes, r.Versions[i].MaxInputBytes = m.RequestOutBytes(), m.MaxInputBytes
	if r.Versions[i].Unpacked == 0 {
		r.Versions[i].Unpacked = unpacked
	}
	if b, err := json.Marshal(r); err != nil || len(b) > MaxRecordBytes {
		// A deploy that changed nothing does not fail for a record at
		// its bound (or written past it before there was one).
		r.Versions[i] = was
		return nil
	}
	cv.OutBytes, cv.MaxInputBytes, cv.Unpacked = r.Versions[i].OutBytes, r.Versions[i].MaxInputBytes, r.Versions[i].Unpacked
	return r
}

// BundleGrace is how long a bundle written or reused by a deploy is kept
// even when no record names it: a deploy writes (or touches) its bundle,
// then its record, and a delete or gc that listed the records in between
// must not remove the bundle.
const BundleGrace = time.Minute

// Delete removes a function's record, then the bundles only it referenced
// that are older than BundleGrace (younger ones are left to gc). It
// returns the keys of the bundles it deleted. An error after the record
// went (the store failed listing the records, or checking or deleting a
// bundle) wraps ErrBundlesKept: the function is deleted all the same. A
// bundle that fails does not stop the others: each kept is named, the
// failures joined (errors.Join). A record that does not decode is deleted
// all the same, so that its function can be deleted at all; which bundles
// it named is unknown, so they are left to gc. While another record does
// not decode, none of name's bundles is deleted: that record may name them.
func (g Registry) Delete(ctx context.Context, name string) ([]string, error) {
	return g.DeleteIf(ctx, name, nil)
}

// DeleteIf is Delete where cond, given the record as read just before the
// delete (nil for one that does not decode), allows it: its error is
// returned, nothing deleted. The store has no conditional delete, so a
// write landing between that read and the delete is still lost: the
// window is one store call, not the caller's own reads before.
func (g Registry) DeleteIf(ctx context.Context, name string, cond func(*api.Record) error) ([]string, error) {
	r, err := g.Get(ctx, name)
	if err != nil && !errors.Is(err, ErrCorruptRecord) {
		return nil, err
	}
	if cond != nil {
		if err := cond(r); err != nil {
			return nil, err
		}
	}
	if err := g.Store.Delete(ctx, recordKey(name)); err != nil {
		return nil, fmt.Errorf("function %s: delete record: %w", name, err)
	}
	if r == nil {
		return nil, fmt.Errorf("function %s deleted, but %w: its record did not decode, so which bundles it named is unknown", name, ErrBundlesKept)
	}
	others, bad, err := g.list(ctx)
	if err == nil && len(bad) > 0 {
		err = fmt.Errorf("a record that cannot be decoded may name them: %w", errors.Join(bad...))
	}
	if err != nil {
		return nil, fmt.Errorf("function %s deleted, but %w: %w", name, ErrBundlesKept, err)
	}
	used := map[string]bool{}
	for _, o := range others {
		for _, v := range o.Versions {
			used[v.SHA256] = true
		}
	}
	var removed []string
	var kept []error // one per bundle kept: a failure goes on to the others
	for _, v := range r.Versions {
		if used[v.SHA256] {
			continue
		}
		used[v.SHA256] = true // versions may share a bundle
		// Kept if gone already, or just written or reused by a deploy.
		gone, err := g.deleteUnused(ctx, []string{bundle.ObjectKey(v.SHA256)}, BundleGrace)
		deleted := len(gone) > 0
		if cerr := ctx.Err(); cerr != nil && !deleted {
			// Whatever the store said (a not found whose bucket check was
			// cut is no bundle gone), this one and the rest are kept: one
			// line for them, not a failed call each (S3 retries each).
			kept = append(kept, fmt.Errorf("bundle %s and any after it: %w", v.SHA256, cerr))
			break
		}
		if err != nil {
			kept = append(kept, fmt.Errorf("bundle %s: %w", v.SHA256, err))
			continue
		}
		if deleted {
			removed = append(removed, bundle.ObjectKey(v.SHA256))
		}
	}
	if len(kept) > 0 {
		return removed, fmt.Errorf("function %s deleted, but %w: %w", name, ErrBundlesKept, errors.Join(kept...))
	}
	return removed, nil
}

// SetCurrent makes an existing version current (a rollback or roll-forward)
// and returns it with the record as written.
func (g Registry) SetCurrent(ctx context.Context, name, versionID string) (api.Version, *api.Record, error) {
	var found api.Version
	rec, err := g.update(ctx, name, func(r *api.Record) (*api.Record, error) {
		if r == nil {
			return nil, fmt.Errorf("function %s: %w", name, ErrNoFunction)
		}
		switch v, n := r.Find(versionID); {
		case n == 1:
			found, r.Current = v, v.ID
			return r, nil
		case n > 1:
			return nil, fmt.Errorf("function %s: %w: %q is a prefix of %d versions' ids; give more of it (see plover versions %s)", name, ErrNoVersion, versionID, n, name)
		}
		return nil, fmt.Errorf("function %s: %w %q (see plover versions %s)", name, ErrNoVersion, versionID, name)
	})
	return found, rec, err
}

// ErrBundlesKept is returned (wrapped) by Delete when the record is deleted
// (the function is gone) but a bundle only it named could not be checked
// or removed: gc removes it later.
var ErrBundlesKept = errors.New("bundles kept for a later gc")

// ErrNoVersion is returned (wrapped) for a version a record does not list.
var ErrNoVersion = errors.New("no such version")

// Unlabel takes label (a model repository's version folder) off every
// version of name that carries it but the current one: a version whose
// folder went no longer answers by its label. The versions stay in the
// record (rollback by id still reaches them); n is how many lost it in
// this call, and current the record's current version. A call made again
// after one that succeeded finds nothing to take off: n 0.
func (g Registry) Unlabel(ctx context.Context, name, label string) (current string, n int, err error) {
	if label == "" {
		return "", 0, nil
	}
	// The versions an earlier round took the label off, counted again
	// when a later round finds them without it: a round whose write
	// landed but whose answer was lost (the connection cut after the
	// store committed the PUT; S3's client sends it again and gets 412)
	// is run again on a record without the label, and counted none, and
	// the engine unloads this node's versions pinned under the label only
	// for n > 0 (Control.Unlabel): the folder that went kept answering by
	// its number here. Had another writer taken it off in between, the
	// versions did lose it since this call began, which is what a caller
	// acts on. (Labels are set only when a version is made, so a version
	// without one now had it taken off.)
	var took map[string]bool
	_, err = g.update(ctx, name, func(r *api.Record) (*api.Record, error) {
		if r == nil {
			return nil, fmt.Errorf("function %s: %w", name, ErrNoFunction)
		}
		current = r.Current
		now, changed := map[string]bool{}, false
		for i := range r.Versions {
			switch v := &r.Versions[i]; {
			case v.Label == label && v.ID != r.Current:
				v.Label = ""
				now[v.ID], changed = true, true
			case v.Label == "" && took[v.ID]:
				now[v.ID] = true
			}
		}
		took, n = now, len(now)
		if !changed {
			return nil, nil
		}
		return r, nil
	})
	return current, n, err
}

// GC deletes every bundle object that no record's version list names. A
// bundle being published concurrently may be deleted before its record
// lands; grace keeps objects younger than it, by their age read just
// before each delete (a deploy touches a bundle it reuses). It deletes
// nothing while a record does not decode (Delete that function first).
func (g Registry) GC(ctx context.Context, grace time.Duration) ([]string, error) {
	recs, bad, err := g.list(ctx)
	if err != nil {
		return nil, fmt.Errorf("gc: %w", err)
	}
	if len(bad) > 0 {
		// Its bundles are unknown, and may be what a hand repair of it
		// needs: nothing goes until it is deleted.
		return nil, fmt.Errorf("gc: nothing deleted: %d %s that cannot be decoded may name any bundle: %w", len(bad), plural(len(bad), "record", "records"), errors.Join(bad...))
	}
	used := map[string]bool{}
	for _, r := range recs {
		for _, v := range r.Versions {
			used[bundle.ObjectKey(v.SHA256)] = true
		}
	}
	objs, err := g.Store.List(ctx, "bundles/")
	if err != nil {
		return nil, fmt.Errorf("gc: %w", err)
	}
	var removed []string
	// Half-written objects of writers that died (a file store's temporary
	// files) go too, once older than grace.
	if tc, ok := g.Store.(interface {
		CleanTemp(time.Duration) ([]string, error)
	}); ok {
		left, _ := tc.CleanTemp(max(grace, BundleGrace))
		removed = append(removed, left...)
	}
	var unused []string
	for _, o := range objs {
		if !used[o.Key] && time.Since(o.ModTime) >= grace {
			unused = append(unused, o.Key)
		}
	}
	for b := range slices.Chunk(unused, deleteBatch) {
		// Named and aged again, as they are now, under the deletes'
		// marks: a deploy may have reused one (touched it, then written a
		// record naming it) since the listing, while others were deleted.
		deleted, err := g.deleteUnused(ctx, b, grace)
		removed = append(removed, deleted...)
		if errors.Is(err, ErrBundlesKept) {
			return removed, fmt.Errorf("gc deleted %d %s, %w: run gc again", len(removed), plural(len(removed), "bundle", "bundles"), err)
		}
		if err != nil {
			return removed, fmt.Errorf("gc: %w", err)
		}
	}
	// Marks of deletes that died before they removed them.
	marks, err := g.Store.List(ctx, deletingDir)
	if err != nil {
		return removed, fmt.Errorf("gc: %w", err)
	}
	for _, m := range marks {
		if time.Since(m.ModTime) > markStale {
			if err := g.Store.Delete(ctx, m.Key); err != nil {
				return removed, fmt.Errorf("gc: %w", err)
			}
		}
	}
	return removed, nil
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
