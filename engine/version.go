package engine

import (
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

// version is one deployed bundle of a function on this node: its load
// (written once) and its run pool (pool.go: its program on each device it
// runs on, its instances, the requests on it and its crashes).
type version struct {
	fn  *function
	rec api.Version
	lg  *slog.Logger

	// side: a version pipeline steps pinned that is not the function's
	// current one (Engine.PinVersion); cleared if it becomes current.
	side atomic.Bool

	loadState
	pool pool
}

// loadState is the version's bundle as load prepared it: written once,
// under loadMu, before loaded is set, and read-only after; but for
// refused (set by a device's refusal) and prepMs and fetched, which the
// first program load takes (under placeTok).
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
	batch     *batcher // non-nil for a batching function (manifest "batch")
	unpin     func()   // ends the version's use of its cached bundle
	prepMs    float64  // fetch + verify + unpack, until the first program load logs it (placeTok)
	fetched   bool
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

// teardown closes every program: constants freed, library unloaded or
// worker stopped. Every instance is closed
// by now: refs is 0, so none is busy, and retire closed the idle ones.
func (v *version) teardown() {
	v.loadMu.Lock()
	defer v.loadMu.Unlock()
	for _, p := range v.pool.unplace() {
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

func reason(err error) string {
	if le, ok := err.(*loader.Error); ok {
		return le.Reason
	}
	return fmt.Sprint(err)
}
