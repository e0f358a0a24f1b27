package repository

// Run's loop: when it scans, and, without Poll, what wakes it.

import (
	"context"
	"time"
)

// maxRetry bounds the wait between scans, without Poll, while a model's
// deploy is tried again.
const maxRetry = time.Minute

// Run scans the repository until ctx ends: at once, then every Poll (with
// no Poll, again only while a folder settles, every Settle, while a
// deploy that failed for a reason that may pass is tried again, waiting
// twice as long each time up to a minute, or when an index saw an
// unloaded model's function back in the store). Without Poll, a failed
// write of the state file is tried again alone on that back-off: no scan
// (each acts on every folder, deletes included). As it returns, it waits
// for the writes of the listings indexes took.
func (r *Repository) Run(ctx context.Context) {
	defer r.stop()
	context.AfterFunc(ctx, r.end)
	backoff := r.cfg.Settle
	var settling, retrying bool
	step := stepScan
	for {
		switch step {
		case stepScan:
			select {
			case <-r.kicks: // this scan does what it asked for
			default:
			}
			settling, retrying = r.scan(ctx)
			if ctx.Err() != nil {
				return
			}
			// Not after a scan that could not read DIR (a volume not
			// mounted yet): it found nothing, and ready would be said
			// with an empty index.
			if !settling && r.scanned() {
				r.startOnce.Do(func() { close(r.started) })
			}
		case stepSave:
			r.saveKept()
		}
		unsaved := r.unsaved.Load()
		var wait <-chan time.Time
		var kicks, saves <-chan struct{}
		switch {
		case r.cfg.Poll > 0:
			// Not kicked: a folder loads once two scans a poll apart
			// saw it the same, and a scan in between would shorten that.
			// Each scan writes the state file too.
			wait = time.After(r.cfg.Poll)
		case settling:
			wait, kicks = time.After(r.cfg.Settle), r.kicks
		case retrying || unsaved:
			wait, kicks = time.After(backoff), r.kicks
			backoff = min(2*backoff, max(maxRetry, r.cfg.Settle))
		default:
			kicks, saves = r.kicks, r.saves
		}
		if !retrying && !unsaved {
			backoff = r.cfg.Settle
		}
		step = stepSave
		if r.cfg.Poll > 0 || settling || retrying {
			step = stepScan
		}
		r.idle.Store(wait == nil)
		r.waits.Add(1)
		select {
		case <-ctx.Done():
			return
		case <-wait:
		case <-kicks:
			step = stepScan
		case <-saves:
			// A write failed outside a scan (an unload, an index's
			// listing): the back-off starts now, the write waits for it.
			step = stepNone
		}
		r.idle.Store(false)
	}
}

// What Run's loop does next.
const (
	stepScan = iota // scan, which writes the state file too
	stepSave        // only write the state file, if it failed
	stepNone        // only wait
)

// stop has the writes of the listings indexes took done before Run
// returns (plover serve's shutdown waits for Run): a deletion an index
// saw would be lost, and the restart deploy the model again.
func (r *Repository) stop() {
	r.end()
	r.mu.Lock()
	r.stopped = true
	r.mu.Unlock()
	r.writes.Wait()
}

// end ends the waits for the turn: a load or unload refused then.
func (r *Repository) end() { r.endedOnce.Do(func() { close(r.ended) }) }

// scanned reports whether a scan read DIR.
func (r *Repository) scanned() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.scans > 0
}

// kick has Run's loop scan again (without Poll it waits for this); a
// scan already asked for covers this one.
func (r *Repository) kick() {
	select {
	case r.kicks <- struct{}{}:
	default:
	}
}

// wakeSave has an idle Run (no Poll) try a failed write of the state file
// again after its back-off.
func (r *Repository) wakeSave() {
	select {
	case r.saves <- struct{}{}:
	default:
	}
}
