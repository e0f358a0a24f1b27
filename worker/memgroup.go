package worker

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/plover-run/plover/worker/contain"
)

// MemGroups backs each worker's memory limit (max_host_memory_mb) with a
// memory cgroup over its whole process tree. The watch loop's check
// (accounting.go) samples the worker process's own resident memory: a
// child the bundle forks, or a daemon's orphaned grandchild, is not in it,
// and could take the node's memory under a function's limit. Summing the
// tree from /proc was tried and dropped: a child can come and go between
// samples, and one watch goroutine walking every tenant's trees stalls on
// the largest. The kernel's memory controller charges every page a tree's
// processes allocate to their group, exactly, and stops the tree there.
//
// The group is a backstop beside the check, which stays: its limit is
// the worker's, plus the server's slots it maps (whose pages it touches
// are charged to it: outputs written, on CUDA whole slots pinned), plus
// memHeadroom; none while the worker has no limit (a standby, a function
// without one). Past it the kernel's OOM killer ends, under v2, the whole
// group (memory.oom.group), as the check's kill would; under v1, which
// has no such switch, the largest process in it, most often the hog the
// bundle forked, and the worker lives on (logged). Groups are made where
// PidGroups' are (ctlGroups): under v1 a group of the worker's own in the
// memory hierarchy, under v2 its CPU group. Where the memory controller
// cannot be written, nothing: the check alone, as before (logged once).
type MemGroups struct {
	ctlGroups
	warnSaid bool // a failed limit write was logged (under mu)
}

// memHeadroom is what a worker's memory group may hold beyond its limit
// and its slots, at the least: what the kernel charges a group and the
// resident-memory check does not see. Kernel stacks (16 KiB a thread: 8
// MiB for --worker-max-pids' 512), socket buffers of its channels and the
// slab of its files and mappings come to a few MiB for a host worker,
// more with a CUDA context's mappings; 32 MiB covers them with room,
// where a limit too tight would have the kernel kill a worker the check
// passes. Page tables grow with what is touched (8 bytes a 4 KiB page:
// 1/512 of it, 2 MiB a GiB), so memGroupLimit adds 1/256 of the limit
// and slots, twice that, on top. A bundle can keep the headroom in a
// child unseen by the check, no more.
const memHeadroom = 32 << 20

// memSlack is what a lowered limit leaves above the group's usage as
// last read (memGroupLower): room for what its processes allocate until
// the next settle, a second on (a sibling's growth in a tenant's worker
// as another's slot goes), that would otherwise meet the lowered limit
// and be OOM-killed.
const memSlack = 16 << 20

// NewMemGroups readies memory groups for workers under root (the cgroup
// mount), cpu being the workers' CPU groups (under v2 the limit goes in
// them; nil: none), and logs which mechanism bounds workers' memory; nil
// where the memory controller cannot be written.
func NewMemGroups(root string, cpu *CPUGroups, log *slog.Logger) *MemGroups {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	g := &MemGroups{ctlGroups: ctlGroups{ctl: "memory", log: log}}
	if err := g.ready(root, cpu); err != nil {
		log.Info("worker memory limits (max_host_memory_mb) check each worker process's own resident memory only, not what it forks: no memory cgroup per worker", "why", err)
		return nil
	}
	log.Info("worker memory limits (max_host_memory_mb) checked on each worker's resident memory and backed by a memory cgroup per worker, over its whole process tree", "mechanism", g.Mechanism())
	return g
}

// Mechanism says how a worker's process tree's memory is bounded:
// "cgroup v1", "cgroup v2", or "off" (its own resident memory only).
func (g *MemGroups) Mechanism() string {
	if g == nil || g.off() != nil {
		return "off"
	}
	return g.mechanism()
}

// v2 reports whether the groups are cgroup v2's, whose files differ.
func (g *MemGroups) v2() bool { return g.cpu != nil && g.cpu.v2 }

