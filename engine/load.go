package engine

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/errdefs"
)

// loadState is the version's bundle as load prepared it, and teardown
// unloads (loadTok is taken in this file alone): written once, holding
// loadTok, before loaded is set, and read-only after; but for refused (set
// by a device's refusal) and prep, which the first program load takes.
type loadState struct {
	loadTok chan struct{} // one fetch and unpack at a time; waits honour the request's deadline
	// placeToks is the token of the version's program loads on each
	// device (placeTok): one load on a device at a time, however many
	// requests ask; waits honour the request's deadline. One token for
	// the version made two cold starts on two GPUs load one after the
	// other.
	placeMu   sync.Mutex
	placeToks map[device.Device]chan struct{}
	loaded    atomic.Bool
	loadErr   error                         // a permanent refusal (invalid bundle), not an outage
	refused   atomic.Pointer[errdefs.Error] // a device refused the library, or load refused the bundle (loadErr): as permanent

	dir       string
	manifest  *abi.Manifest
	steps     []device.Step // the manifest chain: entries 0..k-1 of every program
	policy    policy
	constSize int64
	batch     *batcher // non-nil for a batching function (manifest "batch")
	unpin     func()   // ends the version's use of its cached bundle
	// prep is the fetch, verify and unpack of the bundle, until the first
	// program load takes it for its cold start's log (place), whichever
	// device it loads on.
	prep atomic.Pointer[coldLoad]
}

// load prepares v's bundle on this node (fetched, verified, unpacked;
// its policy and run pool set) once, however many requests ask at a time.
func (e *Engine) load(ctx context.Context, v *version) error {
	// A token, not a mutex: a request that finds another's fetch under way
	// (a store that hangs, up to that request's deadline) gives up at its
	// own deadline, not at the other's, and at the end of a drain's grace
	// (RefuseQueued) is refused, where the exit cut it unanswered.
	sha := v.rec.SHA256[:min(12, len(v.rec.SHA256))]
	if err := e.takeTurn(ctx, v.loadTok, v.fn.name, "fetch of its bundle "+sha, "fetch its bundle "+sha); err != nil {
		switch {
		case errors.Is(err, errShutDown):
			return err
		case !errors.Is(err, context.DeadlineExceeded): // as pool.acquire tells them
			return errorf(errdefs.KindUnavailable, err, "function %s: the request was cancelled while another request fetched its bundle %s", v.fn.name, sha)
		}
		return errorf(errdefs.KindTimeout, err, "function %s: the request's deadline passed while another request fetched its bundle %s", v.fn.name, sha)
	}
	defer func() { <-v.loadTok }()
	if v.loaded.Load() {
		return nil
	}
	if v.loadErr != nil {
		return v.loadErr
	}
	t0 := time.Now()
	var dir string
	var m *abi.Manifest
	var fetched bool
	err := e.inDir(e.cfg.Cache.Dir(), "bundle cache", func() (err error) {
		dir, m, fetched, err = e.cfg.Cache.Get(ctx, e.cfg.Store, v.rec.SHA256)
		return err
	})
	if err != nil {
		rf, err := e.prepareFailed(ctx, v, err)
		if rf != nil {
			v.loadErr = rf
			v.refused.Store(rf) // for Pin.Unready, which takes no lock
		}
		return err
	}
	v.policy = e.policyFor(m)
	if m.Constants != "" {
		fi, err := os.Stat(filepath.Join(dir, m.Constants))
		if err != nil {
			e.cfg.Cache.Release(v.rec.SHA256)
			return errorf(errdefs.KindInternal, err, "function %s: constants", v.fn.name)
		}
		v.constSize = fi.Size()
	}
	v.dir, v.manifest, v.steps, v.unpin = dir, m, manifestSteps(m), func() { e.cfg.Cache.Release(v.rec.SHA256) }
	var freed slotWaiter
	if m.Batch != nil {
		v.batch = newBatcher(e, v)
		freed = v.batch
	}
	v.pool.open(e, v.policy.max, freed, time.Now())
	v.prep.Store(&coldLoad{fetched: fetched, fetchMs: ms(time.Since(t0))})
	v.loaded.Store(true)
	return nil
}

// teardown closes every program: constants freed, library unloaded or
// worker stopped. Every instance is closed by now: refs is 0, so none is
// busy, and retire closed the idle ones. It takes loadTok so that it never
// runs beside a load.
func (v *version) teardown() {
	v.loadTok <- struct{}{}
	defer func() { <-v.loadTok }()
	if v.unpin != nil {
		defer v.unpin() // a program's Close that panics must not keep the bundle in use in the cache for good
	}
	eachDespitePanics(v.pool.unplace(), func(p *placement) {
		if err := p.prog.Close(); err != nil {
			v.lg.Info("unload failed", "function", v.fn.name, "version", v.rec.ID, "device", p.dev.Name(), "error", err)
		}
	})
	if v.loaded.Load() {
		v.lg.Info("unloaded", "function", v.fn.name, "version", v.rec.ID)
	}
}
