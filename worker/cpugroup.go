package worker

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/nicelevel"
	"github.com/plover-run/plover/worker/contain"
)

// CPUGroups gives each worker process a CPU weight that follows its
// function's share and priority, so that the OS divides the CPU among
// workers as the device scheduler divides the device: a worker that spins
// threads beyond its runs takes them out of its own weight, not its
// neighbours'. Where cgroups can be written, each worker gets a cgroup of
// its own (v1 cpu.shares or v2 cpu.weight), created when it takes a
// function and removed when it is gone. Where they cannot (a container, a
// pod, a hierarchy without the cpu controller delegated), every thread of
// the worker gets a nice level instead, which any process may raise for
// its own children: CFS weighs threads by nice level (nice 0 = 1024, each
// level about 1.25x less), so the levels carry the same ratios, within a
// level's 25%, from nice 10 for a default function down to 0 and up to
// 19 (the server stays at 0: the front door above every function but the
// heaviest). Mechanism says which is in force.
type CPUGroups struct {
	home string // the group the server was in, which holds dir
	dir  string // the server's parent group, plover-<server pid>
	file string // "cpu.shares" (v1) or "cpu.weight" (v2)
	v2   bool
	nice bool // no cgroups: nice levels per worker thread
	// With nice levels: the server's own level, below which no worker
	// goes, and whether a level may be taken back down once raised
	// (CAP_SYS_NICE). Without, a level only rises: a standby stays at the
	// server's level, and a worker whose weight grows keeps the level it
	// has.
	base  int
	lower bool
	// ag gives each worker's autogroup its level too, where the kernel
	// schedules sessions as groups (autogroup.go).
	ag  *autogroups
	log *slog.Logger

	mu     sync.Mutex
	broken error // set once a write failed: logged once, then every worker at the server's weight (fail)
	// isOff is broken != nil, read without mu: the server's I/O asks
	// (On, Slice) for every piece it moves.
	isOff   atomic.Bool
	threads *ThreadGroups // the server's threads' groups (Threads), once asked for
	live    map[*Group]struct{}

	// The light workers' boost (StartBoost): its factor, and its loop's
	// stop and end.
	boost     float64
	cpus      float64 // what a worker's part is of (StartBoost)
	stopBoost chan struct{}
	boostDone chan struct{}
	// The light workers' EEVDF slice (LightSlice); 0: slices are left
	// alone. Set before any worker is placed, then only read.
	slice time.Duration
	// fns tells what the server knows of the workers' functions
	// (Consult).
	fns atomic.Pointer[Functions]
	// passed is the controllers the server passed down from its home group
	// (passDown, cgroup v2), not passed there before: Close takes them
	// back (under mu).
	passed []string
}

// Where cgroup hierarchies are mounted and where the kernel says which
// groups this process is in (variables for tests).
var (
	cgroupRoot     = "/sys/fs/cgroup"
	procSelfCgroup = "/proc/self/cgroup"
)

// NewCPUGroups finds the machine's cgroup CPU controller and makes the
// server's group inside the one the server runs in (a systemd unit's, say:
// delegate it the cpu controller), moving the server into a subgroup of
// its own; where there is none it can use, it falls back to nice levels
// (logged, with the reason).
func NewCPUGroups(log *slog.Logger) *CPUGroups { return NewCPUGroupsAt(cgroupRoot, log) }

// NewCPUGroupsAt is NewCPUGroups with the cgroup hierarchy mounted at root,
// for workers of the server's own uid.
func NewCPUGroupsAt(root string, log *slog.Logger) *CPUGroups {
	return NewCPUGroupsFor(root, os.Geteuid(), log)
}

