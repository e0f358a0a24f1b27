package worker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/fileutil"
	"github.com/plover-run/plover/loader"
)

// Tenant scope (Options.TenantScope): the programs of one tenant run in
// one worker process per device, a load into it being no process start;
// programs of two tenants never share one. Each program's files are
// staged in the worker's stage under names led by its prefix (p<id>.),
// it is named by its id on the control channel (wire.OpLoad), and a
// process ends with its last program.
//
// When such a process dies, the program at fault loses it as its own
// crash and the others as collateral (ProcessExit.Shared): see blame.

// tenancy is what a tenant's worker holds: its tenant's programs by id.
// Every worker of a device in tenant scope has one from its start (its
// output readers look at it), given to a tenant by placeTenant.
type tenancy struct {
	// name is the tenant's once given (under the device's mu).
	name  string
	given bool
	// unattributed counts the lines that were no one program's
	// (tenantOutput).
	unattributed atomic.Int32

	// Under the proc's mu. tuned: retune set the memory limit once; gone:
	// the limit of each bundle unloaded, by function and bundle directory (a
	// version unloaded and loaded again, as scale to zero does, counts
	// once, not at every cycle, but for a library that stays mapped, each
	// load a copy of its own: loadKey; a redeploy's new bundle counts
	// apart); unlimited: one unloaded had none; peak: the most the limits
	// of the programs it held summed to at once, which bounds what gone
	// may carry (overdraw times it) before the worker is retired
	// (overdrawn).
	// Ids are never reused: those up to nextID not in progs are of
	// programs unloaded, whose chains may still run in the worker (an
	// overrun) and crash it.
	progs  map[uint32]*program
	nextID uint32
	names  []string // each id's function, by id-1: blame names an unloaded program's crash

	tuned     bool
	gone      map[loadKey]int64
	unlimited bool
	peak      int64
	// overdrawn (set by retune): its memory limit carries more for the
	// programs it no longer holds than overdraw times peak, or none for one without a
	// limit it no longer holds while those it holds have one; the worker
	// takes no new load (retire), so that its limit, which only rises,
	// stays bounded by what it held while a sibling keeps it alive.
	overdrawn atomic.Bool
	// keepsLibs: a library its device loads stays mapped for the
	// process's life (loader.StaysMapped: CUDA's); set with name.
	keepsLibs bool
	// stuck counts the libraries mapped in the process for programs it no
	// longer holds (unloaded, or whose load failed) that stay mapped for
	// its life (loader.StaysMapped: CUDA's); at stuckCopies the worker
	// takes no new load (retire).
	stuck atomic.Int32
	// Under the device's mu. retired: the tenant's slot no longer holds
	// the worker, which takes no new load and ends with the last of its
	// programs, refs of them left (retire, releaseTenant).
	retired bool
	refs    int
	// tasksFor (under the proc's mu) is how many programs its task bound
	// is for (PidGroups.Raise): the most it held at once, never lowered,
	// as an unloaded program's threads may stay.
	tasksFor int
	// leaving is the programs taken out of progs whose last lines may
	// still be read (tenantOutput): true while the server has yet to
	// unload one (its plover_unload hook to run, its closed instances'
	// plover_instance_fini running), false once that is done; forgotten
	// outputGrace after their last call (forget).
	leaving map[*program]bool
	// named: blame named the one program at fault, one still held, whose
	// crash the engine counts (tenantDied does not count the death
	// towards the tenant's back-off). by is the function at fault where
	// one was found (held or not): the others' losses name it in the log.
	named bool
	by    string

	// wake wakes the worker's weighLoop (tenantweight.go), which lets a
	// program go idle a window after it was last busy (weighWindow); weighed
	// is the CPU weight it last wrote (0: none yet), its alone; writes
	// counts them.
	wake    chan struct{}
	window  time.Duration
	weighed float64
	writes  atomic.Int64
}

// tenantSlot is a tenant's worker on the device: the live one, or the
// start of one in flight (the tenant's other loads wait for it, so that
// concurrent loads do not start two processes). refs counts the programs
// placed in p, loads in flight included: at 0 the process ends.
type tenantSlot struct {
	p        *proc
	starting chan struct{}
	refs     int
}

func (d *Device) tenantScope() bool { return d.opts.TenantScope && !d.opts.MPS }

