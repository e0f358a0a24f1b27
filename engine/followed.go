package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/funclog"
	"github.com/plover-run/plover/registry"
)

// A node may follow the output of a function it has not loaded (plover logs
// --follow sent to it before it ran any request of it). Nothing in the
// table ends those followers when the function is deleted on another node:
// the table forgets only what it loaded (switchTo, dropLocked). So the
// table remembers, for such a name, the record its followers were made in,
// and Refresh polls those names too; a record gone, or made anew (it no
// longer lists the version remembered: records keep every version until
// deleted), ends the followers, and the name's next life, run here or
// not, starts with an empty log and none of them.

// followedIn is the record a name's followers were made in: its tag ("":
// not known, read it at the next poll) and its current version then.
type followedIn struct{ tag, version string }

// followIn remembers rec (tagged tag) as the record name's followers are
// made in, unless this node has loaded name (switchTo watches its life).
// Followers of an earlier life the record no longer lists are ended
// first: call it before a new follower is made. A poll's rec (was: what
// was remembered when it read rec) is applied only if nothing was
// remembered since: a follower just made may be in a life begun after
// the poll's read.
func (t *table) followIn(name string, rec *api.Record, tag string, was *followedIn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.funcs[name] != nil {
		delete(t.followed, name)
		return
	}
	in, ok := t.followed[name]
	if was != nil && in != *was {
		return
	}
	if ok && !lists(rec, in.version) {
		t.logs.Forget(name)
	}
	if t.followed == nil {
		t.followed = map[string]followedIn{}
	}
	t.followed[name] = followedIn{tag: tag, version: rec.Current}
}

// sinkLocked is the output sink of name's function, loaded from rec (nil:
// not known), under t.mu. Followers made in an earlier life of the name
// than rec's are ended first, so that they get none of this one's output.
func (t *table) sinkLocked(name string, rec *api.Record) *funclog.Sink {
	if in, ok := t.followed[name]; ok && rec != nil && !lists(rec, in.version) {
		t.logs.Forget(name)
	}
	delete(t.followed, name)
	return t.logs.Sink(name)
}

// followedGone ends name's followers, its record found gone, if name is
// still not loaded here and still remembered as it was when the poll
// decided (was; the zero followedIn: not remembered): a follower made in a
// life begun since is not ended.
func (t *table) followedGone(name string, was followedIn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.funcs[name] != nil || t.followed[name] != was {
		return
	}
	delete(t.followed, name)
	t.logs.Forget(name)
}

// followedToCheck sorts the names that have followers (followed) by the
// records' tags: it drops what it remembers of names no longer followed
// or loaded since, and returns the names not loaded whose record is gone
// and those whose record changed since (or is not known), each with what
// it remembers of them.
func (t *table) followedToCheck(followed []string, tags map[string]string) (gone, changed map[string]followedIn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	keep := make(map[string]bool, len(followed))
	for _, name := range followed {
		if t.funcs[name] != nil {
			continue
		}
		keep[name] = true
		in := t.followed[name]
		switch tag, ok := tags[name]; {
		case !ok:
			gone = put(gone, name, in)
		case tag == "" || tag != in.tag:
			changed = put(changed, name, in)
		}
	}
	for name := range t.followed {
		if !keep[name] {
			delete(t.followed, name)
		}
	}
	return gone, changed
}

// refreshFollowed is Refresh's part for names followed here and not
// loaded: one store read per changed record per poll, whatever the number
// of followers.
func (e *Engine) refreshFollowed(ctx context.Context, tags map[string]string) error {
	gone, changed := e.tab.followedToCheck(e.logs.Followed(), tags)
	for name, was := range gone {
		e.tab.followedGone(name, was)
	}
	var firstErr error
	for name, was := range changed {
		rec, tag, err := e.tab.reg.GetTagged(ctx, name)
		switch {
		case errors.Is(err, registry.ErrNoFunction):
			e.tab.followedGone(name, was)
		case err != nil:
			if firstErr == nil {
				firstErr = fmt.Errorf("function %s: reading the record of a function followed here: %w", name, err)
			}
		default:
			e.tab.followIn(name, rec, tag, &was)
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
