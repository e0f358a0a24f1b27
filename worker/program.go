package worker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/worker/wire"
)

// program is a bundle loaded in a worker process, seen from the server:
// device.Program over the worker's control channel.
type program struct {
	d      *Device
	p      *proc
	id     uint32 // the worker's for it (wire.OpLoad): 1 in a function's worker
	name   string // the function's, for the log
	dir    string // its bundle's (ProgramSpec.Dir)
	consts int64
	closed atomic.Bool
	// ending counts its closed instances whose end its worker has yet to
	// be seen taking (awaitEnd): in a tenant's worker the last of them
	// may close the program, after its unload is answered.
	ending inFlight

	// In a tenant's worker (tenant.go): its output, its part of the
	// process's memory limit (0: none) and CPU weight, its staged
	// library's device and inode, the prefix of its files' names in the
	// stage and the files staged, its runs
	// in flight and when its last run, its last call and the last close of
	// an instance of it ended (Unix ns: its output's attribution), whether
	// the process's death was its fault, and whether it counts in the
	// process's CPU weight, since when (tenantweight.go). gone is its
	// Exited, closed once (leave).
	out        device.Output
	memLimit   int64
	weight     float64
	prefix     string
	staged     []string
	runs       atomic.Int32
	runEnded   atomic.Int64
	callEnded  atomic.Int64
	instClosed atomic.Int64
	blamed     atomic.Bool
	// loadAsked: its load was handed to the worker's control channel, so
	// the worker may have mapped its library (staysMapped); a load that
	// failed before (staging it, placing it) mapped nothing.
	loadAsked atomic.Bool
	busy      atomic.Bool
	busyAt    atomic.Int64
	gone      chan struct{}
	// bill is where its part of its worker's CPU with no run in flight
	// goes (Bill; under its proc's cpu.mu).
	bill      func(time.Duration)
	leaveOnce sync.Once

	mu      sync.Mutex
	entries map[string]int32

	slots slotPool // lent before bodies are read (slots.go)
}

// PID is the worker process's.
func (g *program) PID() int { return g.p.pid }

// SameProcess reports whether o is a program of g's worker process. By
// the process, not its pid: a dead worker's pid may be a new worker's by
// now, whose program would pass as the dead one's process (engine's
// foreign, judging a slot the dead one mapped).
func (g *program) SameProcess(o device.Program) bool {
	h, ok := o.(*program)
	return ok && h.p == g.p
}

// Alive is false once the worker process is gone.
func (g *program) Alive() bool { return g.p.alive() }

// Exited is closed once the program is gone: its worker process reaped,
// whenever that happens, or, in a tenant's worker, the program unloaded
// from a process its siblings keep (Death is then nil). The engine watches
// it, so that a worker's death is noticed when it happens rather than by
// the next request, and its watcher of an unloaded program ends with the
// program, not with the tenant's worker.
func (g *program) Exited() <-chan struct{} {
	if g.p.tenant != nil {
		return g.gone
	}
	return g.p.done // a function's worker ends with its program
}

// Death is how the worker process ended, once Exited is closed: nil when
// the server ended it by design (the program closed, the server stopping).
// A worker the server killed for its own reasons (a chain past its
// deadline, its memory limit, a message out of turn) did die: ByServer.
func (g *program) Death() device.Loss {
	if d := g.death(); d != nil {
		return d
	}
	return nil // not a typed nil
}

func (g *program) death() *ProcessExit {
	if g.closed.Load() || g.d.stopping() {
		return nil
	}
	e := g.p.exit(g.p.during)
	g.share(e)
	return e
}

func (g *program) ConstantsBytes() int64 { return g.consts }

func (g *program) Entry(kernel string) (int32, error) {
	return g.EntryContext(context.Background(), kernel)
}

// maxEntries bounds the entry points a program keeps resolved.
const maxEntries = 256

// entryBound bounds an entry lookup once the control channel is its turn:
// a dlsym, unless the bundle's IFUNC resolver hangs.
const entryBound = 10 * time.Second

// EntryContext is Entry for a request (a chain override's kernel): its
// wait for the worker's control channel ends with ctx, the request's
// deadline, and lasts at most loadBound where ctx has none. In a tenant's
// worker a sibling's load may hold the channel up to loadBound: a fixed
// wait shorter than that failed a request whose deadline was far off, as
// if its time had run out.
func (g *program) EntryContext(ctx context.Context, kernel string) (int32, error) {
	g.mu.Lock()
	i, ok := g.entries[kernel]
	g.mu.Unlock()
	if ok {
		return i, nil
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, g.d.loadBound)
		defer cancel()
	}
	t0 := time.Now()
	raw, err := g.p.callTurn(ctx, entryBound, g, wire.Control{Op: wire.OpEntry, Prog: g.id, Kernel: kernel}, nil, "resolving an entry point")
	if errors.Is(err, device.ErrNotStarted) {
		return 0, fmt.Errorf("%w, after %v behind the worker's other calls", err, time.Since(t0).Round(time.Millisecond))
	}
	if err != nil {
		return 0, err
	}
	rep, err := g.reply(wire.OpEntry, raw, "resolving an entry point")
	switch {
	case err != nil:
		return 0, err
	case rep.St == wire.StFault: // the context was faulted (a sibling's kernel): the worker goes
		return 0, g.faulted(rep.Text, "resolving an entry point")
	case rep.St != wire.StOK:
		return 0, wire.ErrorOf(rep.St, rep.Text)
	}
	i = rep.Index
	g.mu.Lock()
	// Bounded: the names are clients' (chain overrides), and a worker
	// running bundle code may vouch for any; past the bound each is
	// looked up again.
	if len(g.entries) < maxEntries {
		g.entries[kernel] = i
	}
	g.mu.Unlock()
	return i, nil
}

