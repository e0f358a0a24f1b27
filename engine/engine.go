package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/loader"
	"github.com/plover-run/plover/objectstore"
	"github.com/plover-run/plover/registry"
)

// Config configures an Engine.
type Config struct {
	Store   objectstore.Store
	Cache   *bundle.Cache
	Devices []device.Device // one target for all; instances go where most memory is free
	// Pool policy defaults for manifests that set none.
	MinInstances int
	MaxInstances int           // default 4
	MaxQueue     int           // requests waiting per function; default 64
	IdleTTL      time.Duration // default 5m; negative: never release
	// Timeout is a request's deadline (queue time plus execution) unless
	// the request brings an earlier one; default 30s.
	Timeout time.Duration
	// MaxBundleBytes bounds an uploaded bundle.
	MaxBundleBytes int64
	// SpoolDir holds uploaded bundles while they are checked (default: the
	// system's temporary directory).
	SpoolDir string
	Log      *slog.Logger
}

// Engine is the thing that owns functions, their versions and instances, and
// runs requests. The HTTP front end talks to it through an interface so it
// can later live in a worker process.
type Engine struct {
	cfg    Config
	reg    registry.Registry
	target string

	mu    sync.Mutex
	funcs map[string]*function
	// tags holds the version tag of each record Refresh last applied, so
	// that a poll reads only the records that changed.
	tags map[string]string
	// epoch counts changes of funcs (a version switch, a removal), so that
	// a store read made without the lock is applied only if nothing changed
	// meanwhile: a slow Refresh must not undo a deploy that just returned.
	epoch  uint64
	closed bool

	mem       ledger
	evictions struct{ instances, functions atomic.Int64 }
}

