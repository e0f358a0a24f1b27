package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/plover-run/plover/fileutil"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/loader"
	"github.com/plover-run/plover/worker/contain"
	"github.com/plover-run/plover/worker/wire"
)

// Options configure a Device.
type Options struct {
	Exe      string        // the plover binary; workers run `Exe worker ...`
	Base     device.Device // the server's own view of the device: name, memory, health
	Ordinal  int           // which GPU (CUDA)
	Driver   string        // the CUDA driver library workers open ("": libcuda.so.1)
	MemLimit int64         // the device budget in bytes, 0: none (passed to workers)
	// Standby is the idle workers kept started, device open, per device
	// at least; MaxStandby (0: Standby) the most the pool grows to when
	// cold starts come in bursts (standbyDemand).
	Standby    int
	MaxStandby int
	Drop       *contain.Identity
	Landlock   bool
	// Checked starts host workers in checked mode: an access past the end
	// of in, tmp or out fails the request naming the entry and the buffer
	// (device.Host.EnableChecks), at the cost of a copy in and out.
	Checked bool
	// StageDir holds each worker's stage, the directory its bundle's files
	// are linked into; on the file system of the bundle cache, so links
	// work (otherwise the files are copied). Required.
	StageDir string
	// TenantScope runs each tenant's programs (ProgramSpec.Tenant) in
	// that tenant's worker on the device, a load into it being no process
	// start; never two tenants' in one process (plover serve
	// --worker-scope tenant). Unset, every program has a worker of its
	// own. Ignored with MPS, which needs a process per program.
	TenantScope bool
	// MPS starts a worker per program with its limits in the environment
	// (gpu_share, the memory budget), not from the standby pool.
	MPS bool
	// MaxHostMemory is the resident memory a worker may hold (bytes; 0:
	// no limit) when its manifest sets no max_host_memory_mb; the
	// server's slots it maps are not counted (pin.go).
	MaxHostMemory int64
	// PinLimit bounds the pinned memory of the device's slots (bytes; 0:
	// none) on a device that pins them (CUDA): pool slots are made only
	// within it; past it a request's body is read into ordinary memory
	// and copied into its instance's own slot (pin.go).
	PinLimit int64
	// CopyPiece, when above 0, is passed to CUDA workers (--copy-piece):
	// each run's copies between host and device go in pieces of at most
	// this many bytes (device.CopyPiecer).
	CopyPiece int64
	Spawner   *contain.Spawner
	Log       *slog.Logger
	// Output, when set, receives all a worker writes to stdout and stderr
	// (a bundle's printf, an assertion's message), line by line, each
	// marked with its stream ("stdout | ..."); unset, a program's lines
	// go to its ProgramSpec.Output (the first 20 of a worker's to Log
	// before it has a program).
	Output io.Writer
	// CPU, when set, puts each worker that takes a function in a cgroup
	// weighted by the function's share and priority (NewCPUGroups).
	CPU *CPUGroups
	// Pids, when set, bounds the tasks of each worker and what it starts
	// (NewPidGroups).
	Pids *PidGroups
	// Mem, when set, backs each worker's memory limit with a memory
	// cgroup over what it starts too (NewMemGroups).
	Mem *MemGroups

	// sampling replaces the periods of workers' figures (a zero field:
	// its constant, statsEvery...): tests shorten them.
	sampling sampling
	// slotIdle replaces slotIdleBound (0: it): tests shorten it.
	slotIdle time.Duration
	// env is added to every worker's environment: tests set the fake
	// driver's variables (FAKECUDA_*) there.
	env []string
}

// Device runs each program in a worker process of its own, or with
// Options.TenantScope each tenant's programs in a worker of the tenant's. It implements
// device.Device; memory is accounted from the sizes it hands out, since the
// server itself allocates nothing on the device.
type Device struct {
	opts    Options
	used    atomic.Int64
	pin     pinning // the slots' pinned memory (pin.go)
	pools   poolSet // programs with pool slots, for the sweep (slotidle.go)
	standby chan *proc
	refill  chan struct{}
	started chan standbyStart // keepStandby's starts in flight report here
	starts  inFlight          // the same starts, for Close
	unloads inFlight          // tenant programs' unload calls (closeShared)
	demand  *standbyDemand
	stop    chan struct{}
	once    sync.Once

	mu      sync.Mutex
	procs   map[*proc]struct{}
	tenants map[string]*tenantSlot  // TenantScope: each tenant's worker (tenant.go)
	churn   map[string]*tenantChurn // TenantScope: tenants' recent worker deaths (churn.go)
	late    map[string]*lateLoad    // TenantScope: loads whose request gave up (late.go)
	// lateKeep and loadBound are the constants but in tests.
	lateKeep, loadBound time.Duration
	closed              bool

	outMu sync.Mutex // Options.Output's lines, one at a time

	running        atomic.Int32 // runs in flight on its workers (wire/poll.go)
	returning      atomic.Int64 // device bytes given up, not yet back (release.go)
	lastRelease    atomic.Int64 // when some were last seen back
	landlockLogged atomic.Bool
	filterLogged   atomic.Bool  // "no seccomp filters", said once
	startFailures  atomic.Int32 // workers in a row that exited before ready
	lastStartErr   atomic.Value // string: the last one's reason
	lastStartFail  atomic.Int64 // when (monoNow)

	own ownWorkers // TenantScope: which bundles run in a worker of their own (alone.go)
}

