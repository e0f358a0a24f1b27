package worker

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

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
// of more than its share. What a device scheduler's virtual time gives a
// flow that was idle (it goes first), this gives its worker's threads.

// boostWindow is how often the groups' use is read and their boosts set.
const boostWindow = 250 * time.Millisecond

// groupUse is a group's weight and its CPU use in a window, in CPUs.
type groupUse struct {
	weight, used float64
	boosted      bool
}

// lightBoosts says which groups run boosted in the next window: a group
// using under half its part of cpus (three quarters, once boosted) is
// light. A group with no weight (a standby) is never boosted. A group that
// used almost nothing is no one's competitor: its part is reckoned as if
// it were the only idle group among the busy.
func lightBoosts(uses []groupUse, cpus float64) []bool {
	const idle = 0.01 // CPUs: below this a group is idle
	var busy float64
	for _, u := range uses {
		if u.used >= idle {
			busy += u.weight
		}
	}
	out := make([]bool, len(uses))
	for i, u := range uses {
		if u.weight <= 0 {
			continue
		}
		among := busy
		if u.used < idle {
			among += u.weight
		}
		part := cpus * u.weight / among
		limit := part / 2
		if u.boosted {
			limit = part * 3 / 4
		}
		out[i] = u.used < limit
	}
	return out
}

// LightBoost is how many times its weight a light worker runs at (see
// above); 1 turns the boost off.
const LightBoost = 8

// StartBoost starts boosting light workers by factor (1 or less: none),
// until Close. Call it once, before workers are placed.
func (g *CPUGroups) StartBoost(factor float64) {
	if g == nil || factor <= 1 || g.nice && !g.lower { // a boost must be taken back
		return
	}
	g.boost = factor
	g.stopBoost = make(chan struct{})
	g.boostDone = make(chan struct{})
	go g.boostLoop()
}

// boostLoop reads the groups' use each window and sets their boosts.
func (g *CPUGroups) boostLoop() {
	defer close(g.boostDone)
	tick := time.NewTicker(boostWindow)
	defer tick.Stop()
	cpus := float64(runtime.NumCPU())
	for {
		select {
		case <-g.stopBoost:
			return
		case now := <-tick.C:
			if g.off() {
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
	for i, b := range lightBoosts(uses, cpus) {
		groups[i].setBoost(b)
	}
}

// use is c's weight and CPU use since the last call (for a process
// already gone, or the first call, none).
func (c *Group) use(now time.Time) groupUse {
	c.mu.Lock()
	defer c.mu.Unlock()
	u := groupUse{weight: c.base, boosted: c.boosted}
	if c.closed {
		u.weight = 0
		return u
	}
	t, err := c.cpuTime()
	if err == nil && !c.readAt.IsZero() && t >= c.cpu {
		u.used = (t - c.cpu).Seconds() / now.Sub(c.readAt).Seconds()
	}
	if err == nil {
		c.cpu, c.readAt = t, now
	}
	return u
}

// setBoost boosts c, or ends its boost, writing its weight if that changed.
func (c *Group) setBoost(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || on == c.boosted || c.base <= 0 {
		return
	}
	c.boosted = on
	c.writeWeight()
}

// cpuTime is the CPU time the group's processes used so far: the group's
// own count under cgroup v2; the sum of its processes' under v1 (its cpu
// controller keeps none here; cpuacct, which does, is often mounted apart);
// with nice levels, of the worker's and every process under it (in its
// PID namespace, every process it started, orphans included). A function
// that spins in a child of its worker is counted: the boost goes by what
// the whole group uses, as its weight applies to the whole group.
func (c *Group) cpuTime() (time.Duration, error) {
	switch {
	case c.g.nice:
		return sumCPU(procTree(c.pid))
	case c.g.v2:
		return cgroupV2Usage(filepath.Join(c.dir, "cpu.stat"))
	}
	b, err := os.ReadFile(filepath.Join(c.dir, "cgroup.procs"))
	if err != nil {
		return 0, err
	}
	var pids []int
	for _, f := range bytes.Fields(b) {
		if pid, err := strconv.Atoi(string(f)); err == nil {
			pids = append(pids, pid)
		}
	}
	return sumCPU(pids)
}

// sumCPU is the CPU time processes pids used; one gone meanwhile counts
// none, unless it is the first (the worker), whose error is returned.
func sumCPU(pids []int) (time.Duration, error) {
	var sum time.Duration
	for i, pid := range pids {
		t, err := cpuTime(pid)
		if err != nil && i == 0 {
			return 0, err
		}
		sum += t
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
// boost loop's reads unbounded.
const maxTree = 4096

// procTree is pid and the processes under it, from each thread's children
// list (/proc/PID/task/TID/children), pid first.
func procTree(pid int) []int {
	tree := []int{pid}
	for i := 0; i < len(tree) && len(tree) < maxTree; i++ {
		tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", tree[i]))
		for _, t := range tasks {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", tree[i], t.Name()))
			for _, f := range bytes.Fields(b) {
				if kid, err := strconv.Atoi(string(f)); err == nil && len(tree) < maxTree {
					tree = append(tree, kid)
				}
			}
		}
	}
	return tree
}

// clockTick is the unit of /proc/PID/stat's CPU times (USER_HZ, 100 on
// every Linux architecture the server builds for).
const clockTick = 10 * time.Millisecond

// cpuTime is the CPU time process pid's threads used so far, user and
// system, from /proc/PID/stat (what its children used is not counted until
// they are reaped).
func cpuTime(pid int) (time.Duration, error) {
	f, err := statFields(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	var ticks int64
	for _, s := range f[11:13] { // utime and stime, fields 14 and 15
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * clockTick, nil
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
// time. mu orders the boost loop's writes with the worker's own (which
// hold the worker's lock too) and with its exit: once closed, nothing is
// written (with nice levels its pid may come to be another process's).
type boostState struct {
	mu       sync.Mutex
	base     float64
	function string // for the log, should a write fail
	boosted  bool
	closed   bool
	cpu      time.Duration
	readAt   time.Time
}
