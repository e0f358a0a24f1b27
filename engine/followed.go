package engine

import (
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/funclog"
)

// A node may follow the output of a function it has not loaded (plover logs
// --follow sent to it before it ran any request of it). Nothing in the
// table ends those followers when the function is deleted on another node:
// the table forgets only what it loaded (switchTo, dropLocked). So the
// node remembers, for a followed name, the record its followers were made
// in, and Refresh polls those names too; a record gone, or made anew (it
// no longer lists the version remembered), ends the followers, and the
// name's next life, run here or not, starts with an empty log and none of
// them. A name loaded here is left to the table: funclog.ForgetUnsunk
// forgets nothing of a name whose life has a sink.

// followedIn is the record a name's followers were made in: its tag ("":
// not known, read it at the next poll) and its current version then.
type followedIn struct{ tag, version string }

// followedLives is what a node remembers of the names followed here. Its
// lock is taken under the table's (sink, forget) and takes funclog's: a
// follower is made under it (follow), so that what funclog says is
// followed, read under it too, is never older than what it remembers.
type followedLives struct {
	mu sync.Mutex
	m  map[string]followedIn
	// follow drops the entries of names no longer followed once m grows
	// past it: with no polls (--poll 0) nothing else would.
	pruneAt int
}

// remembered is what fl remembers of name now: Logs reads it before it
// reads name's record, and follow makes a follower only if it is unchanged.
func (fl *followedLives) remembered(name string) followedIn {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	return fl.m[name]
}

// inLocked remembers rec (tagged tag) as the record name's followers are
// made in, ending first the followers of an earlier life the record no
// longer lists.
func (fl *followedLives) inLocked(logs *funclog.Store, name string, rec *api.Record, tag string) {
	fl.endEarlierLocked(logs, name, rec)
	if fl.m == nil {
		fl.m = map[string]followedIn{}
	}
	fl.m[strings.Clone(name)] = followedIn{tag: tag, version: rec.Current} // a caller's may be borrowed bytes
}

// followIn is a poll's inLocked: applied only if fl still remembers of name
// what it did when the poll read rec (was; the zero followedIn: nothing),
// for a follower made since may be in a life begun after the poll's read.
func (fl *followedLives) followIn(logs *funclog.Store, name string, rec *api.Record, tag string, was followedIn) {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if fl.m[name].version == was.version { // a tag's change alone is the same life's
		fl.inLocked(logs, name, rec, tag)
	}
}

// follow is Logs' follower of name from since on, made in the life of rec,
// read when fl remembered was of name (any with force). Unless fl still
// does, it makes none (ok false): rec may be a life's that another
// follower, made since in a later life, has replaced, and would end it.
func (fl *followedLives) follow(logs *funclog.Store, name string, rec *api.Record, was followedIn, force bool, since time.Time) (lines []api.LogLine, f *funclog.Follower, ok bool, err error) {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if !force && fl.m[name] != was {
		return nil, nil, false, nil
	}
	fl.inLocked(logs, name, rec, "")
	lines, f, err = logs.Follow(name, since)
	if len(fl.m) > fl.pruneAt {
		fl.pruneLocked(logs.Followed())
		fl.pruneAt = max(64, 2*len(fl.m)) // amortized: one listing per doubling
	}
	return lines, f, true, err
}

// pruneLocked drops what fl remembers of names not followed (followed:
// those that are, funclog's answer under fl.mu).
func (fl *followedLives) pruneLocked(followed []string) {
	keep := make(map[string]bool, len(followed))
	for _, name := range followed {
		keep[name] = true
	}
	for name := range fl.m {
		if !keep[name] {
			delete(fl.m, name)
		}
	}
}

// sink is the output sink of name's function, loaded here from rec (nil:
// not known), under the table's lock. Followers made in an earlier life
// of the name than rec's are ended first, so that they get none of this
// one's output; the table watches the name's life from now on.
func (fl *followedLives) sink(logs *funclog.Store, name string, rec *api.Record) *funclog.Sink {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if rec != nil {
		fl.endEarlierLocked(logs, name, rec)
	}
	delete(fl.m, name)
	return logs.Sink(name)
}

// endEarlierLocked ends the followers of name made in a life rec no
// longer lists (an earlier one: records keep every version until the
// function is deleted).
func (fl *followedLives) endEarlierLocked(logs *funclog.Store, name string, rec *api.Record) {
	if in, ok := fl.m[name]; ok && !lists(rec, in.version) {
		logs.ForgetUnsunk(name)
	}
}

// forget ends name's life here (a delete the table applies, under its
// lock): its lines and followers go, and what fl remembers of it, which
// nothing else would drop without polls.
func (fl *followedLives) forget(logs *funclog.Store, name string) {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	delete(fl.m, name)
	logs.Forget(name)
}

// gone ends name's followers, its record found gone, if it is still
// remembered as it was when the poll decided (was; the zero followedIn:
// not remembered): a follower made in a life begun since is not ended.
func (fl *followedLives) gone(logs *funclog.Store, name string, was followedIn) {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if fl.m[name].version != was.version { // a Logs' tag alone ("") is the same life's
		return
	}
	delete(fl.m, name)
	logs.ForgetUnsunk(name)
}

// toCheck drops what fl remembers of names no longer followed, and returns
// the names followed here, but those loaded here (all of them, as keys of
// mine), and those whose record's tag differs from the one remembered (or
// is not known, or not listed), each with what it remembers of them. A
// name missing from the listing is read too, not taken for gone: the
// listing was taken before the loaded names were refreshed, and a
// follower made since may be of a function made since.
func (fl *followedLives) toCheck(logs *funclog.Store, loaded map[string]bool, tags map[string]string) (mine map[string]bool, changed map[string]followedIn) {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	followed := logs.Followed() // under fl.mu: no follower made since (follow)
	mine = make(map[string]bool, len(followed))
	for _, name := range followed {
		if loaded[name] {
			continue
		}
		mine[name] = true
		in := fl.m[name]
		if tag := tags[name]; tag == "" || tag != in.tag {
			if changed == nil {
				changed = map[string]followedIn{}
			}
			changed[name] = in
		}
	}
	fl.pruneLocked(followed)
	return mine, changed
}

// cmpBool orders false before true.
func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// lists reports whether rec lists the version id: records keep every
// version until the function is deleted, so one that does not is the
// record of a later life of the name.
func lists(rec *api.Record, id string) bool {
	return slices.ContainsFunc(rec.Versions, func(v api.Version) bool { return v.ID == id })
}
