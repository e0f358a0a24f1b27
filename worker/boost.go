package worker

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/plover-run/plover/nicelevel"
	"github.com/plover-run/plover/worker/contain"
)

// A light function's boost. The kernel divides the CPU among the workers'
// groups by weight, which decides how much each gets while all want more,
// but not how soon a worker that wakes gets it: a light function (one
// client, short runs) that shares the machine with a flood at an equal
// weight waits behind the flood's runs for the rest of their slices, its
// request after request. Measured on 2 cores, the CNN at one client
// beside 8 clients of 4 MB vecadd waited 0.4 ms on the run queue per
// request (0.04 alone) and its p99 was 5-16x alone; at 8 times the
// flood's weight, 3.4-4.2x. So a worker whose group used less than half
// of its part of the CPUs in the last window (its weight's part among the
// groups that used any) runs at LightBoost times its weight until it uses
// three quarters of that part: shares still decide between workers that
// all want more (none of them is light), and a worker that turns heavy
// loses the boost within a window, so that a boost buys at most a window
// of more than its share, and waits longer for its next (lightRecord), so
// that boosts taken one after another do not add up to more. What a device scheduler's virtual time gives a
// flow that was idle (it goes first), this gives its worker's threads.
//
// A function's use is its worker's and the server's own CPU time on its
// bytes (Consult): the server's threads move a request's body and answer
// outside the worker's group (with nice levels in the server's process,
// under cgroup v1 in the server's I/O groups), and for a function with
// large bodies and short kernels that is most of what it costs. And a
// flood, a function with two or more runs at once on a device in the
// window (what the device schedulers call no light function), is never
// boosted, whatever its use: on 2 cores the 4 MB vecadd flood's worker used
// about 0.4 CPUs of its part of 1, and with the server's time on its bytes
// 0.5-0.7 (the rest of the CPUs went to its clients and the server), read
// light and ran boosted beside the CNN, whose boost then bought it
// nothing (both workers at nice 1, or both at cpu.shares 8192).

// boostWindow is how often the groups' use is read and their boosts set.
const boostWindow = 250 * time.Millisecond

// groupUse is a group's weight and its CPU use in a window, in CPUs, if
// its use could be read (known), and whether one of its functions flooded
// in the window.
type groupUse struct {
	weight, used float64
	boosted      bool
	known        bool
	flooding     bool
	record       lightRecord
	// io is the server's time on each of the group's functions' bytes in
	// the window, in CPUs (Consult), not yet in used: a function's is
	// shared among the groups that run it (spreadIO).
	io map[string]float64
}

// lightRecord is what a group's past windows say of its next boost: how
// many windows in a row it read light (up to lightForgiven), and how many
// a boost waits for (0: this one alone). A boost that ends makes the next
// wait twice as long (2 light windows at the first), up to maxLightWait,
// and lightForgiven light windows in a row forget the losses: a worker
// that spins only while boosted (it can read its own level) was boosted
// again after one light window following each loss, and ran at 8 times
// its weight every other window: 0.56-0.76 CPUs beside three floods where
// an honest worker took 0.45-0.49 (a review's probe). With the waits, a
// boosted window of spinning costs the next 16 windows once the losses
// add up, in which it reads light (under half its part): over time it
// gets less than its part (at most (boosted + 16 x half its part) / 17,
// and its boosted take is under 8 parts). Whatever ended the boost counts:
// too much use, a flood (a worker can flood its own function) or a use
// that could not be read (it can hide its use in a child whose time is
// lost with it). A light function that turns heavy now and then waits a
// window or two more for its boost.
type lightRecord struct{ light, wait int }

// maxLightWait is the longest wait for a boost, in light windows (4 s);
// lightForgiven, the light windows in a row (16 s) after which a group's
// losses are forgotten: more than maxLightWait, so that a worker that
// spins at each boost never reaches it.
const maxLightWait, lightForgiven = 16, 64

