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
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/objectstore"
)

// Version is one immutable deploy of a function.
type Version struct {
	ID      string    `json:"id"`
	SHA256  string    `json:"sha256"`
	Size    int64     `json:"size"`
	Created time.Time `json:"created"`
	// MinInstances copies the manifest's min_instances so that a starting
	// server can tell which functions to pre-warm without fetching every
	// bundle in the store.
	MinInstances int `json:"min_instances,omitempty"`
}

// Record is a function's entry in the store.
type Record struct {
	Name     string    `json:"name"`
	Current  string    `json:"current"`
	Versions []Version `json:"versions"`
}

// CurrentVersion returns the version Current names.
func (r *Record) CurrentVersion() (Version, error) {
	for _, v := range r.Versions {
		if v.ID == r.Current {
			return v, nil
		}
	}
	return Version{}, fmt.Errorf("function %s: record names current version %q, which it does not list", r.Name, r.Current)
}

// ErrNoFunction is returned (wrapped) for a function without a record.
var ErrNoFunction = errors.New("no such function")

const recordPrefix = "functions/"

func recordKey(name string) string { return recordPrefix + name + ".json" }

// Registry reads and writes records in one store.
type Registry struct{ Store objectstore.Store }

// Get reads a function's record.
func (g Registry) Get(ctx context.Context, name string) (*Record, error) {
	if !abi.ValidName(name) {
		return nil, fmt.Errorf("function %q: %w", name, ErrNoFunction)
	}
	rc, err := g.Store.Get(ctx, recordKey(name))
	if errors.Is(err, objectstore.ErrNotFound) {
		return nil, fmt.Errorf("function %s: %w", name, ErrNoFunction)
	}
	if err != nil {
		return nil, fmt.Errorf("function %s: %w", name, err)
	}
	defer rc.Close()
	var r Record
	if err := json.NewDecoder(io.LimitReader(rc, 8<<20)).Decode(&r); err != nil {
		return nil, fmt.Errorf("function %s: corrupt record: %w", name, err)
	}
	if r.Name != name {
		return nil, fmt.Errorf("function %s: record is for %q", name, r.Name)
	}
	return &r, nil
}

// List reads every record, sorted by name.
func (g Registry) List(ctx context.Context) ([]*Record, error) {
	infos, err := g.Store.List(ctx, recordPrefix)
	if err != nil {
		return nil, err
	}
	var out []*Record
	for _, in := range infos {
		name := strings.TrimSuffix(strings.TrimPrefix(in.Key, recordPrefix), ".json")
		r, err := g.Get(ctx, name)
		if errors.Is(err, ErrNoFunction) {
			continue // deleted since List
		}
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Publish stores a bundle (if the store lacks it) and makes it the current
// version of the function m names. The bundle must already be verified.
// Unless force is set, a bundle equal to the current version's (same
// sha256) creates no version: the current one is returned with created
// false (its object is still stored again if missing or damaged).
func (g Registry) Publish(ctx context.Context, m *abi.Manifest, bundleBytes io.Reader, sha string, size int64, force bool) (v Version, created bool, err error) {
	name := m.Name

	// Bundles are content-addressed, so an object already there is reused;
	// one of the wrong size is damaged and is uploaded again. (Damage that
	// keeps the size is caught by the sha256 check when a node fetches it.)
	key := bundle.ObjectKey(sha)
	info, err := g.Store.Stat(ctx, key)
	if errors.Is(err, objectstore.ErrNotFound) || (err == nil && info.Size != size) {
		if err := g.Store.Put(ctx, key, bundleBytes, size); err != nil {
			return Version{}, false, fmt.Errorf("publish %s: %w", name, err)
		}
	} else if err != nil {
		return Version{}, false, fmt.Errorf("publish %s: %w", name, err)
	}
	r, err := g.Get(ctx, name)
	if errors.Is(err, ErrNoFunction) {
		r, err = &Record{Name: name}, nil
	}
	if err != nil {
		return Version{}, false, err
	}
	// After the object step, so that an unchanged deploy still repairs a
	// missing or damaged bundle object.
	if cv, err := r.CurrentVersion(); !force && err == nil && cv.SHA256 == sha {
		return cv, false, nil
	}
	v = Version{ID: uuid.NewString(), SHA256: sha, Size: size, Created: time.Now().UTC().Truncate(time.Millisecond), MinInstances: m.MinInstances}
	r.Versions = append(r.Versions, v)
	r.Current = v.ID
	if err := g.put(ctx, r); err != nil {
		return Version{}, false, err
	}
	return v, true, nil
}

// Delete removes a function's record, then the bundles only it referenced.
// It returns the keys of the bundles it deleted.
func (g Registry) Delete(ctx context.Context, name string) ([]string, error) {
	r, err := g.Get(ctx, name)
	if err != nil {
		return nil, err
	}
	if err := g.Store.Delete(ctx, recordKey(name)); err != nil {
		return nil, fmt.Errorf("function %s: delete record: %w", name, err)
	}
	others, err := g.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("function %s deleted, but its bundles were kept: %w", name, err)
	}
	used := map[string]bool{}
	for _, o := range others {
		for _, v := range o.Versions {
			used[v.SHA256] = true
		}
	}
	var removed []string
	for _, v := range r.Versions {
		if used[v.SHA256] {
			continue
		}
		used[v.SHA256] = true // versions may share a bundle
		if err := g.Store.Delete(ctx, bundle.ObjectKey(v.SHA256)); err != nil {
			return removed, fmt.Errorf("function %s deleted, but not its bundle %s: %w", name, v.SHA256, err)
		}
		removed = append(removed, bundle.ObjectKey(v.SHA256))
	}
	return removed, nil
}

func (g Registry) put(ctx context.Context, r *Record) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := g.Store.Put(ctx, recordKey(r.Name), bytes.NewReader(b), int64(len(b))); err != nil {
		return fmt.Errorf("function %s: write record: %w", r.Name, err)
	}
	return nil
}

// SetCurrent makes an existing version current (a rollback or roll-forward).
func (g Registry) SetCurrent(ctx context.Context, name, versionID string) (Version, error) {
	r, err := g.Get(ctx, name)
	if err != nil {
		return Version{}, err
	}
	for _, v := range r.Versions {
		if v.ID == versionID || (len(versionID) >= 8 && strings.HasPrefix(v.ID, versionID)) {
			r.Current = v.ID
			if err := g.put(ctx, r); err != nil {
				return Version{}, err
			}
			return v, nil
		}
	}
	return Version{}, fmt.Errorf("function %s: %w %q (see plover versions %s)", name, ErrNoVersion, versionID, name)
}

// ErrNoVersion is returned (wrapped) for a version a record does not list.
var ErrNoVersion = errors.New("no such version")

// GC deletes every bundle object that no record's version list names. A
// bundle being published concurrently may be deleted before its record
// lands; grace keeps objects younger than it.
func (g Registry) GC(ctx context.Context, grace time.Duration) ([]string, error) {
	recs, err := g.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("gc: %w", err)
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
	for _, o := range objs {
		if used[o.Key] || time.Since(o.ModTime) < grace {
			continue
		}
		if err := g.Store.Delete(ctx, o.Key); err != nil {
			return removed, fmt.Errorf("gc: %w", err)
		}
		removed = append(removed, o.Key)
	}
	return removed, nil
}