// placeTenant returns the tenant's worker for a program about to be loaded
// into it (counted in its refs; releaseTenant undoes that): the live one,
// or a standby dedicated to the tenant now. No lock is held while a
// process is taken or a control call made: a load waiting for its tenant's
// worker to start waits on the start alone.
func (d *Device) placeTenant(ctx context.Context, spec device.ProgramSpec) (*proc, error) {
	for {
		t, p, wait, err := d.tenantTurn(spec.Tenant)
		switch {
		case err != nil || p != nil:
			return p, err
		case wait != nil:
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return nil, fmt.Errorf("%w while waiting for the tenant's worker to start", device.ErrDeadline)
			}
		}
		return d.startTenant(ctx, spec.Tenant, spec.Manifest, t)
	}
}

// startTenant takes a worker for the start tenantTurn gave this load, t's,
// and settles it. A panic in the take (recovered by the request's
// transport) settles it too, as a failure, before it goes on: a start left
// under way would have the tenant's every later load wait for it until
// its deadline.
func (d *Device) startTenant(ctx context.Context, tenant string, m *abi.Manifest, t *tenantSlot) (*proc, error) {
	settled := false
	defer func() {
		if !settled {
			d.settleStart(tenant, t, nil, errors.New("the worker's start panicked"))
		}
	}()
	p, err := d.take(ctx, m)
	settled = true
	d.settleStart(tenant, t, p, err)
	return p, err
}

// tenantTurn is, under d.mu, what a load for tenant finds: its live
// worker (counted in its refs), a start under way to wait for, a refusal,
// or else the start its own (t.starting set: settleStart settles it). Each
// step that holds d.mu releases it by a defer: a load runs in its
// request's goroutine, whose panic the transport recovers, and a lock it
// left held would hang every later load, start and reaping on the device.
func (d *Device) tenantTurn(tenant string) (t *tenantSlot, p *proc, wait <-chan struct{}, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	t = d.tenants[tenant]
	if t == nil {
		t = &tenantSlot{}
		d.tenants[tenant] = t
	}
	// A worker the server killed, or one that exited, but that has not
	// been reaped yet is as good as dead: a program placed in it would
	// be lost with it.
	if t.p != nil && t.p.alive() && t.p.killed.Load() == nil && !t.p.gone.Load() {
		if err := t.p.admit(tenant); err != nil {
			return nil, nil, nil, err
		}
		t.refs++
		return t, t.p, nil, nil
	}
	if t.starting != nil {
		return t, nil, t.starting, nil
	}
	if err := d.churnHeld(tenant); err != nil {
		d.dropEmptySlot(tenant, t)
		return nil, nil, nil, err
	}
	t.p, t.starting, t.refs = nil, make(chan struct{}), 0
	return t, nil, nil, nil
}

// settleStart settles the start tenantTurn gave a load: t's worker is p, or
// none when it could not be taken (err). The loads waiting on it go on.
func (d *Device) settleStart(tenant string, t *tenantSlot, p *proc, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	defer close(t.starting)
	t.starting = nil // before the close (deferred): a waiter finds it settled
	if err != nil {
		d.dropEmptySlot(tenant, t)
		return
	}
	// Under both locks: the device's readers (admit) hold d.mu, the
	// process's (its output, its death) p.mu.
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tenant.name, p.tenant.given = tenant, true
	p.tenant.keepsLibs = loader.StaysMapped(d.Target())
	p.tenantGiven(tenant)
	t.p, t.refs = p, 1
}

// dropEmptySlot forgets t, tenant's slot, holding no worker and none
// starting (a start that failed): a tenant's next load makes it anew, and
// the keys of a worker of its own (alone.go), never used again, do not
// pile up. Under d.mu.
func (d *Device) dropEmptySlot(tenant string, t *tenantSlot) {
	if t.p == nil && t.starting == nil && t.refs == 0 && d.tenants[tenant] == t {
		delete(d.tenants, tenant)
	}
}

// admit refuses a program of another tenant than p's: a process never
// serves two tenants.
func (p *proc) admit(tenant string) error {
	if p.tenant == nil || !p.tenant.given || p.tenant.name != tenant {
		return fmt.Errorf("worker %d: a program of tenant %q in a worker of another tenant: refused", p.pid, tenant)
	}
	return nil
}

