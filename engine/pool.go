package engine

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/evict"
)

// pool is a version's run pool: the slots that admit its runs and the
// queue before them, its instances (idle or busy) and the programs they
// run on, the references of the requests that use it, and its record of
// worker crashes. Its lock is taken in this file alone; the rest of the
// engine asks it.
type pool struct {
	v *version // whose name, manifest and policy (load writes them) it reads
	e *Engine  // makes its instances (device, memory, program); set by open
	// owner unloads the version once its last reference goes: its
	// teardown (load.go), reached through an interface so that the pool
	// stays below the files that load and run (TestEngineFilesCallDownOnly).
	owner unloader

	// The admission: written by open, before the version is loaded.
	max int // max_instances: slots, one per running request (batch: per run)
	// freed is told when a slot frees (the batcher, whose queued requests
	// wait for a free slot rather than in queue); nil: no one.
	freed slotWaiter
	// adm guards the slots held and the queue; never held across a wait,
	// nor while p.mu is taken. A slot freed while requests wait is handed
	// to the oldest under it, so that it counts as running, not waiting,
	// from that moment: with a channel of slots a waiter given one still
	// counted as waiting until it ran, and a request sent then at
	// max_queue was refused (2 closed-loop clients of a function taking
	// one running and one waiting: 299 of 600 requests 429).
	adm     sync.Mutex
	held    int          // slots held
	queue   []*waiter    // requests waiting for a slot, oldest first
	waiting atomic.Int32 // len(queue), read without adm

	// backoffUntil (Unix ns, 0: none) fails requests fast after repeated
	// worker crashes; crashCount is len(crashes), so that the hot path
	// checks both without the lock.
	backoffUntil atomic.Int64
	crashCount   atomic.Int32

	mu      sync.Mutex
	idle    []*instance
	live    int // instances that exist (idle or busy)
	refs    int // requests between resolve and the end of Invoke, batch runs and evictions in progress
	retired bool
	dead    bool
	// evicted: an eviction took the whole version (evictEmpty); no
	// request may take it any more, though it is torn down only once
	// the eviction retires it.
	evicted    bool
	placements []*placement
	lastUsed   time.Time   // last request end (or load)
	crashes    []time.Time // oldest first; reset by a success
	// next is the copy that took over from this version (carryTo): a
	// crash counted here afterwards (a worker dying before the teardown)
	// is its successor's.
	next *pool
}

// slotWaiter has requests waiting for a free slot of their own accord.
type slotWaiter interface{ dispatch() }

// unloader unloads a version's programs and bundle.
type unloader interface{ teardown() }

// open readies the pool of a version being loaded: runs is its
// max_instances, freed who waits for slots of its own accord (nil: no
// one), now the load's end (the version's last use so far).
func (p *pool) open(e *Engine, runs int, freed slotWaiter, now time.Time) {
	p.e, p.max, p.freed = e, runs, freed
	p.mu.Lock()
	p.lastUsed = now
	p.mu.Unlock()
}