// NewCPUGroupsFor is NewCPUGroupsAt for workers that run as uid workerUID
// (--worker-user): where the weights would be nice levels the server may
// set on none of them (reniceable), they are off from the start, logged
// with why.
func NewCPUGroupsFor(root string, workerUID int, log *slog.Logger) *CPUGroups {
	cgroupRoot = root
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if g := newCgroups(log); g != nil {
		return g
	}
	g := &CPUGroups{nice: true, log: log}
	if err := reniceable(workerUID); err != nil {
		g.broken = err
		g.isOff.Store(true)
		log.Warn("worker CPU weights off: they would be nice levels (cgroups cannot be written here; see the line before), but the server may set none on its workers; every worker runs at the server's weight", "error", err)
		return g
	}
	g.ag = newAutogroups(log)
	g.base, g.lower = nicelevel.Probe()
	if g.lower {
		log.Info("worker CPU weights by nice level: each worker's threads get a nice level that follows its function's share and priority (cgroups cannot be written here; see the line before)")
	} else if g.base >= 19 {
		log.Info("worker CPU weights by nice level: none in effect, the server runs at nice 19 and no worker can be given a level above it (cgroups cannot be written here; see the line before)", "server_nice", g.base)
	} else {
		log.Info("worker CPU weights by nice level, raised only: each worker's threads get the nice level of its function's share and priority, but a level cannot be taken back down here (no CAP_SYS_NICE), so standby workers stay at the server's level, a worker whose weight grows keeps the level it has, and light workers get no boost (cgroups cannot be written here; see the line before)",
			"server_nice", g.base)
	}
	return g
}

// reniceable says why this process may not set the nice level of a
// process of uid at all, nil where it may: the kernel lets one process set
// another's level only where the other has its effective uid (as real or
// effective uid) or where it holds CAP_SYS_NICE (set_one_prio; the
// scheduler's setters likewise). A root server without the capability (a
// container's default set) whose workers run as --worker-user got EPERM at
// the first function's weight, and the weights went off then, after its
// start log had said they were on.
func reniceable(uid int) error {
	if uid == os.Geteuid() || nicelevel.HasCap(unix.CAP_SYS_NICE) {
		return nil
	}
	return fmt.Errorf("the workers run as uid %d and the server as uid %d without CAP_SYS_NICE, and the kernel lets a process set another's nice level only where it has its uid or that capability: give the server CAP_SYS_NICE (docker run --cap-add SYS_NICE), run it as the workers' user, or give it cgroups it can write", uid, os.Geteuid())
}

// Mechanism says how worker CPU weights are applied: "cgroup v2", "cgroup
// v1", "nice", or "off" (nil, or turned off after a failure).
func (g *CPUGroups) Mechanism() string {
	switch {
	case g == nil || g.off():
		return "off"
	case g.nice:
		return "nice"
	case g.v2:
		return "cgroup v2"
	}
	return "cgroup v1"
}

