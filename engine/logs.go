package engine

import (
	"context"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/funclog"
)

// Logs is what function name's workers wrote to stdout and stderr on this
// node from since on (zero: all that is kept), oldest first; with follow,
// also a Follower that receives its later lines from the same instant on
// (the caller closes it). Output is kept for functions run in worker
// processes (--isolation process): a bundle run in the server's own
// process writes to the server's streams.
func (c *Control) Logs(ctx context.Context, name string, since time.Time, follow bool) ([]api.LogLine, *funclog.Follower, error) {
	if !abi.ValidName(name) {
		return nil, nil, notFound(name, nil, "")
	}
	was := c.e.tab.followed.remembered(name) // before the read: see follow
	_, cur := c.e.tab.peek(name)             // before the read: see endIfEarlier
	rec, err := c.e.tab.record(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	if !c.e.keepsLogs {
		// Not an empty log: a follower would wait for lines that never come.
		return nil, nil, errorf(errdefs.KindConflict, nil, "function %s: this server keeps no function output: its functions run in the server's own process (--isolation none) and print to the server's stdout and stderr", name)
	}
	c.e.tab.endIfEarlier(name, rec, cur)
	if !follow {
		return c.e.logs.Lines(name, since), nil, nil
	}
	return c.follow(ctx, name, rec, was, since)
}

// endIfEarlier drops name's function from this node, as a request's load
// would (switchTo), where rec, its record just read, is of a later life
// of the name (it lists not the version loaded here: the function was
// deleted and made anew on another node since this one's last poll): the
// output kept here is the earlier life's, another tenant's perhaps, and
// goes with it. Only if the version loaded is still was, the one loaded
// before rec was read: a record read before a change applied
// here since (a deploy, this node's or another's its poll applied) lists
// not the version it made current, which is no earlier life's; was,
// unlisted in a record read after it was current, is.
func (t *table) endIfEarlier(name string, rec *api.Record, was *version) {
	olds := func() []*version {
		t.mu.Lock()
		defer t.mu.Unlock() // see mu: dropLocked calls out
		if f := t.funcs[name]; was == nil || f == nil || f.cur != was || lists(rec, was.rec.ID) {
			return nil
		}
		olds := t.dropLocked(name)
		t.epoch++
		return olds
	}()
	for _, v := range olds {
		v.pool.retire()
	}
}

// follow is Logs' follower of name, whose record rec was read when the
// node remembered was of the name's followers. Followers of an earlier
// life of the name, deleted and made anew elsewhere, end as it is made.
// Unless the node still remembers was, rec may be older than the life of
// a follower made since, which it would end: it reads the record again
// (past a few tries, changes keep coming: it takes what it read).
func (c *Control) follow(ctx context.Context, name string, rec *api.Record, was followedIn, since time.Time) ([]api.LogLine, *funclog.Follower, error) {
	fl := &c.e.tab.followed
	for attempt := 1; ; attempt++ {
		lines, f, ok, err := fl.follow(c.e.logs, name, rec, was, attempt >= 3, since)
		if err != nil {
			return nil, nil, errorf(errdefs.KindBusy, err, "function %s: %v: follow with fewer clients, or read without ?follow", name, err)
		}
		if ok {
			// Read again, now that the follower is there: a delete since
			// the read above has forgotten the name's output before the
			// follower was made (a follower no Forget will close), or
			// removes the record after it (its Forget closes it). A
			// delete removes the record first.
			if _, err := c.e.tab.record(ctx, name); err != nil {
				f.Close()
				return nil, nil, err
			}
			return lines, f, nil
		}
		was = fl.remembered(name)
		if rec, err = c.e.tab.record(ctx, name); err != nil {
			return nil, nil, err
		}
	}
}