// Place gives process pid, a worker that has not run bundle code yet,
// whose CPU group is cg (nil: none), a memory group without a limit and
// returns it (nil: none). As for PidGroups.Place the caller holds what
// keeps pid from being reaped meanwhile. A group that cannot be made
// turns the groups off (logged once), from this worker on.
func (g *MemGroups) Place(pid int, cg *Group) *MemGroup {
	if g == nil || g.off() != nil {
		return nil
	}
	m := &MemGroup{g: g, limit: -1, want: -1}
	own, dir, err := g.place(pid, cg, func(dir string) error {
		if err := m.write(dir, -1); err != nil {
			return err
		}
		// The whole tree dies as a unit, as the check's kill takes it; a
		// kernel before 4.19 has no such file, and kills as v1 does (v1
		// has none at all).
		if !g.v2() {
			return nil
		}
		if err := writeExisting(filepath.Join(dir, "memory.oom.group"), "1"); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	})
	switch {
	case err == nil:
		m.dir, m.own = dir, own
		m.told, m.hits = m.oomKills(), m.limitHits() // a v2 CPU group's past is not this worker's
		return m
	case errors.Is(err, syscall.ESRCH), errors.Is(err, errNoCPUGroup):
		// Gone before its placement, or alone without a CPU group (whose
		// Place said why): the check alone bounds it.
	case errors.Is(err, errGroupsLeft):
		g.log.Warn("a worker without a memory group: its limit checks its own resident memory only", "pid", pid, "error", err)
	default:
		g.mu.Lock()
		if g.broken == nil {
			g.broken = err
			g.log.Warn("worker memory groups off: workers' limits check their own resident memory only", "pid", pid, "error", err)
		}
		g.mu.Unlock()
	}
	return nil
}

// Close removes the server's memory groups (every worker is gone by then).
func (g *MemGroups) Close() {
	if g != nil {
		g.close()
	}
}

// MemGroup is one worker's memory group: its own (v1) or its CPU group's
// files (v2).
type MemGroup struct {
	g   *MemGroups
	dir string    // where its memory files are
	own *ownGroup // v1: its own group, emptied and removed with the worker

	// mu is held across the group's file reads and writes (syncMemGroup,
	// watchMemGroup, closeMemGroup): the limit is figured and written as
	// one step, so that of two changes racing (a slot mapped, one dropped,
	// the watch loop's settle) the later's figures are written last, and
	// nothing is written once the worker's end closed the group. Without
	// it a write would need a sequence number checked after the write and
	// a rewrite on a lost race: no simpler. It is one worker's, held for a
	// few cgroupfs syscalls and two reads of the worker's /proc status
	// (processEnding; an EBUSY reclaim at most); no other worker waits on
	// it. It is taken under p.mu and the device's mu (tenantGiven), never
	// they under it, so one holding those may wait for those syscalls: a
	// tenant's worker being given its tenant, before it has a limit (no
	// file I/O then).
	mu       sync.Mutex
	closed   bool   // its worker exited: nothing is written from now on
	limit    int64  // as last written; -1: none
	want     int64  // as last asked (memGroupLimit)
	function string // whose limit it is, for the log: "tenant <name>" in a tenant's worker (tenantGiven)
	told     int64  // OOM kills in the group, as of the watch loop's last look (logged)
	hits     int64  // times the group met its own limit, as of that look (limitHits)
	oomDied  bool   // its worker died of the group's own limit (closeMemGroup)
	diedAt   int64  // its limit then
}

// Empty kills what is left in the worker's own group (v1) once it exited
// (ownGroup.Empty); its CPU group's are its CPU group's to kill.
func (m *MemGroup) Empty() error {
	if m == nil {
		return nil
	}
	return m.own.Empty()
}

// Remove removes the worker's own group (v1) once it was emptied.
func (m *MemGroup) Remove() {
	if m != nil {
		m.own.Remove()
	}
}

// memGroupLimit is a worker's memory group's limit for its limit (0:
// none) and the bytes of the server's slots it maps: -1 for none, and for
// a limit so large (--worker-max-memory takes up to 2^43 MiB) that the sum
// would pass an int64: no memory could reach it anyway.
func memGroupLimit(limit, mapped int64) int64 {
	if limit <= 0 {
		return -1
	}
	held := limit + max(mapped, 0)
	if held < 0 || held > math.MaxInt64/2 {
		return -1
	}
	return held + memHeadroom + held/memTableShare
}

// memTableShare: a group's page tables' allowance is 1/memTableShare of
// what its worker may touch (memHeadroom).
const memTableShare = 256

// memGroupLower is the limit to write for want, below the group's limit
// now (cur; -1: none), with the group's usage at used: a limit below what
// a group holds has the kernel reclaim, and under v2 OOM-kill at once;
// and a slot's pages stay charged to the worker until the last mapping of
// them goes (its worker's own unmap of a closed instance's slot is its
// own, later), after the server stopped counting it. So a lowering stops
// above usage, and never goes above cur: the watch loop lowers it again
// until it reaches want, and a bundle growing meanwhile cannot ratchet it
// up.
func memGroupLower(want, cur, used int64) int64 {
	v := max(want, used+memSlack)
	if cur >= 0 {
		v = min(v, cur)
	}
	return v
}