// OffReason says why the weights are off ("" while they are on): the
// failure that turned them off, or the flag. An operator reading /healthz
// sees "off" and why, not only the start log's line.
func (g *CPUGroups) OffReason() string {
	if g == nil {
		return "turned off (--cpu-weights=false)"
	}
	if !g.off() {
		return ""
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.broken.Error()
}

// newCgroups is NewCPUGroups's cgroup controller, or nil (logged).
func newCgroups(log *slog.Logger) *CPUGroups {
	name := fmt.Sprintf("plover-%d", os.Getpid())
	var g *CPUGroups
	if ctl, err := os.ReadFile(filepath.Join(cgroupRoot, "cgroup.controllers")); err == nil {
		if !slices.Contains(strings.Fields(string(ctl)), "cpu") {
			log.Warn("worker CPU weights: the cgroup v2 hierarchy has no cpu controller", "controllers", strings.TrimSpace(string(ctl)))
			return nil
		}
		g = &CPUGroups{file: "cpu.weight", v2: true, log: log}
		g.home = filepath.Join(cgroupRoot, OwnGroup(""))
	} else if _, err := os.Stat(filepath.Join(cgroupRoot, "cpu", "cpu.shares")); err == nil {
		g = &CPUGroups{file: "cpu.shares", log: log}
		g.home = filepath.Join(cgroupRoot, "cpu", OwnGroup("cpu"))
	} else {
		log.Warn("worker CPU weights: no cgroup cpu controller found", "root", cgroupRoot)
		return nil
	}
	g.dir = filepath.Join(g.home, name)
	sweep(g.home, log)
	if err := os.Mkdir(g.dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		log.Warn("worker CPU weights: cannot create a cgroup", "dir", g.dir, "error", err)
		return nil
	}
	if g.v2 {
		if err := g.passDown("cpu"); err != nil {
			log.Warn("worker CPU weights: cannot enable the cpu controller", "error", err)
			os.Remove(g.dir)
			return nil
		}
	}
	// The server itself (HTTP, the device schedulers) gets the largest
	// weight, above any function's (Place caps those at half of it), so
	// that heavy workers cannot starve the front door that admits
	// everyone's runs; workers it starts leave for their own groups when
	// they take a function.
	if err := g.writeGroup(filepath.Join(g.dir, "server"), os.Getpid(), strconv.Itoa(int(g.units().hi))); err != nil {
		log.Warn("worker CPU weights: cannot place the server in a cgroup", "error", err)
		os.Remove(filepath.Join(g.dir, "server"))
		os.Remove(g.dir)
		return nil
	}
	log.Info("worker CPU weights on", "cgroup", g.dir, "file", g.file)
	return g
}

// OwnGroup is this process's cgroup path in the v1 hierarchy of
// controller ("": the v2 hierarchy's) as /proc/self/cgroup says; "/" when
// it says nothing usable. The server's groups are made in it.
func OwnGroup(controller string) string {
	b, err := os.ReadFile(procSelfCgroup)
	if err != nil {
		return "/"
	}
	path, ok := procGroup(string(b), func(v2 bool, ctls []string) bool {
		if controller == "" {
			return v2
		}
		return slices.Contains(ctls, controller)
	})
	if !ok {
		return "/"
	}
	return path
}

// sweep removes the groups under parent of servers that are gone (killed
// before their Close), first killing what is left in them (emptyGroup):
// without PID namespaces (subreapers) what a dead server's workers
// started outlives them, and the next server's EndLeftovers finds it only
// by the tag in its argv, which a child that rewrote its argv or ran
// another program no longer carries, while the worker's groups still hold
// it. A group holding a process that does not die stays, logged. The pids
// are read from groups only a dead server made, each checked to be in its
// group through a pidfd before the kill. Except: a server in a PID
// namespace of its own that shares the hierarchy (a container) names its
// groups by a pid this one may not see, though it sees the server's
// process in its server group, plover-<pid>/server: groups whose server
// group holds a process are left alone, whatever they hold. servers are
// other hierarchies to look for that group in (cpu's, for pids and
// memory, whose server stays in its home group).
func sweep(parent string, log *slog.Logger, servers ...string) {
	servers = append([]string{parent}, servers...)
	des, _ := os.ReadDir(parent)
	for _, de := range des {
		pid, ok := strings.CutPrefix(de.Name(), "plover-")
		if n, err := strconv.Atoi(pid); !ok || err != nil || !de.IsDir() || !contain.Exited(n) {
			continue
		}
		dir := filepath.Join(parent, de.Name())
		if slices.ContainsFunc(servers, func(p string) bool { return populated(filepath.Join(p, de.Name(), "server")) }) {
			log.Warn("the cgroups of a server that looks gone are left alone: a process is in its server group (a server under another PID namespace, or one it started that outlived it)", "dir", dir)
			continue
		}
		if err := emptyGroups(dir); err != nil {
			log.Warn("a killed server's leftover processes could not all be ended: their cgroups stay", "dir", dir, "error", err)
		}
		removeGroups(dir)
	}
}

// populated reports whether cgroup.procs of group dir names a process.
func populated(dir string) bool {
	b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	return len(strings.TrimSpace(string(b))) > 0
}

// emptyGroups kills the processes in group dir and in the groups in it
// (emptyGroup), and returns once they are gone, or what failed.
func emptyGroups(dir string) error {
	err := emptyGroup(dir) // under v2 its cgroup.kill ends the groups in it too
	kids, _ := os.ReadDir(dir)
	for _, k := range kids {
		if k.IsDir() {
			err = errors.Join(err, emptyGroup(filepath.Join(dir, k.Name())))
		}
	}
	return err
}

// removeGroups removes group dir and the groups in it, those that hold no
// process (a group that holds one, or holds one that does, stays).
func removeGroups(dir string) {
	kids, _ := os.ReadDir(dir)
	for _, k := range kids {
		if k.IsDir() {
			os.Remove(filepath.Join(dir, k.Name()))
		}
	}
	os.Remove(dir)
}

// Weight is a function's CPU weight relative to a default function's 1:
// its share, times 8 for the latency class and over 8 for batch, so that
// a latency function's worker wins the CPU as its runs win the device.
func Weight(m *abi.Manifest) float64 { return WeightOf(m.Weight(), m.Priority) }

// WeightOf is Weight for a share (> 0) and a priority ("" is default).
func WeightOf(share float64, priority string) float64 {
	switch priority {
	case "latency":
		return share * 8
	case "batch":
		return share / 8
	}
	return share
}

// The controllers' units: a default function's weight (1 in Weight's
// terms), and the smallest and largest a group may have.
var (
	unitsV1 = units{one: 1024, lo: 2, hi: 262144} // cpu.shares
	unitsV2 = units{one: 100, lo: 1, hi: 10000}   // cpu.weight
)

type units struct{ one, lo, hi float64 }

func (g *CPUGroups) units() units {
	if g.v2 {
		return unitsV2
	}
	return unitsV1
}

// value is function weight w in the controller's units: at least its
// smallest and at most half its largest, which is the server's.
func (g *CPUGroups) value(w float64) string {
	u := g.units()
	return strconv.Itoa(int(math.Min(u.hi/2, math.Max(u.lo, math.Round(u.one*w)))))
}

// Place moves process pid into a group of its own with CPU weight w (a
// default function's 1; 0 is the smallest there is) and returns it, or nil
// when there is none. Moving a process between groups is the costly step
// (the kernel waits for every CPU to pass a grace period), so a worker is
// placed once, when it starts, and re-weighed (Group.Weigh) when it takes
// a function. The caller holds what keeps pid from being reaped meanwhile
// (a pid must not be written once it may have been reused). A process
// already gone is no failure; another failure is logged once and turns
// the weights off (fail). Once they are off a worker is left where it was
// born, in the server's group at the server's nice level, as with the
// weights off from the start.
func (g *CPUGroups) Place(pid int, w float64) *Group {
	if g == nil || g.off() {
		return nil
	}
	c := &Group{g: g, pid: pid}
	c.base = w
	if g.nice {
		c.level = g.base      // inherited from the server
		if w > 0 || g.lower { // a standby that could not come back down stays
			c.setWeight(w, nil)
		}
	} else {
		var err error
		c.dir, err = makeGroup(filepath.Join(g.dir, strconv.Itoa(pid)))
		if errors.Is(err, errGroupsLeft) {
			g.log.Warn("a worker without a CPU weight", "pid", pid, "error", err)
			return nil
		}
		if err == nil {
			err = g.writeGroup(c.dir, pid, g.value(w))
		}
		if err != nil {
			os.Remove(c.dir)
			if !errors.Is(err, syscall.ESRCH) {
				g.fail(nil, fmt.Errorf("place worker %d: %w", pid, err), "cannot place a worker in a cgroup", "pid", pid)
			}
			return nil
		}
	}
	g.mu.Lock()
	if g.live == nil {
		g.live = map[*Group]struct{}{}
	}
	g.live[c] = struct{}{}
	off := g.broken != nil
	g.mu.Unlock()
	if off {
		// The weights went off while this one was being placed, after
		// fail's sweep had read the live groups: it is its own sweep.
		c.unweighNow()
	}
	return c
}

// On reports whether the workers' CPU weights are in force: not turned off
// (nil), nor off since a write failed.
func (g *CPUGroups) On() bool { return g != nil && !g.off() }

func (g *CPUGroups) off() bool { return g.isOff.Load() }

// fail turns the weights off, saying why once, and gives every live
// worker but self (whose write failed: the caller holds its mu and
// unweighs it) the server's weight. Off must mean what it means from the
// start, where every worker weighs as the server: workers placed from now
// on stay in the server's group at its weight, and the ones weighed
// before, kept at their functions' weights, would get a 256th of a new
// one's CPU under cgroup v1 (a default function's 1024 cpu.shares beside
// the server's group's 262144), a ninth with nice levels (10 against 0).
// No g.mu is held while the groups' are taken: a group's mu is held
// while it calls fail.
func (g *CPUGroups) fail(self *Group, err error, msg string, args ...any) {
	g.mu.Lock()
	if g.broken != nil {
		g.mu.Unlock()
		return
	}
	g.broken = err
	g.isOff.Store(true)
	g.log.Warn("worker CPU weights off: "+msg+"; every worker runs at the server's weight from now on", append(args, "error", err)...)
	live := make([]*Group, 0, len(g.live))
	for c := range g.live {
		if c != self {
			live = append(live, c)
		}
	}
	g.mu.Unlock()
	g.unslice()
	for _, c := range live {
		c.unweighNow()
	}
}

// Group is one worker's cgroup, or its process with nice levels.
type Group struct {
	g     *CPUGroups
	dir   string // cgroups
	pid   int
	level int // nice levels: the worker's, as last set (under mu)
	// unweighed: the weights are off and the group was given the server's
	// weight (unweigh), which stands (under mu).
	unweighed bool
	boostState
}

// Weigh sets the group's weight for m's function (Weight); once the
// weights are off, the server's weight stands (unweigh). A group gone
// with its process is no failure.
func (c *Group) Weigh(m *abi.Manifest) {
	c.setWeight(Weight(m), []string{m.Name})
}

// Dying gives the group a default function's weight, unboosted, for good:
// a worker killed while a standby, at the smallest weight, would otherwise
// take seconds to exit on a busy machine (measured: over 2 s), and its
// stage, group and pid with it; one killed while boosted would run at 8
// times a default function's weight until emptied (README: a group being
// killed is not boosted).
func (c *Group) Dying() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.base, c.dying, c.boosted = 1, true, false
		// Its tree is being killed: no walk through it, not even the one
		// the weights going off would make (unweigh), which would hold
		// the kill's caller (proc.killFor holds the worker's lock).
		_ = c.write(false)
	}
}