// acquire waits for a slot, in FIFO order, until the deadline, and says
// whether it waited. The fast path takes no timer and allocates nothing; a
// full queue fails at once, and so, waiting or not, does every request
// once the engine refuses them (RefuseQueued).
func (p *pool) acquire(ctx context.Context, deadline time.Time, gone func() bool) (waited bool, err error) {
	shut := p.e.shutting()
	select {
	case <-shut: // the node stops within a second: a run begun now would be cut
		return false, shutDown(p.v.fn.name, "was about to take one of its instances")
	default:
	}
	p.adm.Lock()
	if p.held < p.max {
		p.held++
		p.adm.Unlock()
		return false, nil
	}
	if len(p.queue) >= p.v.policy.queue {
		p.adm.Unlock()
		return true, p.busy()
	}
	w := &waiter{ready: make(chan struct{})}
	p.queue = append(p.queue, w)
	p.waiting.Store(int32(len(p.queue)))
	p.adm.Unlock()
	name := p.v.fn.name
	wait := time.Until(deadline)
	if wait <= 0 {
		return true, p.leave(w, errorf(errdefs.KindTimeout, nil, "function %s: the request's deadline passed before it ran", name))
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	var poll <-chan time.Time
	if gone != nil {
		tk := time.NewTicker(goneInterval)
		defer tk.Stop()
		poll = tk.C
	}
	for {
		select {
		case <-w.ready:
			return true, nil
		case <-ctx.Done():
			return true, p.leave(w, errorf(errdefs.KindUnavailable, ctx.Err(), "function %s: the request was cancelled while waiting for one of %d instances", name, p.max))
		case <-shut:
			return true, p.leave(w, shutDown(name, fmt.Sprintf("waited for one of its %d instances", p.max)))
		case <-t.C:
			return true, p.leave(w, errorf(errdefs.KindTimeout, nil, "function %s: the request's deadline passed while it waited for one of %d instances", name, p.max))
		case <-poll:
			if gone() {
				return true, p.leave(w, errorf(errdefs.KindGone, nil, "function %s: the client went away while the request waited", name))
			}
		}
	}
}

// waiter is a request waiting for a slot: ready is closed once it is
// handed one (given, under adm).
type waiter struct {
	ready chan struct{}
	given bool
}

// leave takes w out of the queue as it gives its wait up, and returns
// err; a slot handed to it meanwhile goes to the next (or back), since its
// request will not run.
func (p *pool) leave(w *waiter, err error) error {
	p.adm.Lock()
	if w.given {
		p.freeLocked()
	} else if i := slices.Index(p.queue, w); i >= 0 {
		p.queue = slices.Delete(p.queue, i, i+1)
		p.waiting.Store(int32(len(p.queue)))
	}
	p.adm.Unlock()
	if w.given && p.freed != nil {
		p.freed.dispatch()
	}
	return err
}

// goneInterval is how often a queued request checks for its client.
const goneInterval = 20 * time.Millisecond

// trySlot takes a slot if one is free now, waiting for nothing.
func (p *pool) trySlot() bool {
	p.adm.Lock()
	defer p.adm.Unlock()
	if p.held < p.max {
		p.held++
		return true
	}
	return false
}

// dropSlot gives back a slot without telling freed: for its own use, from
// under its lock.
func (p *pool) dropSlot() {
	p.adm.Lock()
	p.freeLocked()
	p.adm.Unlock()
}

// freeLocked frees a slot: the oldest waiting request's now, or none's.
// Called with adm held.
func (p *pool) freeLocked() {
	if len(p.queue) > 0 {
		w := p.queue[0]
		p.queue[0] = nil
		p.queue = p.queue[1:]
		p.waiting.Store(int32(len(p.queue)))
		w.given = true
		close(w.ready)
		return
	}
	p.held--
}

// release gives back a slot. A batching function's queued requests wait
// for a free slot rather than in queue, so they are told.
func (p *pool) release() {
	p.dropSlot()
	if p.freed != nil {
		p.freed.dispatch()
	}
}

// slotFree reports a slot free now.
func (p *pool) slotFree() bool {
	p.adm.Lock()
	defer p.adm.Unlock()
	return p.held < p.max
}

// busy is the 429 of a version whose queue is full (a batching one: its
// batch queue).
func (p *pool) busy() *errdefs.Error {
	v := p.v
	if v.batch != nil {
		return errorf(errdefs.KindBusy, nil, "function %s is busy: its batch queue holds max_queue %d plus a batch", v.fn.name, v.policy.queue)
	}
	return errorf(errdefs.KindBusy, nil, "function %s is busy: %d instances running and %d requests waiting (max_queue)", v.fn.name, p.max, v.policy.queue)
}

// full reports every slot taken and queue requests waiting for one.
func (p *pool) full(queue int) bool {
	p.adm.Lock()
	defer p.adm.Unlock()
	return p.held == p.max && len(p.queue) >= queue
}

// queued is the requests waiting for a slot.
func (p *pool) queued() int { return int(p.waiting.Load()) }

// ref takes a reference for a request (or a run, or an eviction): false
// once the version is gone.
func (p *pool) ref() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dead || p.evicted {
		return false
	}
	p.refs++
	return true
}

// evictEmpty marks the pool taken by an eviction of its whole version if
// it still holds no instance and no reference but the eviction's own
// (held): a request that took the version since the eviction was offered
// it keeps it, and none takes it after (ref), so the memory the eviction
// counts as freed is freed once it retires the version.
func (p *pool) evictEmpty(held int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.live != 0 || p.refs != held || p.dead {
		return false
	}
	p.evicted = true
	return true
}

// unref drops a reference; the last one of a retired version tears it
// down.
func (p *pool) unref() {
	p.mu.Lock()
	p.refs--
	done := p.retired && p.refs == 0 && !p.dead
	if done {
		p.dead = true
	}
	p.mu.Unlock()
	if done {
		p.owner.teardown()
	}
}

