package engine

import (
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/evict"
	"github.com/plover-run/plover/funclog"
	"github.com/plover-run/plover/ioshare"
	"github.com/plover-run/plover/netguard"
	"github.com/plover-run/plover/objectstore"
	"github.com/plover-run/plover/registry"
	"github.com/plover-run/plover/sched"
)

// Config configures an Engine.
type Config struct {
	Store objectstore.Store
	Cache *bundle.Cache
	// Devices run the functions: a version's instances go to the device of
	// its manifest's target with the most free memory, so a node with a GPU
	// and the host device runs host and cuda bundles side by side.
	Devices []device.Device
	// Pool policy defaults for manifests that set none.
	MinInstances int
	MaxInstances int           // default 8: twice the runs a device takes at once, so a function with a large share keeps runs queued in the scheduler while its others finish
	MaxQueue     int           // requests waiting per function; default 64
	IdleTTL      time.Duration // default 5m; negative: never release
	// WorkerInstances bounds a version's instances where each holds a
	// thread of a worker process whose tasks are bounded (plover serve
	// --worker-max-pids, less the worker's own threads): past that bound
	// the Go runtime, refused a thread, aborts the worker with every
	// function in it. A manifest's min_instances over it is refused at
	// deploy (422); its max_instances, and MaxInstances, are served as it.
	// WorkerInstancesWhy names where it comes from, for those answers.
	// 0: no bound but the manifest's (abi.MaxInstances).
	WorkerInstances    int
	WorkerInstancesWhy string
	// Timeout is a request's deadline (queue time plus execution) unless
	// the request brings an earlier one; default 30s.
	Timeout time.Duration
	// MaxTimeout is the longest deadline a request may ask for (a longer
	// one is cut to it), so that a client cannot hold a device slot with
	// a hung chain past what the operator allows; 0: 10 minutes, and never
	// less than Timeout.
	MaxTimeout time.Duration
	// MaxBundleBytes bounds an uploaded bundle.
	MaxBundleBytes int64
	// SpoolDir holds uploaded bundles while they are checked (default: the
	// system's temporary directory).
	SpoolDir string
	// SpoolBytes bounds the bytes of uploads in SpoolDir at once (plover
	// serve --max-spool; spool.go); 0: no bound.
	SpoolBytes int64
	// WriteFault, when set, may fail writes to the spool as a full disk
	// would: a test seam (the cache has its own, bundle.Cache.WriteFault).
	WriteFault bundle.WriteFault
	// Evictor picks what goes when a device is short of memory (package
	// evict); nil: evict.LRU.
	Evictor evict.Evictor
	// Sched configures the scheduler each device's runs go through.
	Sched SchedConfig
	// NamedTenants: an auth file names the tenants (the deploying
	// tokens), so a version recorded without one is not lumped with
	// others into one tenant (tenantOf). Unset, every function is one
	// tenant's.
	NamedTenants bool
	Log          *slog.Logger
}

// Engine is the thing that owns functions, their versions and instances, and
// runs requests. Its users declare what they need of it where they use it
// (pipeline.Engine for the request path, httpapi.Admin for its Control);
// it lives in the server, and the functions' code it runs lives in worker
// processes (a worker device) or, without isolation, in the server too.
type Engine struct {
	cfg     Config
	targets []string // the devices' targets, each once, in the devices' order

	tab       *table                             // the functions and their versions
	mem       ledger                             // device memory: reservations and evictions
	scheds    map[device.Device]*sched.Scheduler // nil map: runs go unscheduled
	evictions evictionCounts
	logs      *funclog.Store  // what functions print (outputKeeper devices)
	keepsLogs bool            // some device keeps its functions' output
	names     nameList        // the store's function names (Names)
	io        *ioshare.Shares // the server's I/O on functions' bytes (io.go)
	// refreshPanics is the names whose record's refresh panicked, their
	// stack logged (refreshOne).
	refreshPanics sync.Map
	slowReads     slowReads     // the records whose read the last poll's deadline cut (refresh)
	pollDeadline  time.Duration // a test's bound on Watch's polls; 0: pollLimit
	aside         asideWarms    // the functions a poll is pre-warming (warmAside)
	fresh         newNames      // the names new here whose record a poll read (refreshNew)
	unpacks       *unpackSlots  // the turns to unpack a deploy's bundle (unpackTurn)
	spools        *spools       // the room for deploys' uploads (spool.go)
	stop          refusal       // the requests refused at the end of a drain (refuse.go)

	// diskLog throttles the lines of this node's disk failures, by
	// function (logDisk).
	diskLog netguard.LogThrottle
}

// outputKeeper is a device whose functions' output can be kept (a worker
// device: its workers' stdout and stderr, to ProgramSpec.Output). A device
// that runs bundles in the server's own process has none to give.
type outputKeeper interface{ KeepsOutput() bool }

// evictionCounts are the instances and functions evicted for memory.
type evictionCounts struct{ instances, functions atomic.Int64 }

