package worker

import (
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/plover-run/plover/device"
)

// Idle pool slots. A burst makes as many pool slots as it has requests in
// flight (up to maxPoolSlots), and a slot once made was kept for its
// worker's life: on the host device the pages its bodies touched stayed
// resident (a burst of 40 requests of 4 MiB in and out left a server 305
// MB of shared memory, for good with min_instances), on a GPU all of it
// stayed pinned, counted against Options.PinLimit, so that other
// functions' slots were refused. So a slot left free for slotIdleBound is
// given back: its worker drops it (wire.OpDropSlot: unpinned, unmapped)
// as it does a discarded slot, the server unmaps it, and the pool counts
// it no more, so that the next burst makes slots again.
//
// The policy (which bound, how often to look) is the sweep's; the
// mechanism (which slots may go, and their going) is the program's
// (trimSlots, dropIdle): a slot lent, or one a run may still be on, is
// never among those taken.

// slotIdleBound is how long a pool slot may stay free before it is given
// back. A slot made again costs a control call (a millisecond or so, and
// on a GPU the pin of its size: some milliseconds for tens of MiB) at most
// once a bound per slot, while one kept costs its memory, pinned on a GPU,
// up to the function's idle_ttl (5 min by default) or for good: 30 s keeps
// the slots of traffic that comes back within half a minute (a client's
// retries, a periodic job every few seconds) and gives back a burst's
// well before its instances idle out. The pool lends the slot freed last
// first, so a steady load keeps as many slots as it has requests at once
// and the rest age out.
const slotIdleBound = 30 * time.Second

// sweepTicks is the watch loop's ticks between sweeps: once a second, so
// that a slot goes within a second past its bound, at the cost of a look
// at each pool's free slots under its lock.
const sweepTicks = int(time.Second / watchEvery)

// poolSet is the programs whose pools made slots, for the sweep: a
// program is added as it makes one (Lend) and taken out by the sweep once
// its pool is dead (closeSlots), so it holds no closed program past a
// sweep.
type poolSet struct {
	mu    sync.Mutex
	progs map[*program]struct{}
}

func (ps *poolSet) add(g *program) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.progs == nil {
		ps.progs = map[*program]struct{}{}
	}
	ps.progs[g] = struct{}{}
}

func (ps *poolSet) remove(g *program) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	delete(ps.progs, g)
}

// list is a copy of the set, for a sweep that takes no lock of the set's
// while it looks at each pool.
func (ps *poolSet) list() []*program {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	l := make([]*program, 0, len(ps.progs))
	for g := range ps.progs {
		l = append(l, g)
	}
	return l
}

// sweepSlots gives back the pool slots of d's programs that have been
// free since before now less the idle bound (Options.slotIdle, else
// slotIdleBound). Called by the watch loop: it waits for no worker, the
// drops going on in the background.
func (d *Device) sweepSlots(now time.Time) {
	idle := d.opts.slotIdle
	if idle <= 0 {
		idle = slotIdleBound
	}
	for _, g := range d.pools.list() {
		if !g.trimSlots(now.Add(-idle)) {
			d.pools.remove(g)
		}
	}
}

// trimSlots takes g's free slots that went free before before out of its
// pool and has its worker drop them, in the background (dropIdle): one
// goroutine for them all, and none where none is idle. Not a slot lent
// (only free ones are looked at) nor one a run may still be on, and none
// while g's worker may be dropping them itself (its program unloaded:
// dropSlots). False once g's pool is dead: nothing of it is ever made
// again.
func (g *program) trimSlots(before time.Time) bool {
	pool := &g.slots
	pool.mu.Lock()
	if pool.dead {
		pool.mu.Unlock()
		return false
	}
	if pool.dropped || !g.p.alive() {
		pool.mu.Unlock()
		return true
	}
	// A pinned slot waits for a moment when its worker runs nothing: its
	// drop unpins it (cuMemHostUnregister), which the driver may hold
	// until the context's kernels end, and a drop past its bound kills the
	// worker, a tenant's with every sibling (not seen on a GPU yet; a run
	// begun during the drop is still that risk).
	busy := g.p.runs.Load() > 0
	var idle []*poolSlot
	pool.free = slices.DeleteFunc(pool.free, func(s *poolSlot) bool {
		if s.freeAt.Before(before) && !s.inRun.Load() && (s.pinned == 0 || !busy) {
			idle = append(idle, s)
			return true
		}
		return false
	})
	if len(idle) > 0 {
		// Out of all as well, as a discarded slot's drop takes it: an
		// unload meanwhile (dropSlots) must not count it dropped twice.
		pool.all = slices.DeleteFunc(pool.all, func(a *poolSlot) bool { return slices.Contains(idle, a) })
	}
	pool.mu.Unlock()
	if len(idle) > 0 {
		go g.dropIdle(idle)
	}
	return true
}

// dropIdle has g's worker drop the idle slots trimSlots took, one call
// each, and forgets each it dropped. At the first it did not, that one and
// the rest go back to the pool's free, whole, as if freed now, and the
// next bound asks again: a channel busy past dropWait or a worker going is
// not the slots' fault, and a device that did not unpin one (the worker
// then keeps it mapped and registered, fit to run on) may next time. Its
// memory then stays as it did before slots were given back, which is
// logged once per program.
func (g *program) dropIdle(idle []*poolSlot) {
	for i, s := range idle {
		err := g.dropInWorker(s, "dropping an idle slot")
		if err == nil {
			g.forgetSlot(s)
			continue
		}
		log := g.d.opts.Log.Debug
		if g.Alive() && !g.closed.Load() && !errors.Is(err, device.ErrNotStarted) {
			g.slots.mu.Lock()
			if !g.slots.refusedIdle {
				log = g.d.opts.Log.Warn
			}
			g.slots.refusedIdle = true
			g.slots.mu.Unlock()
		}
		log("a worker did not drop an idle request slot: it stays in the pool, asked again after the idle bound",
			"function", g.name, "pid", g.p.pid, "error", err)
		for _, s := range idle[i:] {
			g.keepSlot(s, true)
		}
		return
	}
}