// New returns an Engine over the given store, cache and devices.
func New(cfg Config) (*Engine, error) {
	if cfg.Store == nil || cfg.Cache == nil || len(cfg.Devices) == 0 {
		return nil, errors.New("runtime: store, cache and at least one device are required")
	}
	target := cfg.Devices[0].Target()
	for _, d := range cfg.Devices {
		if d.Target() != target {
			return nil, fmt.Errorf("runtime: devices mix targets %q and %q", target, d.Target())
		}
	}
	if cfg.MaxInstances <= 0 {
		cfg.MaxInstances = 4
	}
	if cfg.MaxQueue <= 0 {
		cfg.MaxQueue = 64
	}
	if cfg.IdleTTL == 0 {
		cfg.IdleTTL = 5 * time.Minute
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.MaxBundleBytes <= 0 {
		cfg.MaxBundleBytes = 1 << 30
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Cache.OnRepair == nil {
		log := cfg.Log
		cfg.Cache.OnRepair = func(sha string, reason error) {
			log.Warn("cached bundle damaged on disk; fetching it from the store again", "sha256", sha[:12], "reason", reason)
		}
	}
	return &Engine{cfg: cfg, reg: registry.Registry{Store: cfg.Store}, target: target, funcs: map[string]*function{}, tags: map[string]string{}, epoch: 1, mem: newLedger()}, nil
}

// Target is the bundle target this engine's devices run.
func (e *Engine) Target() string { return e.target }

// Start says how a request found its instance.
type Start uint8

const (
	Hot  Start = iota // an idle instance was reused
	Warm              // the version was loaded; a new instance was created
	Cold              // the version was loaded (and maybe fetched) for this request
)

func (s Start) String() string { return [...]string{"hot", "warm", "cold"}[s] }

// Timing splits a request's time; Total includes everything in Invoke.
type Timing struct {
	Queue, Load, CopyIn, Kernels, CopyOut, Total time.Duration
	// BatchWait is the part of Queue a free instance held the request for
	// company (a batching function with max_delay); 0 otherwise.
	BatchWait time.Duration
}

// Override replaces parts of the manifest for one request, within its limits.
type Override struct {
	Chain    []abi.Launch // nil: the manifest's chain
	OutBytes int64        // < 0: the manifest's out_bytes
	TmpBytes int64        // < 0: the manifest's tmp_bytes
}

// Request is one invocation. Callers may reuse a Request (and its Output's
// capacity) across calls; the engine never keeps references to it.
type Request struct {
	Input    []byte
	Override *Override
	// Deadline bounds queue time plus execution; zero means the engine's
	// Timeout from now. A request that would start after it fails with
	// KindTimeout without running.
	Deadline time.Time
	// Gone, if set, reports whether the client has gone away. It is polled
	// while the request waits for an instance, so an abandoned request
	// gives up its queue slot instead of holding it until its deadline.
	Gone func() bool
	// Output is set to the bytes the chain produced (out_bytes, or fewer when
	// an ABI 2 entry lowered s->out.len), reusing its capacity.
	Output  []byte
	Timing  Timing
	Start   Start
	Version string
	// BatchSize is how many requests ran in this one's chain run (a
	// batching function); 0 for a function that does not batch.
	BatchSize int
}

// function is a name and its current version.
type function struct {
	name  string
	cur   *version // guarded by Engine.mu
	stats stats
}

type stats struct {
	requests, errors, cold, warm, hot atomic.Int64
	latencyNs                         atomic.Int64 // sum over successful requests
}

// count records how a request that ran found its instance.
func (s *stats) count(start Start) {
	switch start {
	case Cold:
		s.cold.Add(1)
	case Warm:
		s.warm.Add(1)
	default:
		s.hot.Add(1)
	}
}

// Invoke runs one request on the current version of function name.
func (e *Engine) Invoke(ctx context.Context, name string, req *Request) error {
	t0 := time.Now()
	f, v, err := e.resolve(ctx, name)
	if err != nil {
		return err
	}
	defer v.unref()
	return e.invoke(ctx, f, v, req, t0)
}

// Pin is a function's version resolved once and held for one call: a
// caller that reads the version (its tensors, its id) before running it
// runs that very version, whatever deploys happen meanwhile. A pinned
// version that a deploy replaced still serves the call, as any request in
// flight finishes on the version it started on.
type Pin struct {
	e *Engine
	f *function
	v *version
}

// Pin resolves name's current version, without loading it, and holds it
// until Release. Every successful Pin must be released.
func (e *Engine) Pin(ctx context.Context, name string) (Pin, error) {
	f, v, err := e.resolve(ctx, name)
	if err != nil {
		return Pin{}, err
	}
	return Pin{e, f, v}, nil
}

// Version is the pinned version's record.
func (p Pin) Version() api.Version { return p.v.rec }

// Invoke runs one request on the pinned version.
func (p Pin) Invoke(ctx context.Context, req *Request) error {
	return p.e.invoke(ctx, p.f, p.v, req, time.Now())
}

// Release ends the pin.
func (p Pin) Release() { p.v.unref() }

// invoke runs req on v, a version of f the caller holds a reference on;
// t0 is when the request reached the engine.
func (e *Engine) invoke(ctx context.Context, f *function, v *version, req *Request, t0 time.Time) (err error) {
	deadline := req.Deadline
	if deadline.IsZero() {
		deadline = t0.Add(e.cfg.Timeout)
	}
	f.stats.requests.Add(1)
	defer func() {
		if err != nil {
			f.stats.errors.Add(1)
		}
	}()
	if b := v.backoffUntil.Load(); b != 0 && t0.UnixNano() < b {
		return v.backoffError(b)
	}
	req.Start = Hot
	req.Version = v.rec.ID
	req.Timing = Timing{}
	req.BatchSize = 0
	if !v.loaded.Load() {
		tl := time.Now()
		// The request's deadline bounds the fetch and load too.
		lctx, cancel := context.WithDeadline(ctx, deadline)
		err := e.load(lctx, v)
		cancel()
		if err != nil {
			return err
		}
		req.Start = Cold
		req.Timing.Load = time.Since(tl)
	}
	if rf := v.refused.Load(); rf != nil {
		return rf
	}
	m := v.manifest
	if int64(len(req.Input)) > m.MaxInputBytes {
		return errorf(KindTooLarge, nil, "input is %d bytes; function %s accepts at most %d (max_input_bytes)", len(req.Input), f.name, m.MaxInputBytes)
	}
	if v.batch != nil {
		err := v.batch.invoke(ctx, req, deadline)
		req.Timing.Total = time.Since(t0)
		if req.BatchSize > 0 { // it ran, well or not: count its start as the unbatched path does
			f.stats.count(req.Start)
		}
		if err != nil {
			return err
		}
		f.stats.latencyNs.Add(int64(req.Timing.Total))
		return nil
	}
	steps, outLen, tmpLen, key := v.steps, m.OutBytes, m.TmpBytes, uint64(1)
	if !m.Graphs() {
		key = 0 // "graph": false: the entries run on every request
	}
	if req.Override != nil {
		if outLen, tmpLen, err = v.override(req.Override); err != nil {
			return err
		}
		key = 0
	}
	tq := time.Now()
	if err := v.acquire(ctx, deadline, req.Gone); err != nil {
		return err
	}
	defer v.release()
	ta := time.Now()
	req.Timing.Queue = ta.Sub(tq)
	in, fresh, err := e.take(ctx, v, deadline)
	if err != nil {
		return e.runFailed(f, v, nil, err)
	}
	tr := ta // a hot request reads the clock once between queue and run
	if fresh != Hot {
		if req.Start < fresh {
			req.Start = fresh
		}
		tr = time.Now()
		req.Timing.Load += tr.Sub(ta)
		if fresh == Cold {
			e.coldStarted(f, v, in.dev, req.Timing.Load)
		}
	}
	if !tr.Before(deadline) {
		v.put(in, false, tr)
		return errorf(KindTimeout, nil, "function %s: the request's deadline passed before it ran (queue %v, load %v)", f.name, req.Timing.Queue, req.Timing.Load)
	}
	if int64(cap(req.Output)) < outLen {
		req.Output = make([]byte, outLen)
	}
	req.Output = req.Output[:outLen]
	var r *device.Run
	for retried := false; ; retried = true {
		if req.Override != nil && req.Override.Chain != nil {
			if steps, err = v.resolveChain(in.dev, req.Override.Chain); err != nil {
				v.put(in, false, time.Now())
				return e.runFailed(f, v, in.dev, err)
			}
		}
		r = &in.run
		r.Input, r.Output, r.Chain, r.TmpLen, r.ZeroTmp, r.ZeroOut, r.ChainKey, r.Deadline = req.Input, req.Output, steps, tmpLen, m.ZeroTmp, m.ZeroesOut(), key, deadline
		err = in.inst.Run(r)
		if err == nil || retried || !beforeRun(err) {
			break
		}
		// The instance's worker had died while it was idle (a chain that
		// ran past an earlier deadline, a thread the bundle left behind):
		// this request ran nowhere, so it runs once more on a fresh worker.
		r.Input, r.Output = nil, nil
		v.put(in, true, time.Now())
		e.workerDied(v, in.dev, exitOf(err))
		now := time.Now()
		if b := v.backoffUntil.Load(); b != 0 && now.UnixNano() < b {
			return v.backoffError(b)
		}
		if !now.Before(deadline) {
			return errorf(KindTimeout, nil, "function %s: the request's deadline passed before it ran (its worker had died)", f.name)
		}
		if in, fresh, err = e.take(ctx, v, deadline); err != nil {
			return e.runFailed(f, v, nil, err)
		}
		if req.Start < fresh {
			req.Start = fresh
		}
	}
	r.Input, r.Output = nil, nil
	if err == nil {
		req.Output = req.Output[:r.OutLen]
	}
	req.Timing.CopyIn, req.Timing.Kernels, req.Timing.CopyOut = r.Timing.CopyIn, r.Timing.Kernels, r.Timing.CopyOut
	broken := err != nil && (errors.Is(err, device.ErrUnhealthy) || in.dev.dead.Load() || processGone(err))
	tEnd := time.Now() // one reading: the instance's last use and the total
	v.put(in, broken, tEnd)
	req.Timing.Total = tEnd.Sub(t0)
	f.stats.count(req.Start)
	if err != nil {
		return e.runFailed(f, v, in.dev, err)
	}
	if v.crashCount.Load() > 0 { // the common case takes no lock
		v.succeeded()
	}
	f.stats.latencyNs.Add(int64(req.Timing.Total))
	return nil
}

// beforeRun reports a run whose worker was gone before the run reached it.
// A function of its own so the errors.As target escapes only on the error
// path: the hot path allocates nothing.
func beforeRun(err error) bool {
	var pe *device.ProcessExit
	return errors.As(err, &pe) && pe.BeforeRun
}

// exitOf is err's ProcessExit (err is known to hold one).
func exitOf(err error) *device.ProcessExit {
	var pe *device.ProcessExit
	errors.As(err, &pe)
	return pe
}

// processGone reports a run that ended with its worker process.
func processGone(err error) bool {
	var pe *device.ProcessExit
	return errors.As(err, &pe)
}

// runFailed turns a failure to create an instance or to run into the
// client's error, and reacts to what it says: a dead worker's program is
// abandoned and its crash counted towards back-off. p is nil when no
// instance was taken.
func (e *Engine) runFailed(f *function, v *version, p *placement, err error) error {
	var pe *device.ProcessExit
	var ke *device.KernelError
	var ee *Error
	switch {
	case errors.As(err, &ee): // already classified, with its own message
		return err
	case errors.As(err, &ke) && errors.As(err, &pe):
		// The chain faulted its worker's device context: the request failed
		// like any kernel failure; the worker, and only it, is gone.
		e.workerDied(v, p, pe)
		return errorf(KindKernel, err, "function %s: %s (its worker was stopped)", f.name, ke.Error())
	case errors.Is(err, device.ErrDeadline):
		return errorf(KindTimeout, err, "function %s: the request's deadline passed while its chain was running", f.name)
	case errors.As(err, &pe):
		return e.workerDied(v, p, pe)
	case errors.As(err, &ke):
		if errors.Is(err, device.ErrUnhealthy) {
			e.cfg.Log.Error("device fault: device is now unhealthy", "function", f.name, "version", v.rec.ID, "error", ke.Msg)
		}
		return errorf(KindKernel, err, "function %s: %s", f.name, err.Error())
	case errors.Is(err, device.ErrUnhealthy): // the device faulted earlier: fail fast, do not hang
		return unavailable(err, "function %s: device is unhealthy", f.name)
	}
	return errorf(KindInternal, err, "function %s: run failed", f.name)
}

// workerDied abandons the program of a worker that died (p is nil when it
// died loading) and counts the death once, whatever number of requests
// saw it. It returns the error for the request that saw it.
func (e *Engine) workerDied(v *version, p *placement, pe *device.ProcessExit) error {
	if p == nil || v.abandon(p) {
		backoff := v.crashed(time.Now())
		e.cfg.Log.Error("worker died", "function", v.fn.name, "version", v.rec.ID, "pid", pe.PID, "reason", pe.Reason, "during", pe.During, "backoff", backoff)
	}
	return errorf(KindWorkerCrashed, pe, "function %s: %s", v.fn.name, pe.Error())
}

// hookFailed counts a failing plover_load or plover_instance_init towards
// back-off like a worker crash: each retry reloads the bundle (in a fresh
// worker), so one that fails every time must not be retried by every request.
func (e *Engine) hookFailed(v *version, err error) {
	backoff := v.crashed(time.Now())
	e.cfg.Log.Error("bundle hook failed", "function", v.fn.name, "version", v.rec.ID, "error", err.Error(), "backoff", backoff)
}

// backoffError is the 503 of a version backing off after crashes.
func (v *version) backoffError(until int64) error {
	at := time.Unix(0, until).UTC().Format(time.RFC3339)
	return errorf(KindUnavailable, nil, "function %s is backing off: it failed %d times within %v (worker crashes, failing plover_load or plover_instance_init); requests fail until %s or a redeploy",
		v.fn.name, crashLimit, crashWindow, at)
}

// resolve finds the current version of name, reading the store the first
// time, and takes a reference on it.
func (e *Engine) resolve(ctx context.Context, name string) (*function, *version, error) {
	for {
		e.mu.Lock()
		f := e.funcs[name]
		var v *version
		if f != nil {
			v = f.cur
		}
		e.mu.Unlock()
		if f == nil {
			if _, err := e.lookup(ctx, name); err != nil {
				return nil, nil, err
			}
			continue
		}
		if v != nil && v.ref() {
			return f, v, nil
		}
		// Retired between the lock and ref: the next round sees its successor.
	}
}

// lookup reads name's record and adds the function to this node, unless a
// deploy or delete changed the node while the store was read (then it
// reads again: what it read may be stale).
func (e *Engine) lookup(ctx context.Context, name string) (*function, error) {
	if !abi.ValidName(name) {
		return nil, errorf(KindNotFound, nil, "function %q not found (names match [a-z0-9][a-z0-9-]{0,62})", name)
	}
	for attempt := 0; ; attempt++ {
		e.mu.Lock()
		at, closed := e.epoch, e.closed
		e.mu.Unlock()
		if closed {
			return nil, errorf(KindUnavailable, nil, "the server is shutting down")
		}
		rec, err := e.reg.Get(ctx, name)
		if errors.Is(err, registry.ErrNoFunction) {
			return nil, errorf(KindNotFound, err, "function %q not found", name)
		}
		if err != nil {
			return nil, unavailable(err, "function %s: store unavailable", name)
		}
		cv, err := rec.CurrentVersion()
		if err != nil {
			return nil, errorf(KindInternal, err, "function %s: corrupt record", name)
		}
		if attempt == 3 {
			at = 0 // changes keep coming: take what was read
		}
		if f, _ := e.switchTo(name, cv, at); f != nil {
			return f, nil
		}
	}
}

// switchTo makes rv the current version of name, adding the function if
// needed, and retires the previous version once its in-flight requests
// finish. With at != 0 it does nothing unless the epoch is still at. It
// returns the function (nil if it did nothing) and whether the version
// changed.
func (e *Engine) switchTo(name string, rv api.Version, at uint64) (*function, bool) {
	e.mu.Lock()
	if e.closed || (at != 0 && e.epoch != at) {
		e.mu.Unlock()
		return nil, false
	}
	if at == 0 {
		// A change made here: the record's tag Refresh applied is stale
		// (the record may later return to those very bytes and tag).
		delete(e.tags, name)
	}
	f := e.funcs[name]
	if f != nil && f.cur != nil && f.cur.rec.ID == rv.ID {
		e.mu.Unlock()
		return f, false
	}
	if f == nil {
		name = strings.Clone(name) // callers may pass borrowed bytes (the HTTP path)
		f = &function{name: name}
		e.funcs[name] = f
	}
	old := f.cur
	f.cur = e.newVersion(f, rv)
	e.epoch++
	e.mu.Unlock()
	if old != nil {
		old.retire()
	}
	return f, true
}

func (e *Engine) load(ctx context.Context, v *version) error {
	v.loadMu.Lock()
	defer v.loadMu.Unlock()
	if v.loaded.Load() {
		return nil
	}
	if v.loadErr != nil {
		return v.loadErr
	}
	t0 := time.Now()
	dir, m, fetched, err := e.cfg.Cache.Get(ctx, e.cfg.Store, v.rec.SHA256)
	if err != nil {
		var fe *bundle.FetchError
		var be *bundle.Error
		switch {
		case errors.As(err, &fe):
			return unavailable(err, "function %s: cannot fetch bundle %s from the store", v.fn.name, v.rec.SHA256[:12])
		case errors.As(err, &be): // the bundle itself is refused: that will not change
			v.loadErr = errorf(KindInvalid, err, "function %s version %s: %s", v.fn.name, v.rec.ID, be.Error())
			return v.loadErr
		default: // local trouble (disk full, a race with eviction): try again later
			e.cfg.Log.Error("cannot prepare bundle", "function", v.fn.name, "sha256", v.rec.SHA256[:12], "error", err)
			return errorf(KindUnavailable, err, "function %s: cannot prepare its bundle on this node; see the server log", v.fn.name)
		}
	}
	v.policy = e.policyFor(m)
	if m.Constants != "" {
		fi, err := os.Stat(filepath.Join(dir, m.Constants))
		if err != nil {
			e.cfg.Cache.Release(v.rec.SHA256)
			return errorf(KindInternal, err, "function %s: constants", v.fn.name)
		}
		v.constSize = fi.Size()
	}
	v.dir, v.manifest, v.steps, v.unpin = dir, m, manifestSteps(m), func() { e.cfg.Cache.Release(v.rec.SHA256) }
	v.slots = make(chan struct{}, v.policy.max)
	if m.Batch != nil {
		v.batch = newBatcher(e, v)
	}
	v.mu.Lock()
	v.lastUsed = time.Now()
	v.mu.Unlock()
	v.loaded.Store(true)
	v.prepMs, v.fetched = ms(time.Since(t0)), fetched
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// take returns an idle instance of v (Hot), or creates one: Warm on a
// program already loaded, Cold when the program had to be loaded.
func (e *Engine) take(ctx context.Context, v *version, deadline time.Time) (*instance, Start, error) {
	v.mu.Lock()
	if n := len(v.idle); n > 0 {
		in := v.idle[n-1]
		v.idle = v.idle[:n-1]
		v.mu.Unlock()
		if err := in.dev.dev.Health(); err != nil {
			v.put(in, true, time.Now())
			return nil, Hot, unavailable(err, "device %s is unhealthy", in.dev.dev.Name())
		}
		return in, Hot, nil
	}
	v.mu.Unlock()
	lctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	return e.newInstance(lctx, v)
}

// newInstance creates an instance of v on the healthy device with the most
// free memory, loading v's program there first if needed and evicting idle
// functions when the device's memory budget requires it.
func (e *Engine) newInstance(ctx context.Context, v *version) (*instance, Start, error) {
	best, err := e.pickDevice()
	if err != nil {
		return nil, Warm, err
	}
	m := v.manifest
	need := m.MaxInputBytes + m.TmpBytes + m.OutBytes
	if v.placement(best) == nil {
		need += v.constSize
	}
	unreserve, err := e.reserve(best, need, v)
	if err != nil {
		return nil, Warm, err
	}
	defer unreserve()
	p, start, err := e.place(ctx, v, best)
	if err != nil {
		return nil, start, err
	}
	// The bundle's plover_instance_init runs here: a worker that hangs in
	// it is stopped at the request's deadline (ctx carries it).
	dl, _ := ctx.Deadline()
	inst, err := p.prog.NewInstance(device.InstanceConfig{MaxInput: m.MaxInputBytes, Tmp: m.TmpBytes, Out: m.OutBytes, Deadline: dl})
	if err != nil {
		var pe *device.ProcessExit
		if errors.As(err, &pe) {
			return nil, start, e.workerDied(v, p, pe)
		}
		if errors.Is(err, device.ErrDeadline) { // its worker was stopped
			v.abandon(p)
			return nil, start, errorf(KindTimeout, err, "function %s: the request's deadline passed while an instance was created", v.fn.name)
		}
		var ke *device.KernelError
		if errors.As(err, &ke) { // plover_instance_init failed
			e.hookFailed(v, err)
			return nil, start, errorf(KindKernel, err, "function %s: creating an instance on %s: %s", v.fn.name, p.dev.Name(), err.Error())
		}
		return nil, start, unavailable(err, "function %s: cannot create an instance on %s", v.fn.name, p.dev.Name())
	}
	v.mu.Lock()
	v.live++
	v.mu.Unlock()
	return &instance{inst: inst, dev: p, bytes: inst.DeviceBytes()}, start, nil
}

func (e *Engine) pickDevice() (device.Device, error) {
	var best device.Device
	var bestFree int64
	var lastErr error
	for _, d := range e.cfg.Devices {
		if err := d.Health(); err != nil {
			lastErr = err
			continue
		}
		if free := d.MemInfo().Free; best == nil || free > bestFree {
			best, bestFree = d, free
		}
	}
	if best == nil {
		return nil, errorf(KindUnavailable, lastErr, "no healthy device")
	}
	return best, nil
}

// place makes sure v's program is loaded on dev (library, entries,
// constants), loading it once however many requests ask at the same time.
// It says Cold when it loaded the program, Warm when it was there.
func (e *Engine) place(ctx context.Context, v *version, dev device.Device) (*placement, Start, error) {
	select {
	case v.placeTok <- struct{}{}:
	case <-ctx.Done():
		return nil, Cold, errorf(KindTimeout, ctx.Err(), "function %s: the request's deadline passed while another request loaded it on %s", v.fn.name, dev.Name())
	}
	defer func() { <-v.placeTok }()
	if p := v.placement(dev); p != nil {
		return p, Warm, nil
	}
	if rf := v.refused.Load(); rf != nil {
		return nil, Cold, rf
	}
	t0 := time.Now()
	m := v.manifest
	budget := v.constSize + int64(v.policy.max)*(m.MaxInputBytes+m.TmpBytes+m.OutBytes)
	prog, err := dev.Load(ctx, device.ProgramSpec{Dir: v.dir, Manifest: m, MemoryBudget: budget})
	if err != nil {
		var le *loader.Error
		var pe *device.ProcessExit
		var ke *device.KernelError
		switch {
		case errors.As(err, &le): // the library is refused: that will not change
			err = inBundle(err, v.manifest.Library)
			rf := errorf(KindInvalid, err, "function %s version %s: %s", v.fn.name, v.rec.ID, err.Error())
			v.refused.Store(rf)
			return nil, Cold, rf
		case errors.As(err, &pe):
			return nil, Cold, err
		case errors.As(err, &ke): // plover_load failed
			e.hookFailed(v, err)
			return nil, Cold, errorf(KindKernel, err, "function %s: loading on %s: %s", v.fn.name, dev.Name(), err.Error())
		case errors.Is(err, device.ErrDeadline) || ctx.Err() != nil:
			return nil, Cold, errorf(KindTimeout, err, "function %s: the request's deadline passed while its bundle was loading on %s", v.fn.name, dev.Name())
		}
		return nil, Cold, unavailable(err, "function %s: cannot load on %s", v.fn.name, dev.Name())
	}
	p := &placement{dev: dev, prog: prog}
	// The request this load serves logs it (coldStarted), with its own
	// load time: the number its Server-Timing shows.
	p.cold.Store(&coldLoad{fetched: v.fetched, fetchMs: v.prepMs, programMs: ms(time.Since(t0))})
	v.mu.Lock()
	v.placements = append(v.placements, p)
	v.mu.Unlock()
	v.prepMs, v.fetched = 0, false
	return p, Cold, nil
}

// coldStarted logs a cold start once, from the request it served. load_ms
// is that request's whole load time, the load span of its Server-Timing;
// fetch_ms (bundle from cache or store, verified, unpacked) and program_ms
// (library, constants and hooks on the device, in a worker or not) are its
// parts, and the rest is the instance (buffers, instance hooks) and waits.
// total_ms, fetch plus program, is kept for the benchmark suite.
func (e *Engine) coldStarted(f *function, v *version, p *placement, load time.Duration) {
	c := p.cold.Swap(nil)
	if c == nil {
		return // a program another request loaded (or a pre-warm)
	}
	round := func(x float64) float64 { return math.Round(x*1000) / 1000 }
	e.cfg.Log.Info("cold start", "function", f.name, "version", v.rec.ID, "sha256", v.rec.SHA256[:12], "device", p.dev.Name(),
		"fetched", c.fetched, "load_ms", round(ms(load)), "fetch_ms", round(c.fetchMs), "program_ms", round(c.programMs),
		"total_ms", round(c.fetchMs+c.programMs))
}

// Deploy verifies a bundle, stores it, and makes it the current version of
// name. Nothing in the bundle runs here: the library is checked statically.
// A bundle equal to the current version changes nothing (the info says
// Unchanged) unless force is set.
func (c *Control) Deploy(ctx context.Context, name string, body io.Reader, force bool) (api.FunctionInfo, error) {
	e := c.e
	if !abi.ValidName(name) {
		return api.FunctionInfo{}, errorf(KindBadRequest, nil, "function name %q must match [a-z0-9][a-z0-9-]{0,62}", name)
	}
	tmp, err := os.CreateTemp(e.cfg.SpoolDir, "plover-deploy-*")
	if err != nil {
		return api.FunctionInfo{}, errorf(KindInternal, err, "deploy: temp file")
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	h := sha256.New() // hashed on the way to disk: the bundle is read once
	sink := &writeErr{w: io.MultiWriter(tmp, h)}
	n, err := io.Copy(sink, io.LimitReader(body, e.cfg.MaxBundleBytes+1))
	if err != nil && sink.err != nil { // our disk, not the client
		return api.FunctionInfo{}, storageError(sink.err, "deploy %s: spooling the bundle", name)
	}
	if err != nil {
		return api.FunctionInfo{}, errorf(KindBadRequest, err, "deploy: reading the bundle")
	}
	if n > e.cfg.MaxBundleBytes {
		return api.FunctionInfo{}, errorf(KindTooLarge, nil, "bundle is larger than %d bytes", e.cfg.MaxBundleBytes)
	}
	sha := hex.EncodeToString(h.Sum(nil))
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return api.FunctionInfo{}, errorf(KindInternal, err, "deploy")
	}
	dir, m, err := e.cfg.Cache.Verify(tmp)
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return api.FunctionInfo{}, storageError(err, "deploy %s: unpacking the bundle", name)
	}
	if err != nil {
		return api.FunctionInfo{}, errorf(KindInvalid, err, "%s", err.Error())
	}
	defer os.RemoveAll(dir)
	if err := checkDeploy(dir, m, name, e.target); err != nil {
		return api.FunctionInfo{}, err
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return api.FunctionInfo{}, errorf(KindInternal, err, "deploy")
	}
	rv, created, err := e.reg.Publish(ctx, m, tmp, sha, n, force)
	if errors.Is(err, registry.ErrConflict) {
		return api.FunctionInfo{}, errorf(KindConflict, err, "deploy %s: %s", name, err.Error())
	}
	if err != nil {
		return api.FunctionInfo{}, storageError(err, "deploy %s: cannot write to the store", name)
	}
	e.cfg.Cache.Adopt(dir, sha)
	if !created {
		f, err := e.lookup(ctx, name)
		if err != nil {
			return api.FunctionInfo{}, err
		}
		fi := e.info(f, rv, e.versionCount(ctx, name))
		fi.Unchanged = true
		return fi, nil
	}
	f, _ := e.switchTo(name, rv, 0)
	if f == nil {
		return api.FunctionInfo{}, errorf(KindUnavailable, nil, "deployed %s version %s, but this server is shutting down", name, rv.ID)
	}
	e.warmIfWanted(ctx, f)
	e.cfg.Log.Info("deployed", "function", name, "version", rv.ID, "sha256", sha[:12], "bytes", n)
	return e.info(f, rv, e.versionCount(ctx, name)), nil
}

// checkDeploy checks an unpacked bundle against the name it is deployed
// under and the node's target, then as every bundle is checked
// (loader.CheckBundle).
func checkDeploy(dir string, m *abi.Manifest, name, target string) error {
	if m.Name != name {
		return errorf(KindInvalid, nil, "name: the manifest names %q but the bundle is deployed as %q", m.Name, name)
	}
	if m.Target != target {
		return errorf(KindInvalid, nil, "target: the bundle is built for %q, this node's device is %q", m.Target, target)
	}
	if _, err := loader.CheckBundle(dir, m, target); err != nil {
		err = inBundle(err, m.Library)
		return errorf(KindInvalid, err, "%s", err.Error())
	}
	return nil
}

// inBundle names the library in a loader refusal by its file name in the
// bundle: the client should read "kernels.so", not where this node keeps
// its cache.
func inBundle(err error, library string) error {
	var le *loader.Error
	if errors.As(err, &le) {
		le.Path = library
	}
	return err
}

// Delete removes a function; its current version retires after in-flight
// requests finish.
// writeErr remembers a write failure, to tell it from a read failure of
// the client's body in io.Copy.
type writeErr struct {
	w   io.Writer
	err error
}

func (w *writeErr) Write(p []byte) (int, error) {
	n, err := w.w.Write(p)
	if err != nil {
		w.err = err
	}
	return n, err
}

// storageError is a failed write of ours: 507 when a disk is full (this
// node's or, for a file store, the store's), else 503 with the cause.
func storageError(err error, format string, args ...any) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return errorf(KindNoSpace, err, format+": out of disk space (%v)", append(args, err)...)
	}
	return unavailable(err, format, args...)
}

