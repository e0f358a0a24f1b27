package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/funclog"
	"github.com/plover-run/plover/registry"
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
// lock is taken under the table's (sink) and takes funclog's.
type followedLives struct {
	mu sync.Mutex
	m  map[string]followedIn
}

// followIn remembers rec (tagged tag) as the record name's followers are
// made in; followers of an earlier life the record no longer lists are
// ended first: call it before a new follower is made. A poll's rec (was:
// what was remembered when it read rec) is applied only if nothing was
// remembered since: a follower just made may be in a life begun after
// the poll's read.
func (fl *followedLives) followIn(logs *funclog.Store, name string, rec *api.Record, tag string, was *followedIn) {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	in, ok := fl.m[name]
	if was != nil && in != *was {
		return
	}
	if ok && !lists(rec, in.version) {
		logs.ForgetUnsunk(name)
	}
	if fl.m == nil {
		fl.m = map[string]followedIn{}
	}
	fl.m[strings.Clone(name)] = followedIn{tag: tag, version: rec.Current} // a caller's may be borrowed bytes
}

// sink is the output sink of name's function, loaded here from rec (nil:
// not known), under the table's lock. Followers made in an earlier life
// of the name than rec's are ended first, so that they get none of this
// one's output; the table watches the name's life from now on.
func (fl *followedLives) sink(logs *funclog.Store, name string, rec *api.Record) *funclog.Sink {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if in, ok := fl.m[name]; ok && rec != nil && !lists(rec, in.version) {
		logs.ForgetUnsunk(name)
	}
	delete(fl.m, name)
	return logs.Sink(name)
}

// gone ends name's followers, its record found gone, if it is still
// remembered as it was when the poll decided (was; the zero followedIn:
// not remembered): a follower made in a life begun since is not ended.
func (fl *followedLives) gone(logs *funclog.Store, name string, was followedIn) {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if fl.m[name] != was {
		return
	}
	delete(fl.m, name)
	logs.ForgetUnsunk(name)
}

// toCheck sorts the names that have followers (followed), but those
// loaded here, by the records' tags: it drops what it remembers of names
// no longer followed, and returns the names whose record is gone and
// those whose record changed since (or is not known), each with what it
// remembers of them.
func (fl *followedLives) toCheck(followed []string, loaded map[string]bool, tags map[string]string) (gone, changed map[string]followedIn) {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	keep := make(map[string]bool, len(followed))
	for _, name := range followed {
		keep[name] = true
		if loaded[name] {
			continue
		}
		in := fl.m[name]
		switch tag, ok := tags[name]; {
		case !ok:
			gone = put(gone, name, in)
		case tag == "" || tag != in.tag:
			changed = put(changed, name, in)
		}
	}
	for name := range fl.m {
		if !keep[name] {
			delete(fl.m, name)
		}
	}
	return gone, changed
}

// refreshFollowed is Refresh's part for names followed here and not
// loaded (loaded: those that are, as keys): one store read per changed
// record per poll, whatever the number of followers.
func (e *Engine) refreshFollowed(ctx context.Context, loaded map[string]bool, tags map[string]string) error {
	fl := &e.tab.followed
	gone, changed := fl.toCheck(e.logs.Followed(), loaded, tags)
	for name, was := range gone {
		fl.gone(e.logs, name, was)
	}
	var firstErr error
	for name, was := range changed {
		rec, tag, err := e.tab.reg.GetTagged(ctx, name)
		switch {
		case errors.Is(err, registry.ErrNoFunction):
			fl.gone(e.logs, name, was)
		case err != nil:
			if firstErr == nil {
				firstErr = fmt.Errorf("function %s: reading the record of a function followed here: %w", name, err)
			}
		default:
			fl.followIn(e.logs, name, rec, tag, &was)
		}
	}
	return firstErr
}

func put(m map[string]followedIn, name string, in followedIn) map[string]followedIn {
	if m == nil {
		m = map[string]followedIn{}
	}
	m[name] = in
	return m
}

// lists reports whether rec lists the version id: records keep every
// version until the function is deleted, so one that does not is the
// record of a later life of the name.
func lists(rec *api.Record, id string) bool {
	return slices.ContainsFunc(rec.Versions, func(v api.Version) bool { return v.ID == id })
}
