package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/loader"
	"github.com/plover-run/plover/sched"
)

// version is one deployed bundle of a function on this node: its program
// on each device it runs on, and its warm pool. Its state comes in three
// parts by who writes it and under what: the load (written once), the
// pool (under mu) and the crash record (read lock-free on the hot path).
type version struct {
	fn  *function
	rec api.Version
	lg  *slog.Logger

	// side: a version pipeline steps pinned that is not the function's
	// current one (Engine.PinVersion); cleared if it becomes current.
	side atomic.Bool

	loadState
	poolState
	crashState
}

// loadState is the version's bundle as load prepared it: written once,
// under loadMu, before loaded is set, and read-only after; but for the
// atomics (refused, set by a device's refusal; waiting, by queued
// requests) and prepMs and fetched, which the first program load takes
// (under placeTok).
type loadState struct {
	loadMu   sync.Mutex
	placeTok chan struct{} // one program load per device at a time; waits honour the request's deadline
	loaded   atomic.Bool
	loadErr  error                         // a permanent refusal (invalid bundle), not an outage
	refused  atomic.Pointer[errdefs.Error] // a device refused the library: as permanent

	dir       string
	manifest  *abi.Manifest
	steps     []device.Step // the manifest chain: entries 0..k-1 of every program
	policy    policy
	constSize int64
	slots     chan struct{} // one token per running request (batch: per run): caps instances
	batch     *batcher      // non-nil for a batching function (manifest "batch")
	// freed is told when a slot frees (the batcher, whose queued requests
	// wait for a free slot rather than on the channel); nil: no one.
	freed   slotWaiter
	waiting atomic.Int32 // requests queued for a slot
	unpin   func()       // ends the version's use of its cached bundle
	prepMs  float64      // fetch + verify + unpack, until the first program load logs it (placeTok)
	fetched bool
}

// poolState is the version's instances and references, under mu.
type poolState struct {
	mu         sync.Mutex
	idle       []*instance
	live       int // instances that exist (idle or busy)
	refs       int // requests between resolve and the end of Invoke
	retired    bool
	dead       bool
	placements []*placement
	lastUsed   time.Time // last request end (or load)
}

// crashState is the version's recent worker crashes and the back-off they
// set. crashes is guarded by the version's mu; the atomics let the hot
// path check for back-off without it.
type crashState struct {
	// backoffUntil (Unix ns, 0: none) fails requests fast after repeated
	// worker crashes.
	backoffUntil atomic.Int64
	crashCount   atomic.Int32 // len(crashes)
	crashes      []time.Time  // oldest first; reset by a success
}

// placement is v's program on one device.
type placement struct {
	dev  device.Device
	name string // dev's name, read once: requests carry it (Request.Device)
	prog device.Program
	flow *sched.Flow // the function's queue in dev's scheduler; nil: unscheduled
	// dead: the program's process is gone; its instances are discarded as
	// they come back and the next instance loads a new program.
	dead atomic.Bool
	// cold is how the program came to be, until the request whose cold
	// start it was logs it (with that request's whole load time).
	cold atomic.Pointer[coldLoad]
}

// coldLoad is a program load's breakdown, in milliseconds.
type coldLoad struct {
	fetched            bool
	fetchMs, programMs float64
}

type instance struct {
	inst     device.Instance
	dev      *placement
	bytes    int64
	made     time.Duration // how long NewInstance took (buffers, plover_instance_init)
	lastUsed time.Time
	run      device.Run // reused for every request on this instance
}

func (v *version) placement(dev device.Device) *placement {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, p := range v.placements {
		if p.dev == dev {
			return p
		}
	}
	return nil
}

func (v *version) ref() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.dead {
		return false
	}
	v.refs++
	return true
}

func (v *version) unref() {
	v.mu.Lock()
	v.refs--
	done := v.retired && v.refs == 0 && !v.dead
	if done {
		v.dead = true
	}
	v.mu.Unlock()
	if done {
		v.teardown()
	}
}