func (g *program) NewInstance(cfg device.InstanceConfig) (device.Instance, error) {
	if cfg.MaxInput < 0 || cfg.Tmp < 0 || cfg.Out < 0 {
		return nil, fmt.Errorf("instance sizes %d/%d/%d", cfg.MaxInput, cfg.Tmp, cfg.Out)
	}
	memfd, slot, err := newSlot(device.SlotSize(cfg.MaxInput, cfg.Out)) // out_bytes >= 1 (abi.Manifest.Validate)
	if err != nil {
		return nil, err
	}
	defer unix.Close(memfd)
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		unix.Munmap(slot)
		return nil, fmt.Errorf("instance channel: %w", err)
	}
	msg := wire.Control{Op: wire.OpNewInstance, Prog: g.id, MaxIn: cfg.MaxInput, Tmp: cfg.Tmp, Out: cfg.Out}
	// The bundle's plover_instance_init runs in there: bounded by the
	// request's deadline plus a grace (a creation merely slowed by load
	// must not cost the worker, which serves other instances), then the
	// worker is stopped and the request times out.
	dl := time.Now().Add(30 * time.Second)
	if !cfg.Deadline.IsZero() {
		dl = cfg.Deadline.Add(instanceGrace)
	}
	ctx, cancel := context.WithDeadline(context.Background(), dl)
	defer cancel()
	g.p.mapSlot(int64(len(slot)))
	shared := g.p.holdsBeside(g) // before the call: a kill may have the engine drop the others
	raw, err := g.p.call(ctx, g, msg, []int{memfd, fds[1]}, "creating an instance")
	if !cfg.Deadline.IsZero() && errors.Is(err, device.ErrDeadline) && !errors.Is(err, device.ErrNotStarted) && g.p.killedBy.Load() == g {
		// Killed for it at its request's deadline. Marked once the call that made
		// the kill returns: a load of the function racing this (the worker
		// reaped and the function loaded again meanwhile) may still go
		// into the tenant's worker, and the mark holds from its next.
		g.d.overran(g, "an instance of it was being created", shared || g.p.holdsBeside(g))
	}
	if err != nil && ctx.Err() != nil && !errors.Is(err, device.ErrDeadline) {
		err = fmt.Errorf("%w: %v", device.ErrDeadline, err)
	}
	unix.Close(fds[1])
	var rep wire.Reply
	if err == nil {
		rep, err = g.reply(wire.OpNewInstance, raw, "creating an instance")
	}
	replied := err == nil // a refusal unmapped the slot before it was sent
	switch {
	case err != nil:
	case rep.St == wire.StFault: // plover_instance_init faulted the device: the worker goes
		err = g.faulted(rep.Text, "creating an instance")
	case rep.St != wire.StOK:
		err = wire.ErrorOf(rep.St, rep.Text)
	}
	if err != nil {
		g.p.dropSlot(int64(len(slot)), 0, replied)
		unix.Close(fds[0])
		unix.Munmap(slot)
		return nil, err
	}
	bytes := cfg.MaxInput + cfg.Tmp + cfg.Out
	g.d.used.Add(bytes)
	pinned := g.p.pinSlot(g, rep.Pin, int64(len(slot)), "an instance's own", false)
	return &instance{g: g, fd: fds[0], slot: slot, pinned: pinned, maxIn: cfg.MaxInput, tmp: cfg.Tmp, out: cfg.Out,
		msg: make([]byte, wire.RunMsgMax), rep: make([]byte, wire.ReplyMax)}, nil
}