// releaseTenant drops one of p's refs, and says whether it was the last:
// the process then ends (the caller kills it), and the tenant's next load
// takes a new one. A worker spent (spent: stuckCopies libraries it cannot
// unmap, or a memory limit overdrawn by what it unloaded) is retired here
// (retire), logged once the device's lock is let go.
func (d *Device) releaseTenant(p *proc) bool {
	last, why := d.release(p)
	if why != "" {
		d.opts.Log.Info("a tenant's worker takes no new function: "+why+"; the tenant's next load starts a worker, and this one ends with its last function",
			"pid", p.pid, "tenant", p.tenant.name, "libraries_unloaded", p.tenant.stuck.Load(), "memory_limit_mb", p.memLimit.Load()>>20)
	}
	return last
}

// release is releaseTenant's part under d.mu: whether p's last ref went,
// and why p was retired now ("": it was not).
func (d *Device) release(p *proc) (last bool, why string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if p.tenant.retired {
		p.tenant.refs--
		return p.tenant.refs <= 0, ""
	}
	t := d.tenants[p.tenant.name]
	if t == nil || t.p != p {
		return true, "" // a worker that died and was replaced: nothing else in it
	}
	t.refs--
	if t.refs > 0 {
		if why = p.spent(); why != "" {
			d.retire(t, p)
		}
		return false, why
	}
	delete(d.tenants, p.tenant.name)
	return true, ""
}

// spent says why p, a tenant's worker, should take no new load, "" if
// nothing does. Read under d.mu alone: both are atomics that p's unloads
// set under its own mu, before they release their ref.
func (p *proc) spent() string {
	switch {
	case p.tenant.stuck.Load() >= stuckCopies:
		return "it holds the libraries of functions it unloaded, which stay mapped"
	case p.tenant.overdrawn.Load():
		return "its memory limit carries the limits of functions it unloaded (their heap may stay) past the most those it held had at once, or none for one without a limit"
	}
	return ""
}

// stuckCopies is how many libraries of programs a tenant's worker no
// longer holds may stay mapped in it (loader.StaysMapped: a CUDA library
// is never closed, its static cudart having registered its fatbin with
// the driver) before the worker takes no new load. Each reload of a CUDA
// function into its tenant's worker maps a fresh copy (stageCopy: a
// reload must not find its last load's statics), so a function scaling to
// zero and back beside a sibling that keeps the worker alive left a copy
// per cycle, its pages, heap and cudart in the process and its module
// with its __device__ data in the context, until the worker passed its
// memory limit and died with every sibling. Reusing a closed copy
// instead would hand a load the statics its last left, which the ABI's
// lifecycle (plover.h: plover_load once per version, plover_unload frees
// what it made) does not ask a bundle to reset. Retired, the worker goes
// on serving what it holds, without a move of any program (a move would
// be a cold load of each), and ends with its last: its copies are
// bounded by this many and the programs it held when retired, each
// counted in its memory limit meanwhile (retune). The tenant's next load
// starts a worker, a process and on a GPU a context (a standby's, made
// already, when the pool has one), where its later loads go: a function
// alone there starts one at each load, as in function scope, until a
// sibling joins it, and the tenant holds two contexts while the retired
// worker lives. Small, as each copy may hold a bundle's whole host memory
// limit; not 1, as a redeploy or one function's rare reload should not
// cost its tenant a second context.
const stuckCopies = 4

// retire takes p, the tenant's worker in t, off the slot: the tenant's
// next load starts another, and p, with t's refs its own now, ends with
// its last program (release). Under d.mu.
func (d *Device) retire(t *tenantSlot, p *proc) {
	p.tenant.retired, p.tenant.refs = true, t.refs
	t.p, t.refs = nil, 0
	d.dropEmptySlot(p.tenant.name, t)
}

// addProgram gives g an id in p, counts it in p's task bound and memory
// limit and marks it busy for p's CPU weight (weighLoop's).
func (p *proc) addProgram(g *program) {
	p.enroll(g)
	p.retune()
	g.busyNow() // loaded for a request about to run
}