// lightBoosts says which groups run boosted in the next window, and their
// records then: a group using under half its part of cpus (three
// quarters, once boosted) is light, its part its weight's among the
// groups that used any (a group that used almost nothing is reckoned as if
// it were the only idle one among the busy). A light group is newly
// boosted once it has been light for its record's wait. A group with no
// weight (a standby), or whose use is unknown, or that runs a flood, is
// not light: not boosted, its light windows to start again, and its wait
// longer if it was boosted (lightRecord). No group is newly boosted in
// a window in which a boosted one used more than its part: the others
// were held back by it, and read light; a flood boosted while it was idle
// would otherwise hand its boost to the flood beside it, and back, window
// after window. It loses its boost; the next window, read at the weights
// themselves, decides.
func lightBoosts(uses []groupUse, cpus float64) ([]bool, []lightRecord) {
	const idle = 0.01 // CPUs: below this a group is idle
	var busy float64
	for _, u := range uses {
		if u.known && u.used >= idle {
			busy += u.weight
		}
	}
	part := func(u groupUse) float64 {
		among := busy
		if !u.known || u.used < idle {
			among += u.weight
		}
		return cpus * u.weight / among
	}
	held := false
	for _, u := range uses {
		if u.boosted && u.known && u.weight > 0 && u.used > part(u) {
			held = true
		}
	}
	out := make([]bool, len(uses))
	recs := make([]lightRecord, len(uses))
	for i, u := range uses {
		r := u.record
		limit := part(u) / 2
		if u.boosted {
			limit = part(u) * 3 / 4
		}
		// Unknown is not light: a group whose count keeps going down
		// (children reaped where their time is lost) must not keep a
		// boost by it.
		if u.weight > 0 && u.known && !u.flooding && u.used < limit {
			r.light = min(r.light+1, lightForgiven)
			if r.light == lightForgiven {
				r.wait = 0
			}
			out[i] = u.boosted || !held && r.light >= r.wait
		} else {
			r.light = 0
			if u.boosted {
				r.wait = min(max(2*r.wait, 2), maxLightWait)
			}
		}
		recs[i] = r
	}
	return out, recs
}

// LightBoost is how many times its weight a light worker runs at (see
// above); 1 turns the boost off.
const LightBoost = 8

// Functions is what the server knows of the functions its workers run
// that their groups' CPU time does not show (the engine does).
type Functions interface {
	// IOTime is the server's CPU time on name's bytes so far, which its
	// threads spend outside the worker's group.
	IOTime(name string) time.Duration
	// Flooding reports whether name had two or more runs at once on a
	// device within d.
	Flooding(name string, d time.Duration) bool
}

// Consult tells the boost where to learn what fns knows of the functions
// the groups' workers run (nil: nothing). Safe while the boost runs: it
// may be told once the engine exists.
func (g *CPUGroups) Consult(fns Functions) {
	if g == nil {
		return
	}
	if fns == nil {
		g.fns.Store(nil)
		return
	}
	g.fns.Store(&fns)
}

// outsideOf is the server's time on each of names' bytes so far (Consult),
// nil where nothing says, and whether one of them flooded in the last
// window.
func (g *CPUGroups) outsideOf(names []string) (map[string]time.Duration, bool) {
	f := g.fns.Load()
	if f == nil || len(names) == 0 {
		return nil, false
	}
	out := make(map[string]time.Duration, len(names))
	flooding := false
	for _, n := range names {
		out[n] = (*f).IOTime(n)
		flooding = flooding || (*f).Flooding(n, boostWindow)
	}
	return out, flooding
}

// StartBoost starts boosting light workers by factor (1 or less: none),
// until Close, a worker's part being of cpus CPUs (the runtime's choice of
// Go processors: a pod's CPU limit, where NumCPU is the node's; not the
// server's own processors, which it may run more of). Call it once,
// before workers are placed.
func (g *CPUGroups) StartBoost(factor, cpus float64) {
	if g == nil || factor <= 1 || cpus <= 0 || g.nice && !g.lower { // a boost must be taken back
		return
	}
	g.boost, g.cpus = factor, cpus
	g.stopBoost = make(chan struct{})
	g.boostDone = make(chan struct{})
	go g.boostLoop()
}

