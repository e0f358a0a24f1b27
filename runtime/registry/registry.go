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
// version of name. The bundle must already be verified.
func (g Registry) Publish(ctx context.Context, name string, bundleBytes io.ReadSeeker, sha string, size int64) (Version, error) {
	key := bundle.ObjectKey(sha)
	if _, err := g.Store.Stat(ctx, key); errors.Is(err, objectstore.ErrNotFound) {
		if err := g.Store.Put(ctx, key, bundleBytes, size); err != nil {
			return Version{}, fmt.Errorf("publish %s: %w", name, err)
		}
	} else if err != nil {
		return Version{}, fmt.Errorf("publish %s: %w", name, err)
	}
	r, err := g.Get(ctx, name)
	if errors.Is(err, ErrNoFunction) {
		r, err = &Record{Name: name}, nil
	}
	if err != nil {
		return Version{}, err
	}
	v := Version{ID: uuid.NewString(), SHA256: sha, Size: size, Created: time.Now().UTC().Truncate(time.Millisecond)}
	r.Versions = append(r.Versions, v)
	r.Current = v.ID
	if err := g.put(ctx, r); err != nil {
		return Version{}, err
	}
	return v, nil
}

// Delete removes a function's record. Its bundles stay in the store.
func (g Registry) Delete(ctx context.Context, name string) error {
	if _, err := g.Get(ctx, name); err != nil {
		return err
	}
	return g.Store.Delete(ctx, recordKey(name))
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