// enroll is addProgram's part under p.mu, released by a defer as every
// lock of a load's path (tenantTurn): a panic here is recovered by the
// request's transport, and the worker's lock must not outlive it.
func (p *proc) enroll(g *program) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tenant.nextID++
	g.id = p.tenant.nextID
	p.tenant.names = append(p.tenant.names, g.name)
	g.gone = make(chan struct{})
	p.tenant.progs[g.id] = g
	if n := len(p.tenant.progs); n > p.tenant.tasksFor && !p.exited {
		p.d.opts.Pids.Raise(p.pid, p.pids, p.cgroup, p.tenant.tasksFor, n)
		p.tenant.tasksFor = n
	}
}

// removeProgram takes g out of p's programs and weight (a program being
// unloaded is not busy); its memory limit stays counted (retune), and its
// last lines are still its own (leaving). g is gone (Exited).
func (p *proc) removeProgram(g *program) { p.dropProgram(g, false) }

// dropProgram is removeProgram; unloading says the server has yet to
// unload g from the worker (closeShared, which calls unloaded once done).
func (p *proc) dropProgram(g *program, unloading bool) {
	p.unenroll(g, unloading)
	g.leave()
	p.retune()
	p.tenant.poke()
}

// unenroll is dropProgram's part under p.mu (enroll's, undone).
func (p *proc) unenroll(g *program, unloading bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.tenant.progs[g.id]; ok {
		delete(p.tenant.progs, g.id)
		if g.staysMapped() {
			// A load that failed may have mapped its library too (its
			// plover_load failing after the dlopen): counted alike.
			p.tenant.stuck.Add(1)
		}
		if g.memLimit == 0 {
			p.tenant.unlimited = true
		} else {
			if p.tenant.gone == nil {
				p.tenant.gone = map[loadKey]int64{}
			}
			k := g.loadKey()
			p.tenant.gone[k] = max(p.tenant.gone[k], g.memLimit)
		}
	}
	if p.tenant.leaving == nil {
		p.tenant.leaving = map[*program]bool{}
	}
	p.tenant.leaving[g] = unloading
}

// unloaded says the server is done unloading g (dropProgram): its lines
// are its own for outputGrace more.
func (p *proc) unloaded(g *program) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tenant.leaving[g] = false
	p.forget(monoNow() - int64(outputGrace))
}

// forget drops from leaving the programs unloaded that wrote nothing
// since recent (under mu): each unload and each line prunes it, so that
// it holds the few programs leaving now.
func (p *proc) forget(recent int64) {
	for g, unloading := range p.tenant.leaving {
		if !unloading && !g.mayHaveSaid(recent) {
			delete(p.tenant.leaving, g)
		}
	}
}

// leave closes g's Exited, once: g was unloaded, or its worker died
// (programsGone).
func (g *program) leave() { g.leaveOnce.Do(func() { close(g.gone) }) }

// programsGone closes the Exited of every program p held as it died,
// once its death can be told (done is closed): the others left it before.
func (p *proc) programsGone() {
	if p.tenant == nil {
		return
	}
	p.mu.Lock()
	held := slices.Collect(maps.Values(p.tenant.progs))
	p.mu.Unlock()
	for _, g := range held {
		g.leave()
	}
}

// bundleKey is a program's bundle in a tenant's worker: its function and
// its bundle's directory (the cache's, named by the bundle's sha256).
type bundleKey struct{ name, dir string }

func (g *program) bundleKey() bundleKey { return bundleKey{g.name, g.dir} }

// loadKey is what a tenant's worker's memory limit counts a program's
// limit by (retune): its bundle, and for a library that stays mapped
// (staysMapped) the program's id, as each load of it maps a copy of its
// own (stageCopy), with its own statics, heap and runtime, which stay when
// it is unloaded, the next load's beside them. Under g.p's mu.
type loadKey struct {
	bundleKey
	copy uint32
}

func (g *program) loadKey() loadKey {
	k := loadKey{bundleKey: g.bundleKey()}
	if g.staysMapped() {
		k.copy = g.id
	}
	return k
}

// staysMapped: g's library stays mapped in its worker once it is
// unloaded (keepsLibs: its worker's device's target is the one its bundle
// may be built for there). Under g.p's mu.
func (g *program) staysMapped() bool { return g.p.tenant.keepsLibs && g.loadAsked.Load() }