// LightSlice is the default of plover serve --light-slice: a boosted
// worker's slice, a seventh of the kernel's default on 2 CPUs.
const LightSlice = 100 * time.Microsecond

// LightSlice gives a boosted worker's threads EEVDF slice d, and the
// server's own threads d (nicelevel.SliceProcess), where the weights are
// nice levels and the kernel keeps a slice per thread (Linux 6.12 and
// later); every other worker's threads get the kernel's default. Weights
// decide how much of the CPUs a thread gets; a slice, how soon it runs
// once woken: the kernel lets a running thread finish its slice (1.4 ms
// on 2 CPUs) before a thread that wakes, unless that one asks for a
// shorter slice. A light function's request wakes the server and its
// worker several times, each behind a flood's slice at worst. Call it
// before StartBoost and before workers are placed, with the boost to
// come (a slice is a boosted worker's). It returns "" where slices are in
// force, else why not (logged by the caller), and the error where setting
// the server's threads failed (then none is in force).
func (g *CPUGroups) LightSlice(d time.Duration, factor float64) (off string, err error) {
	switch {
	case g == nil || d <= 0:
		return "--light-slice 0", nil
	case !g.nice:
		return "the workers' CPU weights are not nice levels", nil
	case !g.lower:
		return "nice levels cannot be taken back down here (no CAP_SYS_NICE), so there is no boost", nil
	case factor <= 1:
		return "no light workers' boost (--light-boost 1)", nil
	}
	def := nicelevel.DefaultSlice()
	switch {
	case def == 0:
		return "the kernel keeps no slice per thread (Linux 6.12 and later do), or the server's policy takes none", nil
	case d >= def:
		return fmt.Sprintf("--light-slice %v is not shorter than the kernel's default, %v", d, def), nil
	}
	if err := nicelevel.SliceProcess(d); err != nil {
		nicelevel.SliceProcess(0) // back to the default, where it got to
		return "", fmt.Errorf("the server's threads' slice: %w", err)
	}
	g.slice = d
	return "", nil
}

// Slice is the server's threads' and the boosted workers' EEVDF slice
// (LightSlice), 0 where none is set or the weights turned off.
func (g *CPUGroups) Slice() time.Duration {
	if g == nil || g.off() {
		return 0
	}
	return g.slice
}

// unslice gives the server's threads the kernel's default slice once the
// weights are off (fail), so that workers started from then on, which
// take their slice from the server's thread that starts them and are
// placed in no group, do not keep the light one for good.
func (g *CPUGroups) unslice() {
	if g.slice == 0 {
		return
	}
	if err := nicelevel.SliceProcess(0); err != nil {
		g.log.Warn("the server's threads keep the light workers' short EEVDF slice: they could not be given the default once the weights were off", "error", err)
	}
}

// slicing is the slice c's threads get with their level: the light one
// while boosted (never once the weights are off: unweigh ends the boost),
// under c.mu.
func (c *Group) slicing() slicing {
	if c.g.slice == 0 {
		return slicing{}
	}
	if c.boosted {
		return slicing{c.g.slice, c.g.slice}
	}
	return slicing{0, c.g.slice}
}

// boostLoop reads the groups' use each window and sets their boosts.
func (g *CPUGroups) boostLoop() {
	defer close(g.boostDone)
	tick := time.NewTicker(boostWindow)
	defer tick.Stop()
	cpus := g.cpus
	for {
		select {
		case <-g.stopBoost:
			return
		case now := <-tick.C:
			if g.off() {
				// The weights turned off after a failed write: fail ended
				// every boost, and none begins.
				continue
			}
			g.mu.Lock()
			groups := make([]*Group, 0, len(g.live))
			for c := range g.live {
				groups = append(groups, c)
			}
			g.mu.Unlock()
			g.reboost(groups, now, cpus)
		}
	}
}

