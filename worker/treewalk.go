package worker

// With nice levels a worker's CPU weight is the level of every thread of
// every process of its tree (CPUGroups): setting it on the tree, at each
// write (walk) and each boost window's reading (catchUp).

import (
	"errors"

	"github.com/plover-run/plover/nicelevel"
)

// treeWalk is a write's renice of the processes of the worker's tree
// (walk), made once the write let go of c.mu: the level, where the tree
// starts besides the worker (Tree), and the write's generation (gen: 0,
// no walk).
type treeWalk struct {
	gen         uint64
	level, root int
}

// walkTo is the walk to level of the write under way, under c.mu.
func (c *Group) walkTo(level int) treeWalk {
	return treeWalk{gen: c.gen, level: level, root: c.root}
}

// errWalkEnded ends a walk's passes once a later write or the worker's
// exit came.
var errWalkEnded = errors.New("the walk's write was superseded")

// walkingKin is called as a walk comes to each process of the tree, with
// no lock held: a test holds a walk there.
var walkingKin = func(c *Group, k kin) {}

// walk gives the processes of the worker's tree (Tree) w's level: they
// would keep the level they were forked at (a boosted one, say) for
// good. Each is checked to be its parent's child still just before (its
// pid may have been reused); failures are theirs (a child that changed
// its uid), not the weights'. A process listed that forks before its turn
// comes passes the old level to a child the list does not hold, which
// would keep it until the worker's next change (after a boost's end,
// perhaps never: with a pool forking every 1 ms, one pass left 2 to 72 of
// 90 to 167 processes at the old level), so the tree is read again until
// a pass finds every process at the level, and once more where any was
// set (at most reniceRounds passes: a tree that outruns them keeps what
// is left).
//
// It runs without c.mu, taking it a process at a time as catchUp does:
// up to reniceRounds reads of up to maxTree processes, each up to
// reniceRounds passes over its threads, took 20 ms to over a second
// (threads that keep raising their own level), and under c.mu it held
// off the group's boosts and its Dying, and through Dying a kill at a
// deadline, which holds the worker's lock meanwhile (proc.killFor), and
// with it every run's CPU readings (cpuNow). It stops
// once a later write (a weight, a boost, Dying, the weights going off)
// or the worker's exit came: the later write sets the tree itself, or
// nothing is to be set. The worker's own pid the write set under c.mu:
// its reap is ordered by closed (Exited).
func (c *Group) walk(w treeWalk) {
	if w.gen == 0 {
		return
	}
	_, err := nicelevel.Settle(reniceRounds, func() (set bool, _ error) {
		for _, k := range treeOf(c.pid, w.root) {
			if k.pid == c.pid {
				continue
			}
			walkingKin(c, k)
			var s bool
			if !c.walking(w, func() { s = c.reniceKin(k, w.level) }) {
				return set, errWalkEnded
			}
			set = set || s
		}
		return set, nil
	})
	if err != nil || !c.g.ag.active() {
		return
	}
	for _, k := range treeOf(c.pid, w.root) {
		if !c.walking(w, func() { c.sessions([]kin{k}, w.level) }) {
			return
		}
	}
}

// walking runs f under c.mu while w is the last write's walk and the
// group has not ended, and reports whether it did.
func (c *Group) walking(w treeWalk, f func()) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.gen != w.gen {
		return false
	}
	f()
	return true
}

// reniceKin gives process k of the worker's tree level, under c.mu, once
// it is checked to be its parent's child still (its pid may have been
// reused); it reports whether it set any thread. Failures are the
// process's (a child that changed its uid), not the weights'.
func (c *Group) reniceKin(k kin, level int) bool {
	if k.pid != c.pid && k.parent != 0 && !stillChild(k) {
		return false
	}
	set, _ := renice(k.pid, level, c.slicing(), !c.g.lower)
	return set
}

// catchUp gives level, the worker's, to behind, the processes of its
// tree found at another in a window's reading (use), unless the level
// changed meanwhile (the change sets the tree): a process forked as
// walk set its parent copies the parent's old level as the fork
// begins but shows in /proc only as it ends, tens of milliseconds later
// for a large address space (37 ms for 40,000 mappings), after
// walk's last pass: after a boost's end it ran boosted (nice 1 for
// 10) until the worker's next change. The lock is taken a process at a
// time, not for the list: a bundle that keeps raising its own level is
// behind at every window, and its passes must not hold off the group's
// boosts and exits for all of them.
func (c *Group) catchUp(behind []kin, level int) {
	for _, k := range behind {
		if !c.catchUpKin(k, level) {
			return
		}
	}
}

// catchUpKin sets process k to level under c.mu unless the group ended,
// is dying (its weight stands) or changed level; false then.
func (c *Group) catchUpKin(k kin, level int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.dying || c.unweighed || c.level != level {
		return false
	}
	c.reniceKin(k, level)
	return true
}

// behind says whether a process at nice level n is behind level, the
// worker's: where levels only rise, one above it raised its own and is
// left there.
func (c *Group) behind(n, level int) bool { return n != level && (c.g.lower || n < level) }

// treeOf is the process tree of worker pid: the worker and what it
// started, and with a PID namespace (Group.Tree's root) its init and what
// the worker left behind (orphans go to the init; the worker, started
// into the namespace by the server, is the server's child, not the
// init's).
func treeOf(pid, root int) []kin {
	t := procTree(pid)
	if root != 0 && root != pid {
		t = append(t, procTree(root)...)
	}
	return t
}