// newSlot is an instance's shared memory: a memfd of size bytes, sealed at
// that size, and the server's mapping of it. Sealed, because a worker that
// truncated it would make the server's next copy into the mapping fault
// (SIGBUS) and take the server down.
func newSlot(size int64) (int, []byte, error) {
	memfd, err := unix.MemfdCreate("plover-slot", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, nil, fmt.Errorf("instance slot: %w", err)
	}
	if err := unix.Ftruncate(memfd, size); err != nil {
		unix.Close(memfd)
		return -1, nil, fmt.Errorf("instance slot of %d bytes: %w", size, err)
	}
	if _, err := unix.FcntlInt(uintptr(memfd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		unix.Close(memfd)
		return -1, nil, fmt.Errorf("instance slot: seal: %w", err)
	}
	slot, err := unix.Mmap(memfd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(memfd)
		return -1, nil, fmt.Errorf("instance slot of %d bytes: %w", size, err)
	}
	return memfd, slot, nil
}

// Close stops the worker: whatever the bundle started goes with it. In a
// tenant's worker it unloads the program alone (closeShared).
func (g *program) Close() error {
	if !g.closed.CompareAndSwap(false, true) {
		return nil
	}
	if g.p.tenant != nil {
		g.p.cpu.unbill(g.p, g)
		g.closeShared()
		return nil
	}
	// What it printed before the kill and the server has yet to read (a
	// request's last lines, still in the pipe) is still the function's:
	// out stays, and the pipes end with the process and what it started
	// (wait). A deleted function's sink drops them (funclog's life), so
	// its ring is not made anew by its dying worker's last lines.
	g.p.give(g.consts) // back as the process exits
	g.p.kill("its program was unloaded")
	g.closeSlots()
	g.d.used.Add(-g.consts)
	return nil
}

// unloadWait bounds an unload's wait for its tenant's worker's control
// channel (behind a sibling's load, up to loadBound), unloadBound the
// call once the channel is its. Variables for tests.
var unloadWait, unloadBound = maxControlWait, 10 * time.Second

// closeShared unloads g from its tenant's worker: its slots and its
// ledger are freed here, the worker closes it and lets go of its pool
// slots once its instances are gone (the caller closed them first), and
// the process ends only when its last program is gone, by a kill as a
// function's worker's: whatever the bundles started goes with it. g is
// out of the worker's programs (its weight, its blame) from the start;
// what its plover_unload hook prints is still its own (dropProgram).
//
// The worker's unload call is waited for up to unloadWaited, then left to
// the background, as a function's worker's kill is reaped: Close is called
// where nobody may wait long on this tenant's worker (an eviction making
// room for another tenant's cold start, the reaper's round for every
// function, shutdown), and the call waits for its turn behind a sibling's
// load and for the program's hook (up to unloadWait and unloadBound). A
// quick one (no load ahead of it, a short hook) ends before Close returns,
// so that on a GPU the memory it frees is free for the load an eviction
// made room for.
func (g *program) closeShared() {
	g.closeSlots()
	g.p.give(g.consts) // back once its unload is answered and its instances ended, or at the exit
	g.d.used.Add(-g.consts)
	g.p.dropProgram(g, true)
	if g.d.releaseTenant(g.p) {
		g.p.kill("its last program was unloaded")
		g.p.unloaded(g)
		return
	}
	g.d.unloads.add()
	unloaded := make(chan struct{})
	go func() {
		defer g.d.unloads.done()
		defer close(unloaded)
		g.unloadShared()
	}()
	select {
	case <-unloaded:
	case <-time.After(unloadWaited):
	}
}

// unloadWaited is how long Close waits for its program's unload by a
// tenant's worker. A variable for tests.
var unloadWaited = time.Second

// unloadShared is closeShared's call to the worker.
func (g *program) unloadShared() {
	defer g.unstage()
	defer g.p.unloaded(g)
	if !g.p.alive() {
		return
	}
	// Its own time starts at its turn: behind a sibling's load (up to
	// loadBound) an unload left with little would time out and kill
	// every sibling, or not go out at all and leave g loaded for good.
	ctx, cancel := context.WithTimeout(context.Background(), unloadWait)
	defer cancel()
	raw, err := g.p.callTurn(ctx, unloadBound, g, wire.Control{Op: wire.OpUnload, Prog: g.id}, nil, "unloading a program")
	var rep wire.Reply
	if err == nil {
		rep, err = g.reply(wire.OpUnload, raw, "unloading a program")
	}
	if err == nil && rep.St != wire.StOK {
		err = wire.ErrorOf(rep.St, rep.Text)
	}
	if err == nil {
		// The worker closes the program, and frees its constants, at
		// the unload or with its last instance's end (each bounded),
		// whichever comes last.
		g.ending.wait(time.After(endBound))
		g.p.back(g.consts)
		g.dropSlots()
		return
	}
	select {
	case <-g.d.stop: // the server stopping killed the worker: nothing to say
		return
	default:
	}
	if g.p.killed.Load() != nil && g.p.killedBy.Load() != g {
		return // stopped meanwhile for another reason (its last program unloaded, a limit): g went with it
	}
	if g.p.killed.Load() == nil {
		// Alive and not unloaded: whatever it holds of g's stays held
		// as the driver counts it; waiting for it would not bring it.
		g.p.back(g.consts)
	}
	g.d.opts.Log.Warn("a tenant's worker did not unload a program", "function", g.name, "pid", g.p.pid, "error", err)
}

// unstage removes g's files from its tenant worker's stage.
func (g *program) unstage() {
	for _, f := range g.staged {
		os.Remove(f)
	}
}