var _ device.Device = (*Device)(nil)

// NewDevice starts the standby pool and returns the device.
func NewDevice(opts Options) *Device {
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	opts.Standby = max(opts.Standby, 0)
	opts.MaxStandby = max(opts.MaxStandby, opts.Standby)
	for _, f := range []struct {
		p   *time.Duration
		def time.Duration
	}{{&opts.sampling.statsEvery, statsEvery}, {&opts.sampling.statsIdle, statsIdle}, {&opts.sampling.pssEvery, pssEvery}, {&opts.sampling.pssIdle, pssIdle}} {
		if *f.p <= 0 {
			*f.p = f.def
		}
	}
	d := &Device{opts: opts, standby: make(chan *proc, opts.MaxStandby), refill: make(chan struct{}, 1),
		started: make(chan standbyStart, standbyParallel), demand: &standbyDemand{min: opts.Standby, max: opts.MaxStandby},
		stop: make(chan struct{}), procs: map[*proc]struct{}{}, tenants: map[string]*tenantSlot{}, churn: map[string]*tenantChurn{}, late: map[string]*lateLoad{}, lateKeep: lateKeep, loadBound: loadBound}
	if opts.MaxStandby > 0 && !opts.MPS {
		go d.keepStandby()
		d.refill <- struct{}{}
	}
	go d.watch()
	return d
}

// KeepsOutput says that what a program's workers write to stdout and
// stderr goes to its ProgramSpec.Output.
func (d *Device) KeepsOutput() bool { return true }

// stopping reports whether Close was called: the workers it ends then end
// by design.
func (d *Device) stopping() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.closed
}

func (d *Device) Target() string { return d.opts.Base.Target() }
func (d *Device) Name() string   { return d.opts.Base.Name() }

// Health is the server's view of the device, and unhealthy too while the
// last startFailureLimit workers in a row could not open it: a fault that
// persists across workers is the device's, one that ends a worker is not.
func (d *Device) Health() error {
	if err := d.opts.Base.Health(); err != nil {
		return err
	}
	// It lapses a while after the last failure, so that a request (or the
	// standby pool) tries a worker again and a recovered device comes back.
	if n := d.startFailures.Load(); n >= startFailureLimit && monoSince(d.lastStartFail.Load()) < startFailureHold {
		why, _ := d.lastStartErr.Load().(string)
		return fmt.Errorf("%s: %w: the last %d workers could not open it: %s", d.Name(), device.ErrUnhealthy, n, why)
	}
	return nil
}

// startFailureLimit is how many workers in a row must fail to open the
// device before it is reported unhealthy, for startFailureHold after the
// last one.
const (
	startFailureLimit = 3
	startFailureHold  = 10 * time.Second
)

// MemInfo is the device's memory less what this server's workers were
// given (the server allocates nothing on the device itself). What its
// workers are still letting go of counts free: the driver counts it used
// until they have, and a load waits for it (WaitFree).
func (d *Device) MemInfo() device.MemInfo {
	b := d.opts.Base.MemInfo()
	used := d.used.Load()
	free := min(b.Free+d.returning.Load(), b.Total-used)
	if free < 0 {
		free = 0
	}
	return device.MemInfo{Total: b.Total, Free: free, Used: used}
}

// Close stops every worker, and returns once they are gone (their stages
// and CPU groups removed with them) or after 3 s.
func (d *Device) Close() error {
	d.once.Do(func() { close(d.stop) })
	// Programs closed as the server stops (the engine closes them first)
	// are unloaded by their workers while that takes little (a second at
	// most): their hooks run, as they would have before the stop. Then
	// every worker goes.
	d.unloads.wait(time.After(time.Second))
	d.mu.Lock()
	d.closed = true // spawn kills what it starts from now on
	procs := d.procsLocked()
	d.mu.Unlock()
	for _, p := range procs {
		p.kill("the server is stopping")
	}
	deadline := time.After(2 * time.Second)
	// The pool's starts in flight end at once now (their workers were
	// killed above, or kill themselves on seeing closed): wait for them,
	// then for every worker they left too.
	if !d.starts.wait(deadline) {
		return nil
	}
	d.mu.Lock()
	procs = d.procsLocked()
	d.mu.Unlock()
	for _, p := range procs {
		p.kill("the server is stopping")
		select {
		case <-p.done:
		case <-deadline:
			return nil
		}
	}
	return nil
}