// reboost reads each group's use since its last read and sets its boost.
// A group read for the first time counts as idle this window.
func (g *CPUGroups) reboost(groups []*Group, now time.Time, cpus float64) {
	uses := make([]groupUse, len(groups))
	for i, c := range groups {
		uses[i] = c.use(now)
	}
	spreadIO(uses)
	boosts, recs := lightBoosts(uses, cpus)
	g.setBoosts(groups, boosts, recs)
}

// setBoosts gives groups their boosts and records: every worker's own
// level first, then their trees' (walk), so that a worker's large tree
// (a walk took up to a second) holds off none of the others' boosts.
func (g *CPUGroups) setBoosts(groups []*Group, boosts []bool, recs []lightRecord) {
	walks := make([]treeWalk, len(groups))
	for i, c := range groups {
		c.keepRecord(recs[i])
		walks[i] = c.boostTo(boosts[i])
	}
	for i, c := range groups {
		c.walk(walks[i])
	}
}

// spreadIO adds to each group's use its part of the server's time on its
// functions' bytes: a function whose workers are several (one a device, an
// older version draining beside the new one) is charged once, in equal
// parts, since the server does not say which worker a request went to.
// A flood is one for each of its workers.
func spreadIO(uses []groupUse) {
	runs := map[string]int{}
	for _, u := range uses {
		for name := range u.io {
			runs[name]++
		}
	}
	for i := range uses {
		for name, cpus := range uses[i].io {
			uses[i].used += cpus / float64(runs[name])
		}
	}
}

// use is c's weight and CPU use since the last call, its processes' (the
// server's on its functions' bytes in io, for spreadIO), and whether one of
// its functions flooded: unknown on the
// first call, for a process gone, and when the count went down (a process
// of the group ended, its time with it, unless its parent in the group
// reaped it). The reads are made without c.mu: a large tree takes a while.
func (c *Group) use(now time.Time) groupUse {
	c.mu.Lock()
	u := groupUse{weight: c.base, boosted: c.boosted, record: c.record}
	closed, root, names, level := c.closed, c.root, c.names, c.level
	c.mu.Unlock()
	if closed {
		return groupUse{}
	}
	var tree []kin
	if c.g.nice {
		tree = treeOf(c.pid, root)
		c.sessions(tree, level)
	}
	outside, flooding := c.g.outsideOf(names)
	u.flooding = flooding
	t, behind, err := c.cpuTime(tree, level)
	c.catchUp(behind, level)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil || c.closed {
		return u
	}
	if !c.readAt.IsZero() && t >= c.cpu && now.After(c.readAt) {
		window := now.Sub(c.readAt).Seconds()
		u.used, u.known = (t-c.cpu).Seconds()/window, true
		u.io = c.outsideSince(outside, window)
	}
	c.cpu, c.readAt, c.seen = t, now, outside
	return u
}

// outsideSince is what the server spent on each of c's functions' bytes
// since the last read (seen), window seconds ago, in CPUs, of now's
// reading: a function new to the group counts from its next read, and one
// whose count went down (deleted, deployed anew) counts nothing this
// window. Under c.mu.
func (c *Group) outsideSince(now map[string]time.Duration, window float64) map[string]float64 {
	var out map[string]float64
	for name, t := range now {
		if was, ok := c.seen[name]; ok && t > was {
			if out == nil {
				out = make(map[string]float64, len(now))
			}
			out[name] = (t - was).Seconds() / window
		}
	}
	return out
}

// sessions gives the autogroups of c's tree level, at each change
// (walk) and each window (use): a process of the tree that made a
// session of its own (setsid: the worker's seccomp filter refuses it, so
// only where the kernel has no seccomp filters) since would run in a new
// group at nice 0, the server's weight, until the worker's next; and the
// worker's own group, written by a worker that runs a program without
// Landlock (it is dumpable again), would keep what it wrote. In use,
// without c.mu, as its reads: a level set meanwhile may be overwritten by
// the one before it, until the next window. Nothing is read where
// autogroups are not given levels (cgroups, a pod).
func (c *Group) sessions(tree []kin, level int) {
	if !c.g.ag.active() {
		return
	}
	for _, k := range tree {
		if k.pid == c.pid || k.parent == 0 || stillChild(k) {
			c.g.ag.set(k.pid, level)
		}
	}
}