func (v *version) busy() *errdefs.Error {
	if v.batch != nil {
		return errorf(errdefs.KindBusy, nil, "function %s is busy: its batch queue holds max_queue %d plus a batch", v.fn.name, v.policy.queue)
	}
	return errorf(errdefs.KindBusy, nil, "function %s is busy: %d instances running and %d requests waiting (max_queue)", v.fn.name, cap(v.slots), v.policy.queue)
}

// acquire waits for a slot, in FIFO order, until the deadline. The fast
// path takes no timer and allocates nothing; a full queue fails at once.
func (v *version) acquire(ctx context.Context, deadline time.Time, gone func() bool) error {
	select {
	case v.slots <- struct{}{}:
		return nil
	default:
	}
	if n := v.waiting.Add(1); int(n) > v.policy.queue {
		v.waiting.Add(-1)
		return v.busy()
	}
	defer v.waiting.Add(-1)
	wait := time.Until(deadline)
	if wait <= 0 {
		return errorf(errdefs.KindTimeout, nil, "function %s: the request's deadline passed before it ran", v.fn.name)
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
		case v.slots <- struct{}{}:
			return nil
		case <-ctx.Done():
			return errorf(errdefs.KindUnavailable, ctx.Err(), "function %s: the request was cancelled while waiting for one of %d instances", v.fn.name, cap(v.slots))
		case <-t.C:
			return errorf(errdefs.KindTimeout, nil, "function %s: the request's deadline passed while it waited for one of %d instances", v.fn.name, cap(v.slots))
		case <-poll:
			if gone() {
				return errorf(errdefs.KindGone, nil, "function %s: the client went away while the request waited", v.fn.name)
			}
		}
	}
}

// goneInterval is how often a queued request checks for its client.
const goneInterval = 20 * time.Millisecond

// release gives back a slot. A batching function's queued requests wait
// for a free slot rather than on the channel, so they are told.
func (v *version) release() {
	<-v.slots
	if v.freed != nil {
		v.freed.dispatch()
	}
}

// slotWaiter has requests waiting for a free slot of their own accord.
type slotWaiter interface{ dispatch() }

// put returns an instance to the idle pool, or closes it when it is broken or
// its version retired; now is when it was last used (the caller's reading,
// so the hot path reads the clock once at the end of a request).
func (v *version) put(in *instance, broken bool, now time.Time) {
	v.mu.Lock()
	v.lastUsed = now
	if !broken && !v.retired && !in.dev.dead.Load() {
		in.lastUsed = now
		v.idle = append(v.idle, in)
		v.mu.Unlock()
		return
	}
	v.live--
	v.mu.Unlock()
	in.inst.Close()
}

// retire stops v from taking new requests; it is torn down when the last
// in-flight request ends.
func (v *version) retire() {
	v.mu.Lock()
	v.retired = true
	idle := v.idle
	v.idle = nil
	v.live -= len(idle)
	done := v.refs == 0 && !v.dead
	if done {
		v.dead = true
	}
	v.mu.Unlock()
	for _, in := range idle {
		in.inst.Close()
	}
	if done {
		v.teardown()
	}
}

// teardown closes every program: constants freed, library unloaded or
// worker stopped. Every instance is closed
// by now: refs is 0, so none is busy, and retire closed the idle ones.
func (v *version) teardown() {
	v.loadMu.Lock()
	defer v.loadMu.Unlock()
	v.mu.Lock()
	ps := v.placements
	v.placements = nil
	v.mu.Unlock()
	for _, p := range ps {
		if err := p.prog.Close(); err != nil {
			v.lg.Info("unload failed", "function", v.fn.name, "version", v.rec.ID, "device", p.dev.Name(), "error", err)
		}
	}
	if v.unpin != nil {
		v.unpin()
	}
	if v.loaded.Load() {
		v.lg.Info("unloaded", "function", v.fn.name, "version", v.rec.ID)
	}
}

