package worker

// With nice levels a worker's CPU weight is the level of every thread of
// every process of its tree (CPUGroups): setting it on the tree, at each
// write (reniceTree) and each boost window's reading (catchUp).

import "github.com/plover-run/plover/nicelevel"

// reniceTree gives the processes of the worker's tree (Tree) its level:
// they would keep the level they were forked at (a boosted one, say) for
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
func (c *Group) reniceTree(level int) {
	nicelevel.Settle(reniceRounds, func() (set bool, _ error) {
		for _, k := range c.tree() {
			if k.pid != c.pid && c.reniceKin(k, level) {
				set = true
			}
		}
		return set, nil
	})
	c.sessions(c.tree(), level)
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
// reniceTree set its parent copies the parent's old level as the fork
// begins but shows in /proc only as it ends, tens of milliseconds later
// for a large address space (37 ms for 40,000 mappings), after
// reniceTree's last pass: after a boost's end it ran boosted (nice 1 for
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

// tree is the worker's process tree, under c.mu: the worker and what it
// started, and with a PID namespace (Tree) its init and what the worker
// left behind (orphans go to the init; the worker, started into the
// namespace by the server, is the server's child, not the init's).
func (c *Group) tree() []kin { return treeOf(c.pid, c.root) }

// treeOf is Group.tree for a worker pid and its Tree root.
func treeOf(pid, root int) []kin {
	t := procTree(pid)
	if root != 0 && root != pid {
		t = append(t, procTree(root)...)
	}
	return t
}