// keepRecord keeps what c's windows say of its next boost (lightBoosts).
func (c *Group) keepRecord(r lightRecord) {
	c.mu.Lock()
	c.record = r
	c.mu.Unlock()
}

// setBoost boosts c, or ends its boost, writing its weight if that
// changed, its tree's included.
func (c *Group) setBoost(on bool) { c.walk(c.boostTo(on)) }

// boostTo is setBoost but for the walk through the tree, which it
// returns.
func (c *Group) boostTo(on bool) treeWalk {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.dying || c.unweighed || on == c.boosted || c.base <= 0 {
		return treeWalk{}
	}
	c.boosted = on
	return c.write(true)
}

// cpuTime is the CPU time the group's processes used so far: the group's
// own count under cgroup v2, and under v1 where cpuacct is mounted with
// cpu; else the sum of its processes' (their own and their reaped
// children's): under v1 those in the group, with nice levels those of
// tree (treeOf: the worker's, and what it left to its PID namespace's
// init). A function that spins in a child of its worker is counted (unless
// the child is reaped where its time is lost: SIGCHLD ignored), as the
// group's weight applies to the whole group.
//
// With nice levels, behind is the processes of tree read at a level other
// than level, the worker's (catchUp): the same read.
func (c *Group) cpuTime(tree []kin, level int) (t time.Duration, behind []kin, err error) {
	switch {
	case c.g.nice:
		pids := make([]int, len(tree))
		for i, k := range tree {
			pids[i] = k.pid
		}
		t, err = sumCPU(pids, func(i int, p procCPU) {
			if c.behind(p.nice, level) {
				behind = append(behind, tree[i])
			}
		})
		return t, behind, err
	case c.g.v2:
		t, err = cgroupV2Usage(filepath.Join(c.dir, "cpu.stat"))
		return t, nil, err
	}
	if b, err := os.ReadFile(filepath.Join(c.dir, "cpuacct.usage")); err == nil {
		ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return time.Duration(ns), nil, err
	}
	b, err := os.ReadFile(filepath.Join(c.dir, "cgroup.procs"))
	if err != nil {
		return 0, nil, err
	}
	var pids []int
	for _, f := range bytes.Fields(b) {
		if pid, err := strconv.Atoi(string(f)); err == nil {
			pids = append(pids, pid)
		}
	}
	t, err = sumCPU(pids, nil)
	return t, nil, err
}

// sumCPU is the CPU time processes pids used; one gone meanwhile counts
// none (the count may go down: that window's use is unknown). each, where
// set, is told each process read, by its index in pids.
func sumCPU(pids []int, each func(i int, p procCPU)) (time.Duration, error) {
	var sum time.Duration
	read := false
	for i, pid := range pids {
		if p, err := cpuParts(pid); err == nil {
			sum, read = sum+p.total(), true
			if each != nil {
				each(i, p)
			}
		}
	}
	if !read {
		return 0, fmt.Errorf("no CPU time readable of pids %v", pids)
	}
	return sum, nil
}

// cgroupV2Usage is a v2 group's usage_usec from its cpu.stat.
func cgroupV2Usage(path string) (time.Duration, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
			us, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: usage_usec: %w", path, err)
			}
			return time.Duration(us) * time.Microsecond, nil
		}
	}
	return 0, fmt.Errorf("%s: no usage_usec", path)
}

// maxTree bounds procTree: a worker's tasks are bounded (--worker-max-pids)
// where pids groups work; where they do not, a fork bomb must not make the
// boost loop's reads, or a weight's write, unbounded.
const maxTree = 1024

// kin is a process of a tree and its parent's pid when it was listed.
type kin struct{ pid, parent int }