// retune sets a tenant's worker's memory limit to the sum of the limits of
// every bundle it holds or has held, each once (none if one has none); its
// CPU weight is weighLoop's. An unloaded bundle's limit stays in the sum
// while the process lives (it resets with the process): its heap stays
// resident (free rarely gives memory back, a leak never), so leaving it
// out, as the programs' sum alone would (after a redeploy, say), would
// have the watch loop kill the worker, and every sibling with it, for
// memory none of them holds. A library that stays mapped counts at each
// load (loadKey): every load of it is a copy of its own, the last one's
// left beside it; at most stuckCopies of them, unloaded, before the
// worker takes no new load.
//
// What is carried for bundles unloaded is bounded too: once it passes
// overdraw times the most the held programs' limits summed to at once
// (peak), or a function
// without a limit is gone while none held lacks one, the worker is
// overdrawn, and retired as the unload that made it so lets go of its ref
// (release). Else a tenant that keeps one function loaded, its worker
// never ending, raised the limit by every function it deployed and
// deleted beside it, for good, though each left little resident: the
// limit stays within (1+overdraw) times peak and one bundle's. Not the
// held programs' sum as the bound: a sibling larger than the function kept
// loaded, scaling to zero and back, would retire the worker at its first
// unload; and not peak alone: a fixed set of functions scaling to zero
// one after another beside it (each bundle counted once, however often)
// retired the worker at the third, and every later cold start of theirs
// took a process of its own.
func (p *proc) retune() {
	defer p.syncMemGroup() // after the unlock: the group's lock is not under p.mu
	p.mu.Lock()
	defer p.mu.Unlock()
	held, unlimited := int64(0), false
	live := make(map[loadKey]bool, len(p.tenant.progs))
	for _, g := range p.tenant.progs {
		unlimited = unlimited || g.memLimit == 0
		held += g.memLimit
		live[g.loadKey()] = true
	}
	// An unloaded bundle's heap may stay in the process: counted until the
	// bundle is loaded again, whose program's limit then covers it.
	carried := int64(0)
	for k, l := range p.tenant.gone {
		if !live[k] {
			carried += l
		}
	}
	p.tenant.peak = max(p.tenant.peak, held)
	p.tenant.overdrawn.Store(!unlimited && (p.tenant.unlimited || carried > overdraw*p.tenant.peak))
	limit := held + carried
	if unlimited || p.tenant.unlimited {
		limit = -1
	}
	switch cur := p.memLimit.Load(); {
	case !p.tenant.tuned || limit < 0:
		p.memLimit.Store(max(limit, 0))
	case cur > 0 && limit > cur: // 0 (none) is the highest
		p.memLimit.Store(limit)
	}
	p.tenant.tuned = true
}

// overdraw is how many times its peak a tenant's worker may carry for
// bundles it unloaded before it is retired: room for the tenant's own
// functions scaling to zero in turn beside the one it keeps loaded, a
// bound on deploys and deletes beside it.
const overdraw = 4

// stageTenant links g's bundle into p's stage, its files' names led by
// g's prefix: no directory each, whose inode a mkdir at every load would
// cost (0.1-0.3 ms of ext4 here, more after many deletes).
func (p *proc) stageTenant(spec device.ProgramSpec, g *program) error {
	g.prefix = stagePrefix(g.id)
	var err error
	g.staged, err = stage(spec, p.stage, g.prefix)
	return err
}

// stageCopy stages g's bundle again, under a prefix of its own copy's,
// its library a copy: the worker answered its load that the linked file is
// mapped there already (wire.StMapped: a CUDA library is never closed; a
// host one may stay), and dlopen would hand that mapping back, its statics
// as its last load left them, or another program's. A new name too: the
// worker's check gave the old one to that mapping (dlopen adds a name it
// matched by the file's device and inode to the object's names).
func (p *proc) stageCopy(spec device.ProgramSpec, g *program) error {
	g.unstage()
	g.prefix = stagePrefix(g.id) + "copy."
	var err error
	if g.staged, err = stage(spec, p.stage, g.prefix); err != nil {
		return err
	}
	lib := filepath.Join(p.stage, g.prefix+spec.Manifest.Library)
	os.Remove(lib)
	if err := fileutil.Copy(filepath.Join(spec.Dir, spec.Manifest.Library), lib); err != nil {
		return fmt.Errorf("stage %s: %w", spec.Manifest.Library, err)
	}
	return nil
}