// retire stops the pool from taking new requests and closes its idle
// instances; the version is torn down when the last in-flight request
// ends.
func (p *pool) retire() {
	p.mu.Lock()
	p.retired = true
	idle := p.idle
	p.idle = nil
	p.live -= len(idle)
	done := p.refs == 0 && !p.dead
	if done {
		p.dead = true
	}
	p.mu.Unlock()
	if done {
		defer p.owner.teardown() // after the idle instances, and when closing one panics too
	}
	eachDespitePanics(idle, closeInstance)
}

// closeInstance closes in's device instance.
func closeInstance(in *instance) { in.inst.Close() }

// takeIdle takes an idle instance out of the pool, nil when none is: one
// on prefer (nil: any) first, the most recently used of them.
func (p *pool) takeIdle(prefer device.Device) *instance {
	p.mu.Lock()
	defer p.mu.Unlock()
	// Not one of a program whose process died: abandon marks it dead
	// before it takes its idle instances out.
	k := -1
	for j := len(p.idle) - 1; j >= 0; j-- {
		if p.idle[j].dev.dead.Load() {
			continue
		}
		if k < 0 {
			k = j // the most recently used
		}
		if prefer == nil || p.idle[j].dev.dev == prefer {
			k = j
			break
		}
	}
	if k < 0 {
		return nil
	}
	in := p.idle[k]
	p.idle = append(p.idle[:k], p.idle[k+1:]...)
	return in
}

// added counts an instance newly made (busy: its maker uses it or puts it).
func (p *pool) added() {
	p.mu.Lock()
	p.live++
	p.mu.Unlock()
}

// put returns an instance to the idle pool, or closes it when it is broken or
// its version retired; now is when it was last used (the caller's reading,
// so the hot path reads the clock once at the end of a request).
func (p *pool) put(in *instance, broken bool, now time.Time) {
	p.mu.Lock()
	p.lastUsed = now
	if !broken && !p.retired && !in.dev.dead.Load() {
		in.lastUsed = now
		p.idle = append(p.idle, in)
		p.mu.Unlock()
		return
	}
	p.live--
	p.mu.Unlock()
	in.inst.Close()
}

// building reports a slot held by a request or a warm that has no
// instance yet (it may be making one, not counted in live until made).
func (p *pool) building() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.heldNow() > p.live-len(p.idle)
}

// heldNow is the slots held now (adm is taken under p.mu, never the
// other way round).
func (p *pool) heldNow() int {
	p.adm.Lock()
	defer p.adm.Unlock()
	return p.held
}

// instances is how many instances exist, and whether the pool retired.
func (p *pool) instances() (live int, retired bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.live, p.retired
}

// usage is the instances busy and idle, and the programs loaded.
func (p *pool) usage() (busy, idle, programs int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.live - len(p.idle), len(p.idle), len(p.placements)
}

// lender is the program whose slots a request's body would land in: the
// program of the instance take would give now, else the first loaded;
// nil when none is loaded, or the version is retired or gone. It takes a
// reference on the version with the program it returns (Land's landing
// holds it until its release), in the one lock.
func (p *pool) lender() device.Program {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dead || p.evicted || p.retired {
		return nil
	}
	var prog device.Program
	if n := len(p.idle); n > 0 {
		prog = p.idle[n-1].dev.prog
	} else if len(p.placements) > 0 {
		prog = p.placements[0].prog
	}
	if prog != nil {
		p.refs++
	}
	return prog
}

// placement is the program on dev, or nil.
func (p *pool) placement(dev device.Device) *placement {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pl := range p.placements {
		if pl.dev == dev && !pl.dead.Load() { // one dead is on its way out (abandon)
			return pl
		}
	}
	return nil
}

// placed adds a program just loaded.
func (p *pool) placed(pl *placement) {
	p.mu.Lock()
	p.placements = append(p.placements, pl)
	p.mu.Unlock()
}

// programs is a copy of the programs loaded, for reading without the lock.
func (p *pool) programs() []*placement {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.placements)
}

// unplace takes every program away, for the caller to close: the
// version's teardown.
func (p *pool) unplace() []*placement {
	p.mu.Lock()
	defer p.mu.Unlock()
	ps := p.placements
	p.placements = nil
	return ps
}

// abandon forgets pl after its process died: its idle instances are
// closed, busy ones are closed as they come back (put sees pl.dead), and
// the next instance loads a fresh program. It reports whether this call
// did it, so that one death is counted once however many requests saw it.
func (p *pool) abandon(pl *placement) bool { return p.abandonThen(pl, nil) }