// override checks a per-request chain and sizes against v's manifest. The
// chain's kernels are resolved later, by the program that runs it.
func (v *version) override(o *call.Override) (int64, int64, error) {
	m := v.manifest
	if o.Chain != nil {
		if err := abi.ValidateChain("chain", o.Chain); err != nil {
			return 0, 0, errorf(errdefs.KindInvalid, err, "%s", err.Error())
		}
	}
	out, tmp := m.OutBytes, m.TmpBytes
	if o.OutBytes >= 0 {
		if o.OutBytes > m.OutBytes {
			return 0, 0, errorf(errdefs.KindInvalid, nil, "out_bytes: %d is over the manifest's %d", o.OutBytes, m.OutBytes)
		}
		out = o.OutBytes
	}
	if o.TmpBytes >= 0 {
		if o.TmpBytes > m.TmpBytes {
			return 0, 0, errorf(errdefs.KindInvalid, nil, "tmp_bytes: %d is over the manifest's %d", o.TmpBytes, m.TmpBytes)
		}
		tmp = o.TmpBytes
	}
	return out, tmp, nil
}

// resolveChain is an override chain's steps on p's program.
func (v *version) resolveChain(p *placement, chain []abi.Launch) ([]device.Step, error) {
	steps := make([]device.Step, len(chain))
	for i, l := range chain {
		e, err := p.prog.Entry(l.Kernel)
		if err != nil {
			if _, lost := device.AsLoss(err); lost || errors.Is(err, device.ErrDeadline) {
				return nil, err // the worker's trouble, not the chain's
			}
			return nil, errorf(errdefs.KindInvalid, err, "chain[%d].kernel: function %s %s", i, v.fn.name, reason(err))
		}
		steps[i] = device.Step{Entry: e, Grid: int32(l.Grid), Block: int32(l.Block)}
	}
	return steps, nil
}

// manifestSteps is m's chain as entries of a program that resolved
// abi.Kernels(m.Chain) in order (see device.Program.Entry).
func manifestSteps(m *abi.Manifest) []device.Step {
	index := map[string]int32{}
	for i, k := range abi.Kernels(m.Chain) {
		index[k] = int32(i)
	}
	steps := make([]device.Step, len(m.Chain))
	for i, l := range m.Chain {
		steps[i] = device.Step{Entry: index[l.Kernel], Grid: int32(l.Grid), Block: int32(l.Block)}
	}
	return steps
}

// Crash back-off: this many worker crashes within crashWindow, with no
// success in between, fail the version's requests fast for backoffFor.
const (
	crashLimit  = 5
	crashWindow = time.Minute
	backoffFor  = time.Minute
)

// crashed records a worker crash and reports whether v is now backing off.
func (v *version) crashed(now time.Time) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.crashes = append(v.crashes, now)
	for len(v.crashes) > 0 && now.Sub(v.crashes[0]) > crashWindow {
		v.crashes = v.crashes[1:]
	}
	v.crashCount.Store(int32(len(v.crashes)))
	if len(v.crashes) < crashLimit {
		return false
	}
	v.crashes = nil
	v.crashCount.Store(0)
	v.backoffUntil.Store(now.Add(backoffFor).UnixNano())
	return true
}

// succeeded ends a run of crashes.
func (v *version) succeeded() {
	v.mu.Lock()
	v.crashes = v.crashes[:0]
	v.crashCount.Store(0)
	v.mu.Unlock()
}

// abandon forgets p after its process died: its idle instances are closed,
// busy ones are closed as they come back (put sees p.dead), and the next
// instance loads a fresh program. It reports whether this call did it, so
// that one death is counted once however many requests saw it.
func (v *version) abandon(p *placement) bool {
	if !p.dead.CompareAndSwap(false, true) {
		return false
	}
	v.mu.Lock()
	for i, q := range v.placements {
		if q == p {
			v.placements = append(v.placements[:i:i], v.placements[i+1:]...)
			break
		}
	}
	var closing []*instance
	kept := v.idle[:0]
	for _, in := range v.idle {
		if in.dev == p {
			closing = append(closing, in)
		} else {
			kept = append(kept, in)
		}
	}
	v.idle = kept
	v.live -= len(closing)
	v.mu.Unlock()
	for _, in := range closing {
		in.inst.Close()
	}
	if err := p.prog.Close(); err != nil {
		v.lg.Info("closing a dead program", "function", v.fn.name, "version", v.rec.ID, "device", p.dev.Name(), "error", err)
	}
	return true
}

func reason(err error) string {
	if le, ok := err.(*loader.Error); ok {
		return le.Reason
	}
	return fmt.Sprint(err)
}