// set asks for limit want (memGroupLimit): a raise is written at once, a
// lowering as far as memGroupLower lets it (the rest at later settles).
// Under m.mu.
func (m *MemGroup) set(want int64) {
	m.want = want
	m.settle()
}

// settle writes what set asked for, as far as it can now, under m.mu.
func (m *MemGroup) settle() {
	if m.closed || m.want == m.limit {
		return
	}
	v := m.want
	if v >= 0 && (m.limit < 0 || v < m.limit) {
		used, err := m.usage()
		if err != nil {
			m.writeFailed(err)
			return
		}
		if v = memGroupLower(v, m.limit, used); v == m.limit {
			return
		}
	}
	if err := m.write(m.dir, v); err != nil {
		// EBUSY: v1 could not reclaim down to it (the group grew since
		// usage was read); the next settle tries again.
		if !errors.Is(err, syscall.EBUSY) {
			m.writeFailed(err)
		}
		return
	}
	m.limit = v
}

func (m *MemGroup) writeFailed(err error) {
	m.g.warnOnce(&m.g.warnSaid, "cannot set a worker's memory group's limit: its process tree is bounded as it was (its own resident memory stays checked)", "function", m.function, "error", err)
}

// write writes limit v (-1: none) into the memory group at dir.
func (m *MemGroup) write(dir string, v int64) error {
	file, val := "memory.limit_in_bytes", strconv.FormatInt(v, 10)
	if m.g.v2() {
		file = "memory.max"
		if v < 0 {
			val = "max"
		}
	}
	return os.WriteFile(filepath.Join(dir, file), []byte(val), 0o644)
}

// usage is the bytes charged to the group now.
func (m *MemGroup) usage() (int64, error) {
	file := "memory.usage_in_bytes"
	if m.g.v2() {
		file = "memory.current"
	}
	b, err := os.ReadFile(filepath.Join(m.dir, file))
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// oomKills is the processes the kernel's OOM killer ended in the group
// (v1 memory.oom_control's, v2 memory.events' oom_kill line: Linux 4.13);
// 0 where it cannot tell.
func (m *MemGroup) oomKills() int64 {
	file := "memory.oom_control"
	if m.g.v2() {
		file = "memory.events"
	}
	b, _ := os.ReadFile(filepath.Join(m.dir, file))
	for _, line := range strings.Split(string(b), "\n") {
		if n, ok := strings.CutPrefix(line, "oom_kill "); ok {
			k, _ := strconv.ParseInt(strings.TrimSpace(n), 10, 64)
			return k
		}
	}
	return 0
}

// limitHits is the times the group met its own limit (v1
// memory.failcnt; v2 memory.events.local's, else memory.events', max and
// oom lines): an OOM kill counted in a group (oomKills) is the victim's,
// whichever group's limit, or the node's memory, ran out; one by the
// group's own limit comes with a rise here. 0 where it cannot tell.
func (m *MemGroup) limitHits() int64 {
	if !m.g.v2() {
		b, _ := os.ReadFile(filepath.Join(m.dir, "memory.failcnt"))
		n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return n
	}
	b, err := os.ReadFile(filepath.Join(m.dir, "memory.events.local"))
	if err != nil {
		b, _ = os.ReadFile(filepath.Join(m.dir, "memory.events"))
	}
	var n int64
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, " ")
		if k == "max" || k == "oom" {
			c, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			n += c
		}
	}
	return n
}

// syncMemGroup sets p's memory group's limit for its limit and the slots
// it maps now: called after either changes, a raise before the worker is
// handed a slot (mapSlot), a lowering once it let one go. Computed and
// written under the group's lock, so that of two changes racing the
// later's figures are written last.
func (p *proc) syncMemGroup() {
	m := p.mem.Load()
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.set(memGroupLimit(p.memLimit.Load(), p.mappedSlots()))
}

// limitMemory sets p's limit (0: none) for function's program (the log's
// name for it).
func (p *proc) limitMemory(limit int64, function string) {
	p.memLimit.Store(limit)
	if m := p.mem.Load(); m != nil && p.tenant == nil {
		m.mu.Lock()
		m.function = function
		m.mu.Unlock()
	}
	p.syncMemGroup()
}