// procTree is root and the processes under it, from each thread's children
// list (/proc/PID/task/TID/children), root first.
func procTree(root int) []kin {
	tree := []kin{{root, 0}}
	for i := 0; i < len(tree) && len(tree) < maxTree; i++ {
		pid := tree[i].pid
		tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		for _, t := range tasks {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, t.Name()))
			for _, f := range bytes.Fields(b) {
				if kid, err := strconv.Atoi(string(f)); err == nil && len(tree) < maxTree {
					tree = append(tree, kin{kid, pid})
				}
			}
		}
	}
	return tree
}

// stillChild reports whether k's process is still its parent's child: its
// pid, listed a moment ago, may have been reaped and reused meanwhile.
func stillChild(k kin) bool {
	f, err := statFields(fmt.Sprintf("/proc/%d/stat", k.pid))
	return err == nil && f[1] == strconv.Itoa(k.parent)
}

// clockTick is the unit of /proc/PID/stat's CPU times (USER_HZ, 100 on
// every Linux architecture the server builds for).
const clockTick = 10 * time.Millisecond

// procCPU is what cpuParts reads of a process.
type procCPU struct {
	own, reaped  time.Duration // its own threads' CPU time, its reaped children's
	parent, nice int           // its parent's pid, its (main thread's) nice level
}

// total is the CPU time the process's threads used so far, user and
// system, and its children's that it reaped.
func (p procCPU) total() time.Duration { return p.own + p.reaped }

// cpuParts is process pid's CPU time so far, its own threads' and its
// reaped children's, from /proc/PID/stat, with its parent's pid and nice
// level. Its own are read from its CPU clock where they can be (to the
// nanosecond, where the stat file counts 10 ms ticks: a worker using 0.04
// CPUs read 0 or 0.1 of them in a 100 ms window, and was boosted at
// random).
func cpuParts(pid int) (procCPU, error) {
	f, err := statFields(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procCPU{}, err
	}
	var ticks [4]int64 // utime, stime, cutime, cstime: fields 14 to 17
	for i, s := range f[11:15] {
		if ticks[i], err = strconv.ParseInt(s, 10, 64); err != nil {
			return procCPU{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
	}
	var p procCPU
	if p.parent, err = strconv.Atoi(f[1]); err != nil {
		return procCPU{}, fmt.Errorf("/proc/%d/stat: parent: %w", pid, err)
	}
	if p.nice, err = strconv.Atoi(f[16]); err != nil {
		return procCPU{}, fmt.Errorf("/proc/%d/stat: nice: %w", pid, err)
	}
	own, clocked := processCPU(pid)
	if !clocked {
		own = time.Duration(ticks[0]+ticks[1]) * clockTick
	}
	p.own, p.reaped = own, time.Duration(ticks[2]+ticks[3])*clockTick
	return p, nil
}

// statFields are a /proc stat file's fields from the third on
// (contain.StatFields), at least 17 of them (field 19, the nice level, is
// the 17th).
func statFields(path string) ([]string, error) {
	f, err := contain.StatFields(path)
	if err == nil && len(f) < 17 {
		err = fmt.Errorf("%s: %d fields after the command name", path, len(f))
	}
	return f, err
}

// boostState is a Group's part in the boost: its weight as its function
// sets it, whether it runs boosted, and its last read of its process's CPU
// time. mu orders the boost loop's writes with the worker's own and with
// its exit: once closed, nothing is written (with nice levels its pid may
// come to be another process's). With nice levels a write's walk through
// the tree takes it a process at a time (walk); gen ends the walk of a
// write that a later one superseded.
type boostState struct {
	mu       sync.Mutex
	root     int // nice levels: where the worker's tree starts (Group.Tree)
	base     float64
	names    []string // the functions weighed (setWeight), of which the server tells (Consult)
	function string   // names joined, for the log, should a write fail
	boosted  bool
	record   lightRecord // its windows so far (lightBoosts)
	dying    bool        // Dying was called: it is being killed, no boost
	closed   bool
	gen      uint64 // the writes so far (walk)
	cpu      time.Duration
	readAt   time.Time
	seen     map[string]time.Duration // outside time by function at readAt (outsideOf)
}