// inFlight counts work under way in the background (the pool's starts,
// unloads) that Close waits for a while. Unlike a WaitGroup's, its count
// may rise from 0 while one waits (a program closed as the server stops).
type inFlight struct {
	mu   sync.Mutex
	n    int
	none chan struct{} // closed as n falls to 0
}

func (f *inFlight) add() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == 0 {
		f.none = make(chan struct{})
	}
	f.n++
}

func (f *inFlight) done() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n--; f.n == 0 {
		close(f.none)
	}
}

// wait waits until none is in flight or deadline, and says whether none
// is.
func (f *inFlight) wait(deadline <-chan time.Time) bool {
	f.mu.Lock()
	none, n := f.none, f.n
	f.mu.Unlock()
	if n == 0 {
		return true
	}
	select {
	case <-none:
		return true
	case <-deadline:
		return false
	}
}

func (d *Device) procsLocked() []*proc {
	procs := make([]*proc, 0, len(d.procs))
	for p := range d.procs {
		procs = append(procs, p)
	}
	return procs
}

// deviceSelection is the server's device selection, which a worker's
// ordinal refers to: not secrets, and without them a worker would number
// the GPUs differently from the server.
func deviceSelection() []string {
	var env []string
	for _, k := range []string{"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// take returns a started worker: a standby one when there is one, else a
// new one. The pool starts a replacement at once, in the background (in
// the smallest CPU weight: Device.spawn).
//
// Waiting for a worker the pool is starting instead, when there is one,
// was measured: the median cold start of 200 functions in turn doubled
// (3 -> 6 ms on 2 CPUs, the waiting load behind a start at the smallest
// weight) for a p99 of 17 instead of 24 ms.
func (d *Device) take(ctx context.Context, m *abi.Manifest) (*proc, error) {
	d.demand.took(time.Now())
	defer d.refillPool() // after the take: the pool must see itself short
	for {
		select {
		case p := <-d.standby:
			if p.usable() {
				return p, nil
			}
			p.kill("its stage was removed") // if alive
			continue
		default:
		}
		return d.spawn(ctx, Weight(m))
	}
}

func (d *Device) refillPool() {
	select {
	case d.refill <- struct{}{}:
	default:
	}
}

// Load hands the bundle to a worker, which loads it.
func (d *Device) Load(ctx context.Context, spec device.ProgramSpec) (device.Program, error) {
	select {
	case <-d.stop:
		return nil, fmt.Errorf("%s: %w: closed", d.Name(), device.ErrUnhealthy)
	default:
	}
	mj, err := json.Marshal(workerManifest(spec.Manifest))
	if err != nil {
		return nil, err
	}
	// The ledger counts what the server knows, not what a worker says.
	var consts int64
	if c := spec.Manifest.Constants; c != "" {
		fi, err := os.Stat(filepath.Join(spec.Dir, c))
		if err != nil {
			return nil, fmt.Errorf("constants: %w", err)
		}
		consts = fi.Size()
	}
	// A version deployed where nothing enforced the limit (a node
	// running bundles in the server) would have its worker killed at its
	// first memory sample, at every load.
	if err := d.FitsHostMemory(spec.Manifest, consts); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%w before the bundle was loaded", device.ErrDeadline)
	}
	if d.tenantScope() {
		return d.loadShared(ctx, spec, mj, consts)
	}
	var p *proc
	if d.opts.MPS {
		p, err = d.spawn(ctx, Weight(spec.Manifest), mpsEnv(spec.Manifest.GPUShare, spec.MemoryBudget, d.opts.Ordinal)...)
	} else {
		p, err = d.take(ctx, spec.Manifest)
	}
	if err != nil {
		return nil, err
	}
	// Its output is the function's from here: the bundle's constructors
	// and plover_load print under its name.
	if spec.Output != nil {
		p.out.Store(&output{spec.Output})
	}
	p.limitMemory(d.hostLimit(spec), spec.Manifest.Name)
	p.weigh(spec.Manifest)
	if err := p.inStage(func() error { _, err := stage(spec, p.stage, ""); return err }); err != nil {
		p.kill("its bundle could not be staged") // gone already, if the loss is its death

		return nil, err
	}
	g := &program{d: d, p: p, id: 1, name: spec.Manifest.Name, dir: spec.Dir, consts: consts, entries: map[string]int32{}}
	rep, err := g.load(ctx, 0, mj)
	if err != nil {
		p.kill("its load failed")
		return nil, err
	}
	if rep.St == wire.StFault {
		// plover_load faulted the device: the worker goes by itself, and
		// the load failed as the function's own (back-off counts it).
		return nil, g.faulted(rep.Text, "loading the bundle")
	}
	if rep.St != wire.StOK {
		p.kill("its bundle was refused")
		return nil, wire.ErrorOf(rep.St, rep.Text)
	}
	d.used.Add(consts)
	p.reported.Store(true)
	return g, nil
}

// workerManifest is m as its worker's device reads it (library, constants,
// chain, buffers, batch's sizes): the fields only the server reads, those
// of unbounded length among them (build flags, tensors, durations: a
// stored manifest's may be of any length), left out.
// The load goes as one SOCK_SEQPACKET message, which cannot be larger
// than the socket's send buffer (net.core.wmem_default, 208 KiB), and a
// manifest may be 1 MiB: past the buffer every load failed, the worker
// said to have closed its channel.
func workerManifest(m *abi.Manifest) *abi.Manifest {
	w := *m
	w.Build, w.Tensors, w.Steps, w.IdleTTL = nil, nil, nil, ""
	if m.Batch != nil {
		b := *m.Batch // m's own is the server's batcher's
		b.MaxDelay = ""
		w.Batch = &b
	}
	return &w
}

// FitsHostMemory is loader.FitsHostMemory (device.HostMemoryBound): a
// worker past its max_host_memory_mb is killed.
func (d *Device) FitsHostMemory(m *abi.Manifest, constSize int64) error {
	return loader.FitsHostMemory(m, constSize, d.opts.Checked)
}

// hostLimit is the resident memory a program's worker may hold (0: none).
func (d *Device) hostLimit(spec device.ProgramSpec) int64 {
	if mb := spec.Manifest.MaxHostMemoryMB; mb > 0 {
		return mb << 20
	}
	return d.opts.MaxHostMemory
}

// load has g's worker load its bundle, staged under g.prefix in its stage.
func (g *program) load(ctx context.Context, bound time.Duration, mj []byte) (wire.Reply, error) {
	raw, err := g.p.callTurn(ctx, bound, g, wire.Control{Op: wire.OpLoad, Prog: g.id, Prefix: g.prefix, Manifest: mj}, nil, "loading the bundle")
	var rep wire.Reply
	if err == nil {
		rep, err = g.reply(wire.OpLoad, raw, "loading the bundle")
	}
	return rep, err
}

// loadShared loads spec's program into its tenant's worker (tenant.go),
// taking one for the tenant if it has none, or into a worker of its own
// (alone.go). A program that fails to load leaves the others there alone;
// a process whose load failed by its death takes them along (their losses
// collateral). A library that dlopen refused beside other programs
// (refusedBeside) is loaded again, once, in a worker of its own: its
// refusal stands only if it fails there too.
func (d *Device) loadShared(ctx context.Context, spec device.ProgramSpec, mj []byte, consts int64) (device.Program, error) {
	g, err := d.loadTenant(ctx, spec, mj, consts, false)
	var rb *refusedBeside
	if !errors.As(err, &rb) {
		return g, err
	}
	g, err = d.loadTenant(ctx, spec, mj, consts, true)
	if _, refused := loader.OpenFailed(err); refused {
		d.opts.Log.Warn("the function's library was refused in a worker of its own too: the refusal stands", "function", spec.Manifest.Name,
			"tenant", spec.Tenant, "bundle", filepath.Base(spec.Dir), "error", err.Error())
	}
	return g, err
}

// loadTenant is loadShared's one try: in a worker of its own if the bundle
// needs one or if alone, else in its tenant's.
func (d *Device) loadTenant(ctx context.Context, spec device.ProgramSpec, mj []byte, consts int64, alone bool) (device.Program, error) {
	asked := spec
	spec, _ = d.ownKey(asked, alone)
	if g, ok, err := d.takeLate(ctx, spec); ok {
		if err != nil {
			return nil, err
		}
		return g, nil
	}
	// Again: a late load this one waited for may have hung meanwhile,
	// and the bundle be one to load alone now.
	spec, alone = d.ownKey(asked, alone)
	place := spec
	if alone {
		place = d.own.placeKey(spec)
	}
	p, err := d.placeTenant(ctx, place)
	if err != nil {
		return nil, err
	}
	g := &program{d: d, p: p, name: spec.Manifest.Name, dir: spec.Dir, consts: consts, entries: map[string]int32{},
		out: spec.Output, memLimit: d.hostLimit(spec), weight: Weight(spec.Manifest)}
	p.addProgram(g)
	fail := func(err error) (device.Program, error) {
		p.removeProgram(g)
		if d.releaseTenant(p) {
			p.kill("its only program's load failed")
		}
		g.unstage()
		return nil, err
	}
	if err := p.inStage(func() error { return p.stageTenant(spec, g) }); err != nil {
		return fail(g.shares(err))
	}
	// The load runs under a bound of its own, not the request's deadline:
	// past that, the call would kill the worker, and with it every
	// sibling, for a request that merely had a short deadline. The
	// request gives up at its deadline; the load goes on, then the
	// program is unloaded, as no one holds it. Only loadBound's expiry
	// (a load that hangs) kills the worker, for g.
	type loaded struct {
		rep wire.Reply
		err error
	}
	res := make(chan loaded, 1)
	go func() {
		// The wait for the channel (a sibling's load before it) is not
		// the load's: loadBound starts at its turn.
		wctx, cancel := context.WithTimeout(context.Background(), maxControlWait)
		defer cancel()
		g.loadAsked.Store(true)
		rep, err := g.load(wctx, d.loadBound, mj)
		if err == nil && rep.St == wire.StMapped {
			rep, err = g.loadCopy(wctx, spec, mj)
		}
		if err != nil && p.killedBy.Load() == g {
			d.hungAtLoad(spec) // killed for it: its load hung
		}
		g.touch() // busy from the load's end: it may have outlasted a window
		switch {
		case err != nil:
		case rep.St == wire.StFault:
			// Its plover_load faulted the device (the worker claimed it
			// for g, if its hook met the fault): the worker goes, blamed
			// on g while g is still among its programs, which fail
			// removes it from.
			err = g.faulted(rep.Text, "loading the bundle")
		case rep.St != wire.StOK:
			err = d.besideRefusal(spec, g, alone, wire.ErrorOf(rep.St, rep.Text))
		}
		res <- loaded{rep, err}
	}()
	select {
	case r := <-res:
		if r.err != nil {
			return fail(r.err)
		}
	case <-ctx.Done():
		l := &lateLoad{key: lateKey(spec), out: spec.Output, done: make(chan struct{})}
		d.putLate(l)
		go func() {
			if r := <-res; r.err != nil {
				// No request waits for it: the next one is told, if the
				// function is at fault (lateEnded), else loads again.
				d.opts.Log.Warn("a load abandoned at its request's deadline failed", "function", g.name, "error", r.err.Error())
				fail(r.err)
				d.lateEnded(l, nil, r.err)
				return
			}
			d.used.Add(consts)
			p.reported.Store(true)
			d.lateEnded(l, g, nil)
		}()
		return nil, fmt.Errorf("%w while the bundle was loading (the next request takes the load over)", device.ErrDeadline)
	}
	d.used.Add(consts)
	p.reported.Store(true)
	return g, nil
}

// loadCopy loads g again with its library staged as a copy, the worker
// having answered that the linked file is mapped there already
// (wire.StMapped). Rare: a reload after an unload that left the library
// mapped, or a second load of one file.
func (g *program) loadCopy(ctx context.Context, spec device.ProgramSpec, mj []byte) (wire.Reply, error) {
	if err := g.p.inStage(func() error { return g.p.stageCopy(spec, g) }); err != nil {
		return wire.Reply{}, g.shares(err)
	}
	return g.load(ctx, g.d.loadBound, mj)
}

// loadBound bounds a load into a tenant's worker (loadShared), which a
// request's deadline does not: past it, the load is taken to hang and the
// worker is killed for its program.
const loadBound = 30 * time.Second

// stage links the bundle's library and constants into a worker's stage
// dir (copies them if the stage is on another file system), their names
// led by prefix, and returns the paths it made or tried to make (for the
// caller to remove).
func stage(spec device.ProgramSpec, dir, prefix string) ([]string, error) {
	var made []string
	for _, name := range []string{spec.Manifest.Library, spec.Manifest.Constants} {
		if name == "" {
			continue
		}
		to := filepath.Join(dir, prefix+name)
		made = append(made, to) // cleared by its owner even if this fails midway
		if err := fileutil.LinkOrCopy(filepath.Join(spec.Dir, name), to); err != nil {
			return made, fmt.Errorf("stage %s: %w", name, err)
		}
	}
	return made, nil
}
