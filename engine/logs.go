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
	rec, err := c.e.tab.record(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	if !c.e.keepsLogs {
		// Not an empty log: a follower would wait for lines that never come.
		return nil, nil, errorf(errdefs.KindConflict, nil, "function %s: this server keeps no function output: its functions run in the server's own process (--isolation none) and print to the server's stdout and stderr", name)
	}
	if !follow {
		return c.e.logs.Lines(name, since), nil, nil
	}
	// Before the follower is made: followers of an earlier life of the
	// name, deleted and made anew elsewhere, end here.
	c.e.tab.followed.followIn(c.e.logs, name, rec, "", nil)
	lines, f, err := c.e.logs.Follow(name, since)
	if err != nil {
		return nil, nil, errorf(errdefs.KindBusy, err, "function %s: %v: follow with fewer clients, or read without ?follow", name, err)
	}
	// Read again, now that the follower is there: a delete since the read
	// above has forgotten the name's output before the follower was made
	// (a follower no Forget will close), or removes the record after it
	// (its Forget closes it). A delete removes the record first.
	if _, err := c.e.tab.record(ctx, name); err != nil {
		f.Close()
		return nil, nil, err
	}
	return lines, f, nil
}