// SchedConfig configures the device schedulers (package sched): every run
// on a device, a request's chain or a batch, is admitted by its device's
// scheduler, which shares device time among functions by their manifests'
// share and priority.
type SchedConfig struct {
	// Off runs chains on the devices as they come, unscheduled (whoever
	// sends the most work gets the device): for comparison.
	Off bool
	// MaxRuns bounds the runs on a device at once; 0: its kind's default
	// (device.DefaultRuns: twice the host's CPUs, 4 on a GPU).
	MaxRuns int
	// NoReserve uses every slot for whichever function waits, instead of
	// keeping some for functions that come and go (sched.Config.Reserve;
	// how many is the device kind's: device.ReservedRuns).
	NoReserve bool
	// FloodRuns bounds the floods' runs on a device together while a
	// light function is about (sched.Config.FloodRuns); 0: all but the
	// reserve.
	FloodRuns int
	// SharedRuns bounds the floods' runs on each device together while two
	// or more functions want it (sched.Config.SharedRuns); 0: the device
	// kind's (device.DefaultSharedRuns: the host's CPUs and one, every run
	// on a GPU).
	SharedRuns int
	// ReserveHold is how long after a light function's last run (or, in
	// the server's I/O, its last request) its slots stay kept, on every device and in the server's I/O
	// (sched.Config.Recent); 0: sched.DefaultRecent.
	ReserveHold time.Duration
	// Policy names the registered policy that orders queued runs
	// (sched.RegisterPolicy; "": sched.DefaultPolicy, wfq).
	Policy string
	// IO configures the server's I/O shares (package ioshare): its
	// pieces are ordered by the same shares and policy as runs, and
	// move as they come when Off is set here.
	IO ioshare.Config
}

// reserve is the slots kept for light functions (sched.Config.Reserve).
func (c SchedConfig) reserve(d device.Device, maxRuns int) int {
	if c.NoReserve {
		return 0
	}
	return device.ReservedRuns(d.Target(), maxRuns)
}

// sharedRuns is the floods' runs on a device while functions contend.
func (c SchedConfig) sharedRuns(d device.Device) int {
	if c.SharedRuns > 0 {
		return c.SharedRuns
	}
	return device.DefaultSharedRuns(d.Target())
}

// maxRuns is the runs a device takes at once.
func (c SchedConfig) maxRuns(d device.Device) int {
	if c.MaxRuns > 0 {
		return c.MaxRuns
	}
	return device.DefaultRuns(d.Target())
}

// New returns an Engine over the given store, cache and devices.
func New(cfg Config) (*Engine, error) {
	if cfg.Store == nil || cfg.Cache == nil || len(cfg.Devices) == 0 {
		return nil, errors.New("engine: store, cache and at least one device are required")
	}
	var targets []string
	for _, d := range cfg.Devices {
		if !slices.Contains(targets, d.Target()) {
			targets = append(targets, d.Target())
		}
	}
	if cfg.MaxInstances <= 0 {
		cfg.MaxInstances = 8
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
	if cfg.Evictor == nil {
		cfg.Evictor = evict.LRU{}
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
	e := &Engine{cfg: cfg, targets: targets, mem: newLedger(), logs: funclog.New(cfg.Log), unpacks: newUnpackSlots(), spools: newSpools(cfg.SpoolBytes, cfg.MaxBundleBytes),
		stop: refusal{shut: make(chan struct{})}}
	for _, d := range cfg.Devices {
		if k, ok := d.(outputKeeper); ok && k.KeepsOutput() {
			e.keepsLogs = true
		}
	}
	if cfg.MaxTimeout <= 0 {
		cfg.MaxTimeout = 10 * time.Minute
	}
	e.tab = newTable(registry.Registry{Store: cfg.Store, Cache: registry.NewCache(), Log: cfg.Log}, e.logs, cfg.Timeout, max(cfg.Timeout, cfg.MaxTimeout))
	e.tab.log = cfg.Log
	e.tab.forgetFlow = func(name string) {
		for _, s := range e.scheds { // set below, before any function is known
			s.Forget(name)
		}
		e.io.Forget(name)
	}
	e.tab.weighFlows = e.weighFlows
	e.mem.tab, e.mem.evictor, e.mem.log, e.mem.evictions = e.tab, cfg.Evictor, cfg.Log, &e.evictions
	if !cfg.Sched.Off {
		e.scheds = map[device.Device]*sched.Scheduler{}
		if _, err := sched.NewPolicy(cfg.Sched.Policy, 0); err != nil {
			return nil, err
		}
		for _, d := range cfg.Devices {
			n := cfg.Sched.maxRuns(d)
			e.scheds[d] = sched.New(sched.Config{MaxRuns: n, Reserve: cfg.Sched.reserve(d, n), FloodRuns: cfg.Sched.FloodRuns, SharedRuns: cfg.Sched.sharedRuns(d),
				PolicyName: cfg.Sched.Policy, Recent: cfg.Sched.ReserveHold, Capacity: device.SharedTime(d.Target())})
		}
	}
	e.io = newIO(e, cfg.Sched, e.floodingIO)
	return e, nil
}

// floodingIO reports whether name floods its devices, for its I/O
// touches (ioshare.Config.Flooding). A pipeline runs nothing of its own:
// it floods by its first step's function, which runs its requests first
// and which chargeIO charges their bytes; by its name alone, a pipeline
// flooding small requests counted light and kept a slot of the server's
// I/O from the floods of large bodies.
func (e *Engine) floodingIO(name string) bool {
	return e.Flooding(name, sched.DefaultOverlap) || e.Flooding(e.tab.firstStep(name), sched.DefaultOverlap)
}

// Forgets has fs told of every function's changes on this node from now
// on (Forgetter).
func (e *Engine) Forgets(fs ...Forgetter) {
	e.tab.mu.Lock()
	defer e.tab.mu.Unlock()
	e.tab.forgetters = append(e.tab.forgetters, fs...)
}

// Targets are the bundle targets this engine's devices run.
func (e *Engine) Targets() []string { return e.targets }

// Close retires every version; in-flight requests finish first. Later
// lookups and deploys are refused.
func (e *Engine) Close() { e.tab.close() }
