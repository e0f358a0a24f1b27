package runtime

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/cuda"
	"github.com/plover-run/plover/loader"
	"github.com/plover-run/plover/runtime/registry"
)

// version is one deployed bundle of a function on this node: the loaded
// library, its constants per device, and its warm pool.
type version struct {
	fn  *function
	rec registry.Version
	log func(msg string, args ...any)

	loadMu  sync.Mutex
	placeMu sync.Mutex // one constants upload per device
	loaded  atomic.Bool
	loadErr error // a permanent refusal (invalid bundle), not an outage

	// Set once by load, read-only after loaded is true.
	dir       string
	manifest  *abi.Manifest
	lib       *loader.Library
	steps     []cuda.Step
	policy    policy
	constSize int64
	slots     chan struct{} // one token per running request: caps instances
	waiting   atomic.Int32  // requests queued for a slot
	unpin     func()        // ends the version's use of its cached bundle

	mu         sync.Mutex
	idle       []*instance
	live       int // instances that exist (idle or busy)
	refs       int // requests between resolve and the end of Invoke
	retired    bool
	dead       bool
	placements []*placement
	lastUsed   time.Time // last request end (or load)
}

type placement struct {
	dev    cuda.Device
	consts cuda.Constants
}

type instance struct {
	inst     cuda.Instance
	dev      *placement
	bytes    int64
	lastUsed time.Time
	run      cuda.Run // reused for every request on this instance
}

func (v *version) placement(dev cuda.Device) *placement {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, p := range v.placements {
		if p.dev == dev {
			return p
		}
	}
	return nil
}

func (e *Engine) newVersion(f *function, rv registry.Version) *version {
	return &version{fn: f, rec: rv, log: e.cfg.Log.Info}
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
		return errorf(KindBusy, nil, "function %s is busy: %d instances running and %d requests waiting (max_queue)", v.fn.name, cap(v.slots), v.policy.queue)
	}
	defer v.waiting.Add(-1)
	wait := time.Until(deadline)
	if wait <= 0 {
		return errorf(KindTimeout, nil, "function %s: the request's deadline passed before it ran", v.fn.name)
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
			return errorf(KindUnavailable, ctx.Err(), "function %s: the request was cancelled while waiting for one of %d instances", v.fn.name, cap(v.slots))
		case <-t.C:
			return errorf(KindTimeout, nil, "function %s: the request's deadline passed while it waited for one of %d instances", v.fn.name, cap(v.slots))
		case <-poll:
			if gone() {
				return errorf(KindGone, nil, "function %s: the client went away while the request waited", v.fn.name)
			}
		}
	}
}

// goneInterval is how often a queued request checks for its client.
const goneInterval = 20 * time.Millisecond

func (v *version) release() { <-v.slots }

// put returns an instance to the idle pool, or closes it when it is broken or
// its version retired; now is when it was last used (the caller's reading,
// so the hot path reads the clock once at the end of a request).
func (v *version) put(in *instance, broken bool, now time.Time) {
	v.mu.Lock()
	v.lastUsed = now
	if !broken && !v.retired {
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

// teardown frees constants and unloads the library. Every instance is closed
// by now: refs is 0, so none is busy, and retire closed the idle ones.
func (v *version) teardown() {
	v.loadMu.Lock()
	defer v.loadMu.Unlock()
	v.mu.Lock()
	ps := v.placements
	v.placements = nil
	v.mu.Unlock()
	for _, p := range ps {
		if p.consts != nil {
			p.consts.Free()
		}
	}
	if v.lib != nil {
		if err := v.lib.Close(); err != nil {
			v.log("unload failed", "function", v.fn.name, "version", v.rec.ID, "error", err)
		}
	}
	if v.unpin != nil {
		v.unpin()
	}
	if v.loaded.Load() {
		v.log("unloaded", "function", v.fn.name, "version", v.rec.ID)
	}
}

// override resolves a per-request chain and sizes against v's manifest.
func (v *version) override(o *Override) ([]cuda.Step, int64, int64, error) {
	m := v.manifest
	steps := v.steps
	if o.Chain != nil {
		if err := abi.ValidateChain("chain", o.Chain); err != nil {
			return nil, 0, 0, errorf(KindInvalid, err, "%s", err.Error())
		}
		steps = make([]cuda.Step, len(o.Chain))
		for i, l := range o.Chain {
			fn, err := v.lib.Entry(l.Kernel)
			if err != nil {
				return nil, 0, 0, errorf(KindInvalid, err, "chain[%d].kernel: function %s %s", i, v.fn.name, reason(err))
			}
			steps[i] = cuda.Step{Fn: fn, Grid: int32(l.Grid), Block: int32(l.Block)}
		}
	}
	out, tmp := m.OutBytes, m.TmpBytes
	if o.OutBytes >= 0 {
		if o.OutBytes > m.OutBytes {
			return nil, 0, 0, errorf(KindInvalid, nil, "out_bytes: %d is over the manifest's %d", o.OutBytes, m.OutBytes)
		}
		out = o.OutBytes
	}
	if o.TmpBytes >= 0 {
		if o.TmpBytes > m.TmpBytes {
			return nil, 0, 0, errorf(KindInvalid, nil, "tmp_bytes: %d is over the manifest's %d", o.TmpBytes, m.TmpBytes)
		}
		tmp = o.TmpBytes
	}
	return steps, out, tmp, nil
}

func reason(err error) string {
	if le, ok := err.(*loader.Error); ok {
		return le.Reason
	}
	return fmt.Sprint(err)
}
