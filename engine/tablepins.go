package engine

import (
	"time"

	"github.com/plover-run/plover/api"
)

// The table's versions beside the current one: those pipelines pinned
// (by id, or by a label a model repository gives its folders' versions),
// and what a current version leaves its successor when it is unloaded.

// labelled notes a deploy that made id, name's latest version with label,
// whose record is rec (nil: none): name's function, if here, takes rec's
// labels, and label names id whatever rec says (match).
func (t *table) labelled(name, label, id string, rec *api.Record) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if f := t.funcs[name]; f != nil {
		f.learn(rec)
		if f.labels == nil {
			f.labels = map[string]string{}
		}
		f.labels[label] = id
	}
}

// unlabel retires f's versions pinned beside the current one that carry
// label but are not id ("": the version current here): a model
// repository's version folder deployed again names its new version from
// now on (match), not a loaded old one. In-flight requests on them finish.
// Where label named another version than id (its labels: match), it names
// none here from now on: the next pin of it reads the record.
func (t *table) unlabel(name, label, id string) {
	t.mu.Lock()
	var olds []*version
	if f := t.funcs[name]; f != nil {
		if id == "" && f.cur != nil {
			id = f.cur.rec.ID
		}
		if f.labels != nil && f.labels[label] != id {
			delete(f.labels, label)
		}
		for k, v := range f.pinned {
			if v.rec.Label == label && v.rec.ID != id {
				olds = append(olds, v)
				delete(f.pinned, k)
			}
		}
	}
	t.mu.Unlock()
	for _, v := range olds {
		v.pool.retire()
	}
}

// detach replaces v, if still current, by an unloaded copy of the same
// version, or drops v if it is a pinned one (the next pin loads it again),
// if may (nil: always) agrees, asked under the table's lock: a request
// finds v or its successor, never neither. A pinned version failing (its
// crashes, its back-off) is replaced by a copy too, which carries that
// record: dropped, the next pin started counting afresh, and a pinned
// version whose plover_instance_init always fails, evicted between its
// requests, failed for ever without backing off. The caller retires v.
func (t *table) detach(f *function, v *version, may func() bool) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	cur := f.cur == v
	if !cur && f.pinned[v.rec.ID] != v || may != nil && !may() {
		return false
	}
	switch {
	case cur:
		f.cur = v.pool.carryTo(t.newVersion(f, v.rec))
	case v.pool.failing(time.Now()):
		pv := v.pool.carryTo(t.newVersion(f, v.rec))
		pv.side.Store(true)
		f.pinned[v.rec.ID] = pv
	default:
		delete(f.pinned, v.rec.ID)
	}
	return true
}

// match is name's function and its version that ref names, current first
// (see function.match); a nil version when this node has none such.
func (t *table) match(name, ref string) (*function, *version) {
	t.mu.Lock()
	defer t.mu.Unlock()
	f := t.funcs[name]
	if f == nil {
		return nil, nil
	}
	return f, f.match(ref)
}

// pin adds rv as a version of f that pipelines pinned, beside its current
// one, unless the table closed, f was dropped or rv is there already.
func (t *table) pin(f *function, rv api.Version, rec *api.Record) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || t.funcs[f.name] != f {
		return
	}
	f.learn(rec) // rv was picked from it: a label names what it says
	if f.match(rv.ID) != nil {
		return
	}
	if f.pinned == nil {
		f.pinned = map[string]*version{}
	}
	pv := t.newVersion(f, rv)
	pv.side.Store(true)
	f.pinned[rv.ID] = pv
}

// side is f's loaded versions that pipelines pinned and are not current.
func (t *table) side(f *function) []*version {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*version
	for _, v := range f.pinned {
		if v.loaded.Load() {
			out = append(out, v)
		}
	}
	return out
}