func (c *Control) Delete(ctx context.Context, name string) error {
	e := c.e
	if _, err := e.reg.Delete(ctx, name); errors.Is(err, registry.ErrNoFunction) {
		return errorf(KindNotFound, err, "function %q not found", name)
	} else if err != nil {
		return unavailable(err, "delete %s: cannot update the store", name)
	}
	e.forget(name, 0)
	e.cfg.Log.Info("deleted", "function", name)
	return nil
}

// forget drops a function from this node (with at != 0, only if the epoch
// is still at); its version retires once its in-flight requests finish.
func (e *Engine) forget(name string, at uint64) {
	e.mu.Lock()
	if at != 0 && e.epoch != at {
		e.mu.Unlock()
		return
	}
	if at == 0 {
		delete(e.tags, name)
	}
	f := e.funcs[name]
	delete(e.funcs, name)
	var old *version
	if f != nil {
		old, f.cur = f.cur, nil
	}
	e.epoch++
	e.mu.Unlock()
	if old != nil {
		old.retire()
	}
}

// versionCount is how many versions name's record lists (0 if unreadable).
func (e *Engine) versionCount(ctx context.Context, name string) int {
	if rec, err := e.reg.Get(ctx, name); err == nil {
		return len(rec.Versions)
	}
	return 0
}

// Close retires every version; in-flight requests finish first. Later
// lookups and deploys are refused.
func (e *Engine) Close() {
	e.mu.Lock()
	e.closed = true
	var olds []*version
	for _, f := range e.funcs {
		if f.cur != nil {
			olds = append(olds, f.cur)
			f.cur = nil
		}
	}
	e.funcs = map[string]*function{}
	e.mu.Unlock()
	for _, v := range olds {
		v.retire()
	}
}

// sortInfos orders function infos by name.
func sortInfos(in []api.FunctionInfo) {
	sort.Slice(in, func(i, j int) bool { return in[i].Name < in[j].Name })
}