// watchMemGroup is the watch loop's look at p's memory group, about once
// a second: it lowers a limit set left above its aim (memGroupLower), and
// logs an OOM kill in the group that did not end the worker (v1 kills the
// largest process, most often a child the bundle forked); one that ended
// it is its death's reason (memGroupDeath).
func (p *proc) watchMemGroup() {
	m := p.mem.Load()
	if m == nil {
		return
	}
	m.mu.Lock()
	if m.want < 0 && m.limit < 0 { // no limit: nothing to settle, no OOM kill of its own
		m.mu.Unlock()
		return
	}
	m.settle()
	n, hits, told, function, limit := m.oomKills(), m.limitHits(), m.told, m.function, m.limit
	// Kills counted while the worker is ending may be its own, which
	// closeMemGroup is to find past told: they are taken as seen only once
	// it is found alive after them (the kernel counts a kill just before
	// its SIGKILL, so a kill in those microseconds can still pass as seen).
	ending := n > told && processEnding(p.pid)
	if !ending {
		m.told, m.hits = max(n, told), max(hits, m.hits)
	}
	m.mu.Unlock()
	if n <= told || ending || !p.alive() || p.gone.Load() {
		return
	}
	p.d.opts.Log.Warn("the kernel's OOM killer ended a process in a worker's memory group (max_host_memory_mb, with the slots it maps and headroom): most often a process its bundle forked; the worker lives on",
		"function", function, "pid", p.pid, "oom_kills", n, "limit_mib", limit>>20)
}

// processEnding reports whether process pid is ending or gone: a zombie,
// exiting (PF_EXITING in its stat's flags), or a SIGKILL pending for it.
func processEnding(pid int) bool {
	dir := "/proc/" + strconv.Itoa(pid)
	// After the comm: state, ppid, pgrp, session, tty_nr, tpgid, flags.
	f, err := contain.StatFields(dir + "/stat")
	if err != nil || len(f) < 7 || f[0] == "Z" || f[0] == "X" || f[0] == "x" {
		return true
	}
	const pfExiting = 0x4
	if flags, err := strconv.ParseUint(f[6], 10, 64); err == nil && flags&pfExiting != 0 {
		return true
	}
	status, err := os.ReadFile(dir + "/status")
	if err != nil {
		return true
	}
	for _, line := range strings.Split(string(status), "\n") {
		k, v, _ := strings.Cut(line, ":")
		if k == "SigPnd" || k == "ShdPnd" {
			if set, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64); err == nil && set&(1<<(syscall.SIGKILL-1)) != 0 {
				return true
			}
		}
	}
	return false
}

// tenantGiven names p's memory group's limit for the log after tenant,
// whose functions' limits it holds together (retune). Under the device's
// and p's mu: the group's lock is taken under them, never they under it.
func (p *proc) tenantGiven(tenant string) {
	if m := p.mem.Load(); m != nil {
		m.mu.Lock()
		m.function = "tenant " + tenant
		m.mu.Unlock()
	}
}

// closeMemGroup ends the writes to p's memory group once p exited, and
// reads, before the group is removed, whether its limit killed it
// (memGroupDeath): OOM kills there past those the watch loop last saw
// (a child's, logged, is not its worker's death; one that ended the
// worker before the next look is), with the group meeting its own limit
// since that look (a kill counted there may be the node's, or a parent
// group's).
func (p *proc) closeMemGroup() {
	m := p.mem.Load()
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	if m.limit >= 0 { // without a limit of its own, a kill there was its parent's
		m.oomDied = m.oomKills() > m.told && m.limitHits() > m.hits
		m.diedAt = m.limit
	}
}

// memGroupDeath reports a worker the kernel's OOM killer ended in its
// memory group for its limit (closeMemGroup, and it died of a SIGKILL the
// server did not send) as the limit it is: a kill by the server, as the
// check's, whose reason reaches its requests.
func (p *proc) memGroupDeath(sig syscall.Signal) {
	m := p.mem.Load()
	if m == nil || !m.oomDied || sig != syscall.SIGKILL {
		return
	}
	why := fmt.Sprintf("its process tree's memory passed its memory cgroup's limit of %d MiB (max_host_memory_mb %d MiB, with the slots it maps and headroom; the kernel's OOM killer in its memory cgroup)", m.diedAt>>20, p.memLimit.Load()>>20)
	p.killed.CompareAndSwap(nil, &why)
}
