package worker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/worker/wire"
)

// The pool slots of a program: shared memory the worker maps and registers
// with its device once (OpSlot), lent before a request's body is read so
// that the body lands where the worker's device reads it, and its output
// is written to the client from where the device put it. A slot is one
// request's from its lending to its Release (after the response is
// written), and only its program's worker ever maps it: a worker that
// writes into its slots after replying can spoil only the answers of the
// functions it runs, its own in function scope, and in tenant scope every
// function of its tenant's (each of their bundles can write the whole
// process's memory, these slots too), never another tenant's. A slot is
// never lent again before its response is out, and one left free past an
// idle bound is given back, so that a burst's slots do not stay for the
// worker's life (slotidle.go).

// maxPoolSlots bounds a program's pool slots: runs in flight on its
// instances plus requests queued or uploading beyond them. Past it a body
// is read into ordinary memory and copied into the instance's own slot.
const maxPoolSlots = 32

// slotPool is a program's pool slots.
type slotPool struct {
	mu    sync.Mutex
	free  []*poolSlot
	count int // lent and free
	size  [2]int64
	dead  bool // the worker is gone: nothing goes back to free
	// all is every slot the worker took (OpSlot), for its unload to let
	// go of; dropped: it did (dropSlots), and a slot made since is
	// dropped as it is made.
	all     []*poolSlot
	dropped bool
	// discarded holds the slots taken out of use (Discard), still counted
	// (the bound holds for the memory mapped), unmapped with the rest.
	discarded []*poolSlot
	// refusedIdle: its live worker refused to drop an idle slot (its
	// device did not unpin it), which is logged once (slotidle.go).
	refusedIdle bool
}

// poolSlot is one pool slot, seen from the server.
type poolSlot struct {
	g      *program
	id     uint32 // the worker's id for it
	mem    []byte // the server's mapping: input at 0, output at device.SlotOut(maxIn)
	maxIn  int64
	out    int64
	pinned int64 // bytes its worker pinned (0: none)
	lent   atomic.Bool
	// freeAt is when it last went back to the pool's free (under the
	// pool's mu): the sweep gives back one free past the idle bound
	// (slotidle.go).
	freeAt time.Time
	// discarded: never lent again (Discard); it goes back to the pool's
	// discarded, not its free.
	discarded atomic.Bool
	// inRun: a run message naming it was sent and its reply not read. A
	// discarded slot is dropped in its worker (dropDiscarded) only while
	// no run is: a run the server left (a panic between the send and the
	// reply) may still write into it, so such a slot goes with its
	// worker (whose reply to the closed instance ends it) or program.
	inRun atomic.Bool

	// holds counts chains still running on it past their request (an
	// overrun: the request was answered at its deadline); released says
	// the request let it go meanwhile: the last hold gives it back.
	mu       sync.Mutex
	holds    int
	released bool
}

func (s *poolSlot) hold() {
	s.mu.Lock()
	s.holds++
	s.mu.Unlock()
}

func (s *poolSlot) unhold() {
	s.mu.Lock()
	s.holds--
	back := s.holds == 0 && s.released
	s.released = s.released && !back
	s.mu.Unlock()
	if back {
		s.giveBack()
	}
}

func (s *poolSlot) Input() []byte         { return s.mem[:s.maxIn:s.maxIn] }
func (s *poolSlot) Output() []byte        { return s.mem[device.SlotOut(s.maxIn):s.size():s.size()] }
func (s *poolSlot) size() int64           { return device.SlotSize(s.maxIn, s.out) }
func (s *poolSlot) Device() device.Device { return s.g.d }

// Owner is the program that lent it: its worker maps the memory.
func (s *poolSlot) Owner() device.Program { return s.g }