// Tree says where the processes the worker leaves behind go, for nice
// levels: its PID namespace's init (contain.Tree.Root), or the worker
// itself (the default).
func (c *Group) Tree(root int) {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.root = root
	c.mu.Unlock()
}

// setWeight sets the weight of the functions the worker runs, names (its
// boost, if it has one, on top).
func (c *Group) setWeight(w float64, names []string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	if c.closed || c.dying { // Dying's weight stands
		c.mu.Unlock()
		return
	}
	c.base, c.names, c.function = w, names, strings.Join(names, ",")
	walk := c.write(true)
	c.mu.Unlock()
	c.walk(walk)
}

// setNames sets the functions the worker runs, of which the boost asks
// the server (Consult), where its weight did not change.
func (c *Group) setNames(names []string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !slices.Equal(c.names, names) {
		c.names, c.function = names, strings.Join(names, ",")
	}
}

// write writes c's weight, under c.mu, and with nice levels returns the
// walk that gives the processes of its tree the level when tree is set,
// for the caller to make once it released c.mu (walk). Once the weights
// are off it writes the server's weight, once (unweigh). Every write ends
// the walks of the ones before it: what it writes is the tree's level now.
func (c *Group) write(tree bool) treeWalk {
	if !c.g.On() {
		return c.unweigh()
	}
	c.gen++
	w := c.base
	if c.boosted {
		w *= c.g.boost
	}
	if c.g.nice {
		level := max(NiceLevel(w), c.g.base) // no worker above the server
		if !c.g.lower {
			level = max(level, c.level) // it cannot come back down
		}
		if _, err := renice(c.pid, level, c.slicing(), !c.g.lower); err == nil {
			c.level = level
			c.g.ag.set(c.pid, level)
		} else if !errors.Is(err, syscall.ESRCH) {
			c.g.fail(c, fmt.Errorf("renice worker %d to %d: %w", c.pid, level, err), "cannot set a worker's nice level", "function", c.function, "pid", c.pid)
			return c.unweigh()
		}
		if tree {
			return c.walkTo(level)
		}
		return treeWalk{}
	}
	err := os.WriteFile(filepath.Join(c.dir, c.g.file), []byte(c.g.value(w)), 0o644)
	if err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.ESRCH) {
		c.g.fail(c, fmt.Errorf("weigh worker %d: %w", c.pid, err), "cannot set a worker's CPU weight", "function", c.function, "pid", c.pid)
		return c.unweigh()
	}
	return treeWalk{}
}