// stagePrefix leads the names of program id's files in its worker's
// stage. Ids are never reused in a process, so no two programs' files
// meet; manifest file names are plain (abi), so none has a '/'.
func stagePrefix(id uint32) string { return "p" + strconv.FormatUint(uint64(id), 10) + "." }

// blame decides, as a tenant's worker is reaped, which of its programs
// lost it by their own fault; the others lost it as collateral (Shared:
// the engine retries their request and counts no crash). sig is the
// signal that ended it (0: an exit). The rule:
//
//   - a fatal signal (not the server's SIGKILL) whose handler named a
//     program the process holds (wire.FatalMark), or the worker's own exit
//     for its device's fault (wire.ExitFault: a sticky CUDA error) that
//     named the program whose run or call met the fault first (the mark
//     with signal 0; package inside, claimFault): that program; or one
//     it held, unloaded while a chain (or its unload hook) of its ran on:
//     none of the rest. A bundle can write the mark on its pipe itself
//     (its clients cannot: their bytes reach stdout and stderr at most),
//     naming a sibling, but only of its own tenant, and it then dies as
//     the culprit's crash would; or naming one unloaded, which no function's
//     back-off counts: the death is then not named, and the tenant's
//     back-off counts it (a bundle that crashed its worker so at every
//     request would otherwise be held by nothing);
//   - the server's kill for one program's run or call (killedBy: a run
//     past its deadline and grace, a call that hung), when the process
//     died by that kill (SIGKILL), not by a crash of its own first: that
//     program (named only if held when killed: an unload's call that hung
//     is no function's crash either, where a load that hung is, though
//     its failure may let it go before this runs);
//   - anything else (a signal with no mark: a thread of a bundle's own;
//     an exit with none: an exit(), a device fault whose mark the pipe
//     did not take; a memory-limit kill; a broken channel): every program,
//     none Shared. Who did it is not known, and guessing from the runs
//     in flight would make a bundle that crashes outside its runs a
//     retried, never backed-off bystander while its sibling takes the
//     blame. The tenant's back-off (tenantChurn) bounds the rest.
//
// Before done is closed, while the runs and the call that saw the death
// still count.
func (p *proc) blame(sig syscall.Signal) {
	if p.tenant == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	progs := p.tenant.progs
	var culprits []*program
	named := true
	// A mark is believed for an exit too: the worker writes one only as it
	// exits for a device fault, and bundle code that writes one itself
	// could as well raise a signal after it (the first rule's caveat).
	// Never for the server's SIGKILL, whose cause is its own (killedBy).
	if id := p.fatal.Load(); id != 0 && sig != syscall.SIGKILL && id <= p.tenant.nextID {
		if progs[id] != nil {
			culprits = append(culprits, progs[id])
			p.tenant.by = progs[id].name
		} else { // an unloaded program's: no one left is at fault
			named = false
			if int(id) <= len(p.tenant.names) {
				// Named however long ago it was unloaded: its fini or
				// unload hook may run, and crash, after leaving forgot it.
				p.tenant.by = p.tenant.names[id-1]
			}
		}
	} else if g := p.killedBy.Load(); g != nil && sig == syscall.SIGKILL {
		culprits = append(culprits, g)
		named = p.killedHeld // as when killed: a hung load's failure lets g go, racing this
		p.tenant.by = g.name
	} else {
		named = false
		for _, g := range progs {
			culprits = append(culprits, g)
		}
	}
	for _, g := range culprits {
		g.blamed.Store(true) // by stays unset where every held program is: no one at fault is known
	}
	p.tenant.named = named
}

// collateral: g lost its (tenant's) worker by another program's fault.
// Known once the process is reaped: a worker not reaped (proc.end gave up)
// has no blame, and its death counts against every program in it, as one
// no single program is found at fault for does.
func (g *program) collateral() bool {
	return g.p.tenant != nil && !g.blamed.Load() && !g.p.alive()
}

// shares marks err, a loss of g's worker, as collateral where it was.
func (g *program) shares(err error) error {
	if pe := (*ProcessExit)(nil); errors.As(err, &pe) {
		g.share(pe)
	}
	return err
}

// share marks e, the loss of g's worker, as collateral where it was, with
// the function at fault where blame found one.
func (g *program) share(e *ProcessExit) {
	if e.Shared = g.collateral(); e.Shared {
		g.p.mu.Lock()
		defer g.p.mu.Unlock()
		e.By = g.p.tenant.by
	}
}