// hookAbandoning runs in the call that abandons a placement, under the
// pool's lock, before it counts anything: a test holds that call there. A
// plain variable: set only by tests, which do not run in parallel.
var hookAbandoning = func() {}

// abandonThen is abandon, and where this call abandons pl it runs first
// (nil: nothing) under the pool's lock before it forgets pl, so that what
// first records (a crash counted towards back-off) is in place before any
// other caller's abandon of pl returns. Two callers see one death: the
// request whose run met it and watchExit, whichever comes first. Were the
// count made after the lock, the request could answer its client while
// watchExit, first, had yet to count: the client's next request then
// found no back-off and crashed one more worker than crashLimit (CI's
// TestIsolationProcess/backoff, "backed off after 6 crashes, want 5").
func (p *pool) abandonThen(pl *placement, first func()) bool {
	p.mu.Lock()
	if !pl.dead.CompareAndSwap(false, true) {
		p.mu.Unlock()
		return false
	}
	hookAbandoning()
	if first != nil {
		first()
	}
	for i, q := range p.placements {
		if q == pl {
			p.placements = append(p.placements[:i:i], p.placements[i+1:]...)
			break
		}
	}
	var closing []*instance
	kept := p.idle[:0]
	for _, in := range p.idle {
		if in.dev == pl {
			closing = append(closing, in)
		} else {
			kept = append(kept, in)
		}
	}
	p.idle = kept
	p.live -= len(closing)
	p.mu.Unlock()
	for _, in := range closing {
		in.inst.Close()
	}
	if err := pl.prog.Close(); err != nil {
		p.v.lg.Info("closing a dead program", "function", p.v.fn.name, "version", p.v.rec.ID, "device", pl.dev.Name(), "error", err)
	}
	return true
}

// reap closes the instances idle for ttl or longer (the least recently
// used first), keeping keep, and reports how many it closed and whether
// the pool has been empty and unused for ttl (the version may go).
func (p *pool) reap(now time.Time, ttl time.Duration, keep int) (closed int, zero bool) {
	var closing []*instance
	p.mu.Lock()
	// idle is a stack: the least recently used instances are at the bottom.
	for len(p.idle) > 0 && p.live > keep && now.Sub(p.idle[0].lastUsed) >= ttl {
		closing = append(closing, p.idle[0])
		p.idle = p.idle[1:]
		p.live--
	}
	// A version backing off keeps its pool: its requests fail before they
	// use it (lastUsed stays), and unloading it would make a fresh pool
	// with no back-off, the crash count started over.
	zero = p.live == 0 && p.refs == 0 && keep == 0 && now.Sub(p.lastUsed) >= ttl && now.UnixNano() >= p.backoffUntil.Load()
	p.mu.Unlock()
	eachDespitePanics(closing, closeInstance)
	return len(closing), zero
}

// reclaimable is what evicting the idle instances on dev above keep would
// free, and with whole also the programs there when the pool would be left
// with no instance and no request: only where every instance is on dev,
// as idleOn offers a program only once its pool has none (a function with
// instances on two devices counted its program on one, and an eviction
// took its idle instance there, then found nothing more to take: a 503
// after a warm instance lost for nothing).
func (p *pool) reclaimable(dev device.Device, keep int, whole bool) int64 {
	var n int64
	p.mu.Lock()
	defer p.mu.Unlock()
	spare, on := p.live-keep, 0
	for _, in := range p.idle {
		if in.dev.dev == dev {
			on++
			if spare > 0 {
				n += in.bytes
				spare--
			}
		}
	}
	if whole && keep == 0 && p.refs == 0 && on == p.live {
		for _, pl := range p.placements {
			if pl.dev == dev {
				n += pl.consts
			}
		}
	}
	return n
}

// idleOn appends to idle (and from, each with fv) the idle instances on
// dev above keep, and reports whether the pool holds no instance and no
// reference but held (an eviction's), and when it was last used.
func (p *pool) idleOn(dev device.Device, keep, held int, fv funcVersion, idle []evict.Idle, from []idleRef) ([]evict.Idle, []idleRef, bool, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.live > keep { // min_instances hold even under memory pressure
		for _, in := range p.idle {
			if in.dev.dev == dev {
				idle = append(idle, evict.Idle{Function: fv.f.name, Instance: true, Bytes: in.bytes, LastUsed: in.lastUsed})
				from = append(from, idleRef{fv, in})
			}
		}
	}
	return idle, from, p.live == 0 && p.refs == held, p.lastUsed
}