// unweigh gives c the server's weight, under c.mu, once the weights are
// off (CPUGroups.fail): its boost ends and no function's weight is written
// from then on. Its group's processes stay where they are (under cgroup
// v2 its group holds its pids and memory limits too), at the server's
// cpu.shares or cpu.weight; with nice levels, at the server's level, or,
// where a level cannot be taken back down, at the one they have (logged).
// A write that fails is logged, not tried again. It returns the walk
// that gives the tree the level (write).
func (c *Group) unweigh() treeWalk {
	if c.closed || c.unweighed {
		return treeWalk{}
	}
	c.unweighed, c.boosted = true, false
	c.gen++
	why := c.g.whyOff()
	if !c.g.nice {
		err := os.WriteFile(filepath.Join(c.dir, c.g.file), []byte(strconv.Itoa(int(c.g.units().hi))), 0o644)
		switch {
		case err == nil:
			c.g.log.Info("worker CPU weight set to the server's, the weights being off", "function", c.function, "pid", c.pid, "why", why)
		case !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.ESRCH):
			c.g.log.Warn("worker CPU weights off, but a worker keeps its function's weight", "function", c.function, "pid", c.pid,
				"error", fmt.Errorf("weigh worker %d as the server: %w", c.pid, err), "why", why)
		}
		return treeWalk{}
	}
	level := c.g.base
	if !c.g.lower && c.level > level {
		c.g.log.Warn("worker CPU weights off, but a worker keeps its nice level: a level cannot be taken back down here (no CAP_SYS_NICE)",
			"function", c.function, "pid", c.pid, "nice", c.level, "server_nice", level, "why", why)
		return treeWalk{}
	}
	_, err := renice(c.pid, level, c.slicing(), !c.g.lower)
	switch {
	case err == nil:
		c.level = level
		c.g.log.Info("worker nice level set to the server's, the weights being off", "function", c.function, "pid", c.pid, "nice", level, "why", why)
		return c.walkTo(level)
	case !errors.Is(err, syscall.ESRCH):
		c.g.log.Warn("worker CPU weights off, but a worker keeps its nice level", "function", c.function, "pid", c.pid, "nice", c.level,
			"error", fmt.Errorf("renice worker %d to %d: %w", c.pid, level, err), "why", why)
	}
	return treeWalk{}
}