// lost, failed and idleExit are the proc's, for g's run or call, with its
// share of the blame.
func (g *program) lost(during string) error { return g.shares(g.p.lost(during)) }

func (g *program) failed(err error, during string) error {
	return g.shares(g.p.failed(g, err, during))
}

func (g *program) idleExit() error { return g.shares(g.p.idleExit()) }

// outputGrace is how long after a run or call of a program ends a line
// read from its tenant's worker still counts as possibly its: the server
// reads the worker's pipes in the background, and a run's last lines,
// written before its reply, are often read after it.
const outputGrace = 50 * time.Millisecond

// tenantOutput passes a line of a tenant's worker to the program it is
// attributable to: the only one whose run or control call is in flight,
// or ended within outputGrace, or that closed an instance within it (the
// worker runs plover_instance_fini then). A program being unloaded counts
// until outputGrace after its unload (leaving): its plover_unload hook and
// its instances' fini run then, and their lines are its own, never a
// sibling's, though it left the programs held first. A line printed while
// several are active, or while none is (a thread of a bundle's own), goes
// to no function's output: the readers of one function's lines may not be
// allowed to read another's (a token for one function of the tenant, a
// redeploy under another tenant), and a guess would show them a
// sibling's. Programs that share their output (versions of one
// function, in one life of its name) are one function there: a line of
// theirs is its own whichever of them wrote it. The server's log gets
// the others instead, the first
// unattributedLines of each worker, with its pid and tenant. The pipes do
// not say who wrote: a sibling's thread that prints while one program
// alone is active is attributed to that one, within its tenant, as is a
// fini or an unload hook that prints past outputGrace. False when p has
// no program to give it to (a standby's line).
func (p *proc) tenantOutput(l api.LogLine) bool {
	recent := monoOf(l.Time) - int64(outputGrace)
	p.mu.Lock()
	var to *program
	active, one := 0, true
	count := func(g *program) {
		one = one && (to == nil || sameOutput(to.out, g.out))
		to = g
		active++
	}
	for _, g := range p.tenant.progs {
		if g.mayHaveSaid(recent) {
			count(g)
		}
	}
	p.forget(recent)
	for g := range p.tenant.leaving { // those left are active
		count(g)
	}
	held, tenant := len(p.tenant.progs), p.tenant.name
	p.mu.Unlock()
	switch {
	case held == 0:
		return false
	case active == 1 || active > 1 && one:
		// One program, or versions of one function (a redeploy's new one
		// beside the old one's last requests, a version a pipeline
		// pinned): their output is the function's, whichever wrote.
		if o := to.out; o != nil {
			o.Add(l)
		}
	case p.tenant.unattributed.Add(1) <= unattributedLines:
		p.d.opts.Log.Info("a tenant's worker wrote a line that cannot be attributed to one function: kept out of every function's log",
			"pid", p.pid, "tenant", tenant, "programs_active", active, "stream", l.Stream, "line", l.Line)
	}
	return true
}

// sameOutput reports a and b the one output, a function's, which each of
// its versions is given: never nil, nor an output of a type that cannot
// be compared.
func sameOutput(a, b device.Output) bool {
	// The value's own comparability: a comparable type (a struct with an
	// interface field) may hold one that is not, and == would panic.
	return a != nil && reflect.ValueOf(a).Comparable() && a == b
}

// mayHaveSaid: a line read outputGrace after recent may be g's: a run or
// a control call of it in flight, or one of them, or the close of an
// instance of it, ended since recent. Under g.p's mu.
func (g *program) mayHaveSaid(recent int64) bool {
	return g.runs.Load() > 0 || g.p.callingProg == g ||
		max(g.runEnded.Load(), g.callEnded.Load(), g.instClosed.Load()) > recent
}

// instanceClosed notes that the server is closing an instance of g: the
// worker runs its plover_instance_fini as it reads the close, and what
// that prints is g's (tenantOutput).
func (g *program) instanceClosed() {
	if g.p.tenant != nil {
		g.instClosed.Store(monoNow())
	}
}

// unattributedLines is how many lines of a tenant's worker that are no
// one function's reach the server log (as startLines for a standby's).
const unattributedLines = startLines