// evict takes in out of the pool for an eviction, with a reference on the
// version that the eviction drops once in is closed, if it is still idle
// and above keep (requests may have taken it since it was seen).
func (p *pool) evict(in *instance, keep int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := slices.Index(p.idle, in)
	if i < 0 || p.live <= keep || p.dead {
		return false
	}
	p.idle = slices.Delete(p.idle, i, i+1)
	p.live--
	p.refs++
	return true
}

// unevict puts back an instance that evict took for a reservation that
// was then refused, with the eviction's reference: closing it would lose
// a warm instance for nothing. It goes where its last use puts it in the
// stack of idle ones (the least recently used at the bottom); one whose
// version retired or whose program died meanwhile is closed, as put would.
func (p *pool) unevict(in *instance) {
	p.mu.Lock()
	back := !p.retired && !p.dead && !in.dev.dead.Load()
	if back {
		i := slices.IndexFunc(p.idle, func(o *instance) bool { return o.lastUsed.After(in.lastUsed) })
		if i < 0 {
			i = len(p.idle)
		}
		p.idle = slices.Insert(p.idle, i, in)
		p.live++
	}
	p.mu.Unlock()
	if !back {
		in.inst.Close()
	}
	p.unref()
}

// Crash back-off: this many worker crashes within crashWindow, with no
// success in between, fail the version's requests fast for backoffFor.
const (
	crashLimit  = 5
	crashWindow = time.Minute
	backoffFor  = time.Minute
)

// crashed records a worker crash and reports whether the pool now backs
// off.
func (p *pool) crashed(now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.crashedLocked(now)
}

// crashedLocked is crashed with p.mu held. A successor's lock is taken
// under it: a copy never points back, so the order is old before new.
func (p *pool) crashedLocked(now time.Time) bool {
	if p.next != nil {
		return p.next.crashed(now)
	}
	p.crashes = append(p.crashes, now)
	for len(p.crashes) > 0 && now.Sub(p.crashes[0]) > crashWindow {
		p.crashes = p.crashes[1:]
	}
	p.crashCount.Store(int32(len(p.crashes)))
	if len(p.crashes) < crashLimit {
		return false
	}
	p.crashes = nil
	p.crashCount.Store(0)
	p.backoffUntil.Store(now.Add(backoffFor).UnixNano())
	return true
}

// carryTo gives nv, the unloaded copy that takes over from p's version as
// its function's current one (an eviction or the reaper unloads it), p's
// record of crashes and back-off, and returns nv: a fresh count let a
// function whose plover_instance_init always fails, evicted between its
// requests, fail for ever and never back off (review G, LOW 7).
func (p *pool) carryTo(nv *version) *version {
	p.mu.Lock()
	nv.pool.crashes = slices.Clone(p.crashes)
	nv.pool.crashCount.Store(int32(len(p.crashes)))
	// Before next is published: a crash forwarded once it is may set
	// the copy's back-off, which this must not overwrite.
	nv.pool.backoffUntil.Store(p.backoffUntil.Load())
	p.next = &nv.pool
	p.mu.Unlock()
	return nv
}

// failing reports whether p has a record worth carrying at now: crashes
// not yet past crashWindow, or a back-off not yet over.
func (p *pool) failing(now time.Time) bool {
	if p.backoffUntil.Load() > now.UnixNano() {
		return true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.crashes) > 0 && now.Sub(p.crashes[len(p.crashes)-1]) <= crashWindow
}

// succeeded ends a run of crashes; the common case takes no lock.
func (p *pool) succeeded() {
	if p.crashCount.Load() == 0 {
		return
	}
	p.mu.Lock()
	p.crashes = p.crashes[:0]
	p.crashCount.Store(0)
	p.mu.Unlock()
}

// backingOff is the 503 of a pool backing off at now, or nil.
func (p *pool) backingOff(now time.Time) error {
	if b := p.backoffUntil.Load(); b != 0 && now.UnixNano() < b {
		return p.backoffError(b)
	}
	return nil
}

// backoffError is the 503 of a version backing off after crashes, which
// carries when the back-off ends (the transports' Retry-After). A deploy
// of the same bytes makes no new version, so it takes --force to end it
// early.
func (p *pool) backoffError(until int64) error {
	end := time.Unix(0, until)
	e := errorf(errdefs.KindUnavailable, nil, "function %s is backing off: it failed %d times within %v (worker crashes, failing plover_load or plover_instance_init); requests fail until %s or a redeploy (plover deploy --force for the same bytes)",
		p.v.fn.name, crashLimit, crashWindow, end.UTC().Format(time.RFC3339))
	e.RetryAt = end
	return e
}