// unweighNow gives c the server's weight (unweigh), taking c.mu, and
// then its tree without it.
func (c *Group) unweighNow() {
	c.mu.Lock()
	walk := c.unweigh()
	c.mu.Unlock()
	c.walk(walk)
}

// whyOff is the failure that turned the weights off (nil: on).
func (g *CPUGroups) whyOff() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.broken
}

// Exited says the group's process exited (not yet reaped): nothing is
// written for it from now on.
func (c *Group) Exited() {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.g.mu.Lock()
	delete(c.g.live, c)
	c.g.mu.Unlock()
}

// Empty kills every process left in the group (none with nice levels),
// once its process exited, and returns once they are gone (emptyGroup).
func (c *Group) Empty() error {
	if c == nil || c.dir == "" {
		return nil
	}
	return emptyGroup(c.dir)
}

// Remove removes the group once its process has exited. An empty group
// goes; one still holding a process that forked away is left for Close's
// sweep.
func (c *Group) Remove() {
	c.Exited()
	if c != nil && c.dir != "" {
		os.Remove(c.dir)
	}
}

// niceBase is a default function's nice level; a worker's level is
// niceBase less the levels (factors of 1.25 in CFS's weight table) of its
// weight, within 0..19.
const niceBase = 10

// NiceLevel is the nice level of a CPU weight (Weight): a worker's where
// cgroups cannot be written, and the server's thread's while it moves a
// piece of the function's bytes (package ioshare).
func NiceLevel(w float64) int {
	if w <= 0 {
		return 19
	}
	return min(19, max(0, niceBase-int(math.Round(math.Log(w)/math.Log(1.25)))))
}

// writeGroup makes group dir with weight value v and moves pid into it.
func (g *CPUGroups) writeGroup(dir string, pid int, v string) error {
	err := os.Mkdir(dir, 0o755)
	if err == nil || errors.Is(err, os.ErrExist) {
		err = os.WriteFile(filepath.Join(dir, g.file), []byte(v), 0o644)
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644)
	}
	return err
}

// Close removes the server's groups (every worker is gone by then).
func (g *CPUGroups) Close() {
	if g == nil {
		return
	}
	if g.stopBoost != nil {
		close(g.stopBoost)
		<-g.boostDone
		g.stopBoost = nil
	}
	if g.nice {
		return
	}
	g.mu.Lock()
	g.threads.close()
	g.mu.Unlock()
	// The server goes back where it was: a group holding a process cannot
	// be removed.
	err := g.goHome()
	if errors.Is(err, syscall.EBUSY) && g.v2 {
		g.takeBack()
		err = g.goHome()
	}
	if err != nil {
		g.log.Warn("the server cannot go back to the cgroup it started in, so its groups stay until the next start sweeps them", "home", g.home, "error", err)
	}
	removeGroups(g.dir)
}

// goHome moves the server back into the group it started in.
func (g *CPUGroups) goHome() error {
	return os.WriteFile(filepath.Join(g.home, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0o644)
}