// Release gives the slot back to its program's pool, or unmaps it once
// the worker is gone; while a chain that overran its request still runs on
// it, once that chain ends. Releasing twice is a server bug: refused.
func (s *poolSlot) Release() {
	if !s.lent.CompareAndSwap(true, false) {
		panic("worker: a pool slot released twice")
	}
	s.mu.Lock()
	if s.holds > 0 {
		s.released = true
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	s.giveBack()
}

// Discard is Release for a slot whose request's run panicked: the worker
// may still write into it (what the run left is unknown), so it is never
// lent again. Its worker drops it (unpinned, unmapped) once no run of
// its is on it (dropDiscarded), else it goes as its worker or its program
// does (closeSlots), not for the server's life.
func (s *poolSlot) Discard() {
	s.discarded.Store(true)
	s.Release()
}

// running and replied mark a run on s (nil: none) sent and its reply read.
func (s *poolSlot) running() {
	if s != nil {
		s.inRun.Store(true)
	}
}

func (s *poolSlot) replied() {
	if s != nil {
		s.inRun.Store(false)
	}
}

func (s *poolSlot) giveBack() {
	pool := &s.g.slots
	now := time.Now()
	pool.mu.Lock()
	if !pool.dead && s.g.p.alive() {
		switch {
		case !s.discarded.Load():
			s.freeAt = now
			pool.free = append(pool.free, s)
		case s.inRun.Load() || pool.dropped:
			pool.discarded = append(pool.discarded, s)
		default:
			// No run of the worker's uses it: it goes now, its pin
			// with it, not at the program's unload, so that panics on
			// a warm function do not eat the device's pinned budget.
			pool.all = slices.DeleteFunc(pool.all, func(a *poolSlot) bool { return a == s })
			pool.mu.Unlock()
			go s.g.dropDiscarded(s)
			return
		}
		pool.mu.Unlock()
		return
	}
	pool.count--
	pool.mu.Unlock()
	unix.Munmap(s.mem)
}

// dropWait bounds a discarded slot's drop's wait for its worker's control
// channel, dropBound the call once the channel is free: a drop is no
// request's, and a wait behind a sibling's long call must not eat the
// call's own time (a call past its bound kills the worker). Variables for
// tests.
var dropWait, dropBound = 10 * time.Second, 10 * time.Second

// dropDiscarded has the worker unregister and unmap discarded slot s,
// out of the pool's all, then unmaps and uncounts it here. A worker that
// did not drop it (gone, its program unloading, a device that cannot
// unpin, a control channel busy past dropWait) leaves it to its program's
// or worker's end, as before.
func (g *program) dropDiscarded(s *poolSlot) {
	if err := g.dropInWorker(s, "dropping a discarded slot"); err != nil {
		// A worker gone or a program unloading frees the slot anyway: only
		// a live worker's refusal keeps memory longer than expected.
		log := g.d.opts.Log.Debug
		if g.Alive() {
			log = g.d.opts.Log.Warn
		}
		what := "its memory"
		if s.pinned > 0 {
			what = "its pinned memory"
		}
		log("a worker did not drop a discarded request slot: "+what+" stays counted until the function's program unloads", "function", g.name, "pid", g.p.pid, "error", err)
		g.keepSlot(s, false)
		return
	}
	g.forgetSlot(s)
}

// dropInWorker has g's worker unregister (unpin) and unmap pool slot s,
// which the caller took out of the pool's free and all and no run is on;
// during says why, for a call that fails or hangs.
func (g *program) dropInWorker(s *poolSlot, during string) error {
	ctx, cancel := context.WithTimeout(context.Background(), dropWait)
	defer cancel()
	raw, err := g.p.callTurn(ctx, dropBound, g, wire.Control{Op: wire.OpDropSlot, Prog: g.id, Slot: s.id}, nil, during)
	var rep wire.Reply
	if err == nil {
		rep, err = g.reply(wire.OpDropSlot, raw, during)
	}
	if err == nil && rep.St != wire.StOK {
		err = wire.ErrorOf(rep.St, rep.Text)
	}
	if err != nil {
		return fmt.Errorf("slot %d: %w", s.id, err)
	}
	return nil
}

// forgetSlot unmaps and uncounts slot s, which its worker dropped: its
// bytes mapped and pinned there, its place in the pool's count, the
// server's mapping.
func (g *program) forgetSlot(s *poolSlot) {
	pool := &g.slots
	g.p.dropSlot(s.size(), s.pinned, true) // unmapped before its answer
	pool.mu.Lock()
	pool.count--
	pool.mu.Unlock()
	unix.Munmap(s.mem)
}

// keepSlot puts back a slot its worker did not drop, for the program's
// end to let go of as it does the others (closeSlots, dropSlots), or
// does what they did already if they ran meanwhile. free: an idle slot,
// whole, goes back to the free ones, as just freed (the sweep asks again
// after another bound); else a discarded one to the discarded.
func (g *program) keepSlot(s *poolSlot, free bool) {
	pool := &g.slots
	now := time.Now()
	pool.mu.Lock()
	dead, dropped := pool.dead, pool.dropped
	switch {
	case dead:
		pool.count--
	case free:
		s.freeAt = now
		pool.free = append(pool.free, s)
	default:
		pool.discarded = append(pool.discarded, s)
	}
	if !dropped {
		pool.all = append(pool.all, s)
	}
	pool.mu.Unlock()
	if dropped {
		g.p.dropSlot(s.size(), s.pinned, false)
	}
	if dead {
		unix.Munmap(s.mem)
	}
}

// lendWait bounds a new pool slot's wait for its worker's control channel
// (Lend): long enough for the other slots' calls of a burst of first
// requests, short of an instance's init or a load. A variable for tests.
var lendWait = 200 * time.Millisecond

var _ device.Lender = (*program)(nil)

// Lend lends a pool slot of maxIn input and out output bytes (a program's
// instances all have its manifest's sizes), making one if none is free and
// the pool has room: a control call the first time, the slot reused after
// until it stays free past the idle bound (slotidle.go).
// False when the worker is gone, the pool is full, or a slot would have to
// be made while the worker's control channel stays busy past lendWait:
// Lend is called before a request's body is read, and a longer wait would
// hold the request behind another's call (an instance's
// plover_instance_init as its function scales up, a sibling's load in a
// tenant's worker: up to tens of seconds), where its body read into
// ordinary memory and copied costs a copy. Other slots' calls, a
// millisecond or so each, are waited for: concurrent first requests of a
// function each get a slot, as the zero-copy path promises. The next
// request makes the slot once the channel is free.
func (g *program) Lend(maxIn, out int64) (device.Slot, bool) {
	pool := &g.slots
	pool.mu.Lock()
	if pool.dead || !g.p.alive() || g.closed.Load() || (pool.count > 0 && pool.size != [2]int64{maxIn, out}) {
		pool.mu.Unlock()
		return nil, false
	}
	if n := len(pool.free); n > 0 {
		s := pool.free[n-1]
		pool.free = pool.free[:n-1]
		pool.mu.Unlock()
		s.lent.Store(true)
		return s, true
	}
	size := device.SlotSize(maxIn, out)
	if pool.count >= maxPoolSlots || !g.d.reservePin(size) {
		pool.mu.Unlock()
		return nil, false
	}
	pool.count++ // this one's, before the call: the cap holds under concurrency
	pool.size = [2]int64{maxIn, out}
	pool.mu.Unlock()
	s, err := g.newPoolSlot(maxIn, out)
	if err != nil {
		g.d.unpinned(size)
		pool.mu.Lock()
		pool.count--
		pool.mu.Unlock()
		return nil, false
	}
	pool.mu.Lock()
	dropped := pool.dropped
	if !dropped {
		pool.all = append(pool.all, s)
	}
	pool.mu.Unlock()
	if dropped { // made before the unload, counted after it (dropSlots)
		g.p.dropSlot(size, s.pinned, false)
	}
	g.d.pools.add(g) // for the sweep, once it is free (slotidle.go)
	s.lent.Store(true)
	return s, true
}

// newPoolSlot makes a slot and has the worker map and register it.
func (g *program) newPoolSlot(maxIn, out int64) (*poolSlot, error) {
	size := device.SlotSize(maxIn, out)
	memfd, mem, err := newSlot(size)
	if err != nil {
		return nil, err
	}
	defer unix.Close(memfd)
	// The channel's wait is lendWait at most (Lend); the call, once sent,
	// has its own bound: pinning a large slot takes time of its own.
	ctx, cancel := context.WithTimeout(context.Background(), lendWait)
	defer cancel()
	g.p.mapSlot(size)
	raw, err := g.p.callTurn(ctx, 10*time.Second, g, wire.Control{Op: wire.OpSlot, Prog: g.id, Size: size}, []int{memfd}, "adding a slot")
	var rep wire.Reply
	// The worker holds none of the slot: the call was not sent (the
	// channel stayed busy: callTurn's only ErrNotStarted with a bound), or
	// was answered with a refusal.
	unheld := errors.Is(err, device.ErrNotStarted)
	if err == nil {
		if rep, err = g.reply(wire.OpSlot, raw, "adding a slot"); err == nil && rep.St != wire.StOK {
			err = fmt.Errorf("worker %d refused a slot: %q", g.p.pid, raw)
			unheld = true
		}
	}
	if err != nil {
		g.p.dropSlot(size, 0, unheld)
		unix.Munmap(mem)
		return nil, err
	}
	// Kept as long as the program (dropSlots), or the worker.
	pinned := g.p.pinSlot(g, rep.Pin, size, "a pool slot", true)
	return &poolSlot{g: g, id: rep.ID, mem: mem, maxIn: maxIn, out: out, pinned: pinned}, nil
}

// closeSlots unmaps the free and discarded slots of a program whose
// worker is gone or that is closed; lent ones are unmapped as they come
// back.
func (g *program) closeSlots() {
	pool := &g.slots
	pool.mu.Lock()
	pool.dead = true
	free := append(pool.free, pool.discarded...)
	pool.free, pool.discarded = nil, nil
	pool.count -= len(free)
	pool.mu.Unlock()
	for _, s := range free {
		unix.Munmap(s.mem)
	}
}

// dropSlots undoes the accounting of g's pool slots in its worker (bytes
// mapped and pinned there), once the worker unloaded g: it unmaps and
// unpins them as g's last instance goes (wire.OpUnload).
func (g *program) dropSlots() {
	pool := &g.slots
	pool.mu.Lock()
	all := pool.all
	pool.all, pool.dropped = nil, true
	pool.mu.Unlock()
	for _, s := range all {
		g.p.dropSlot(s.size(), s.pinned, false) // unmapped as g's last instance goes
	}
}
