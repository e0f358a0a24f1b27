package cli

// The worker side of plover serve: isolation, containment, the workers'
// binary and their standby pool.

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"syscall"

	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/ioshare"
	"github.com/plover-run/plover/sched"
	"github.com/plover-run/plover/worker"
	"github.com/plover-run/plover/worker/contain"
)

// isolate wraps each device so that functions run in worker processes
// (--isolation process), and makes the server unreadable to them. mps is
// mpsWanted's answer, taken before the devices opened.
func isolate(f *serveFlags, devs []device.Device, mps bool, log *slog.Logger) ([]device.Device, *worker.CPUGroups, *worker.PidGroups, *worker.MemGroups, error) {
	type checker interface{ EnableChecks(reportFD int) error }
	if f.checked {
		for _, d := range devs {
			if _, ok := d.(checker); !ok {
				log.Warn("--checked applies to the host device only: functions on this device run unchecked", "device", d.Name())
			}
		}
	}
	if f.lightBoost < 1 || math.IsNaN(f.lightBoost) || math.IsInf(f.lightBoost, 0) {
		return nil, nil, nil, nil, fmt.Errorf("--light-boost %g: want 1 (off) or more", f.lightBoost)
	}
	switch f.isolation {
	case "none":
		log.Warn("--isolation none: every function runs inside the server process; use it for one trusted tenant only")
		if f.memoryGroups == "on" {
			log.Warn("--memory-groups on: memory groups are worker processes', and --isolation none has none; ignored")
		}
		if f.checked { // overruns past the padding fault the server itself, unreported
			for _, d := range devs {
				if c, ok := d.(checker); ok {
					c.EnableChecks(-1) // no fault handler: the server's own
				}
			}
		}
		return devs, nil, nil, nil, nil
	case "process":
	default:
		return nil, nil, nil, nil, fmt.Errorf("--isolation %q: want process or none", f.isolation)
	}
	if f.standbyMax < 0 {
		return nil, nil, nil, nil, fmt.Errorf("--standby-max %d: want 0 or more", f.standbyMax)
	}
	if f.standby < -1 {
		return nil, nil, nil, nil, fmt.Errorf("--standby-workers %d: want 0 or more (-1: the device's default)", f.standby)
	}
	// Workers run with another uid when we are root; when we are not, they
	// share ours, and only a non-dumpable server keeps them out of its
	// /proc files (environment, memory).
	if err := contain.MakeNonDumpable(); err != nil {
		return nil, nil, nil, nil, fmt.Errorf("--isolation process: %w", err)
	}
	drop, err := workerIdentity(f.workerUser)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	stages, err := stageDir(f.data)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	mps, err = mpsFor(f, devs, mps, drop, log)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	spawner := contain.NewSpawner()
	containTrees(spawner, f, mps, log)
	cpu, pids, mem := workerGroups(f, devs, drop, log)
	exe := workerExe(log)
	out := make([]device.Device, len(devs))
	for i, d := range devs {
		ordinal := 0
		if o, ok := d.(interface{ Ordinal() int }); ok {
			ordinal = o.Ordinal()
		}
		standby, standbyMax := standbySizes(d.Target(), f.standby, f.standbyMax)
		var dmem *worker.MemGroups
		if memGroupsFor(f.memoryGroups, d.Target()) {
			dmem = mem
		}
		out[i] = worker.NewDevice(worker.Options{Exe: exe, Base: d, Ordinal: ordinal, MemLimit: f.memLimitMB << 20,
			Standby: standby, MaxStandby: standbyMax, Drop: drop, Landlock: true, StageDir: stages, MPS: mps && device.TakesMPS(d.Target()), MaxHostMemory: f.workerMaxMemMB << 20, Spawner: spawner, Log: log, CPU: cpu, Pids: pids, Mem: dmem,
			Checked: f.checked, PinLimit: f.maxPinnedMB << 20, TenantScope: f.workerScope == "tenant", CopyPiece: int64(f.copyPieceKiB) << 10})
	}
	user := "the server's"
	if drop != nil {
		user = f.workerUser + " (" + drop.String() + ")"
	}
	log.Info("functions run in worker processes", "worker_user", user, "worker_binary", exe, "worker_scope", f.workerScope)
	return out, cpu, pids, mem, nil
}

// workerIdentity is the user workers run as: name's (--worker-user) when
// the server runs as root, nil (the server's own) otherwise.
func workerIdentity(name string) (*contain.Identity, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	id, err := contain.LookupUser(name)
	if err != nil {
		return nil, fmt.Errorf("--worker-user: %w", err)
	}
	return &id, nil
}

// mpsWanted reports whether functions run in worker processes that are MPS
// clients: --isolation process, and --mps or a control daemon running.
// Asked once, before the devices open: the server then opens its GPUs
// bare, holding no context, since under MPS a server with one is a client
// that the MPS server waits for after any client's fault (device.OpenBare).
func mpsWanted(f *serveFlags) bool {
	return f.isolation == "process" && (f.mps || contain.MPSRunning())
}

// mpsFor reports whether the CUDA devices' workers are MPS clients
// (wanted: mpsWanted's answer), refusing what MPS cannot serve.
func mpsFor(f *serveFlags, devs []device.Device, wanted bool, drop *contain.Identity, log *slog.Logger) (bool, error) {
	if len(devs) == 0 || !device.TakesMPS(devs[0].Target()) {
		if f.mps {
			log.Warn("--mps applies to CUDA devices only; ignored")
		}
		return false, nil
	}
	if !wanted {
		return false, nil
	}
	if drop != nil {
		// MPS serves one uid at a time: a client of another uid waits
		// until the running server's clients (this process's own
		// context, as root) are gone, that is for ever.
		return false, fmt.Errorf("--isolation process with MPS: the server runs as root and its workers as %s, and an MPS server serves one uid at a time; run plover serve as that user, or without MPS (stop its control daemon)", f.workerUser)
	}
	if f.workerScope == "tenant" {
		return false, errors.New("--worker-scope tenant: MPS gives each function's worker limits of its own (gpu_share, memory budget), so it needs a process per function; use --worker-scope function, or run without MPS (no --mps, its control daemon stopped)")
	}
	log.Info("MPS: each function's worker starts with its gpu_share and memory budget; standby workers are not used")
	return true, nil
}

// workerGroups readies the workers' CPU weights (--cpu-weights), task
// bounds (--worker-max-pids) and memory groups (--memory-groups), each nil
// where it is off.
func workerGroups(f *serveFlags, devs []device.Device, drop *contain.Identity, log *slog.Logger) (*worker.CPUGroups, *worker.PidGroups, *worker.MemGroups) {
	var cpu *worker.CPUGroups
	if f.cpuWeights {
		// Whose nice levels the server would set: its workers' effective
		// uid, the server's own but for --worker-user.
		euid := os.Geteuid()
		if drop != nil {
			euid = drop.UID
		}
		cpu = worker.NewCPUGroupsFor(f.cgroupRoot, euid, log)
		cpus := f.cpus
		if cpus <= 0 { // serve did not read them (serverProcs): nothing doubled
			cpus = float64(runtime.GOMAXPROCS(0))
		}
		switch off, err := cpu.LightSlice(f.lightSlice, f.lightBoost); {
		case err != nil:
			log.Warn("light workers get no short EEVDF slice (--light-slice)", "error", err)
		case off == "":
			log.Info("boosted workers and the server's threads run with a short EEVDF slice (--light-slice)", "slice", f.lightSlice)
		case f.lightSlice > 0 && cpu.Mechanism() == "nice":
			log.Info("light workers get no short EEVDF slice (--light-slice)", "why", off)
		}
		cpu.StartBoost(f.lightBoost, cpus)
	}
	uid := os.Getuid()
	if drop != nil {
		uid = drop.UID
	}
	pids := worker.NewPidGroups(f.cgroupRoot, f.workerMaxPids, uid, cpu, log)
	grouped := 0
	for _, d := range devs {
		if memGroupsFor(f.memoryGroups, d.Target()) {
			grouped++
		}
	}
	if grouped < len(devs) && f.memoryGroups == "auto" {
		log.Info("CUDA workers get no memory cgroup (--memory-groups auto): what the driver charges to a worker's group beyond its resident memory is not yet measured; their limits check their own resident memory only (--memory-groups on: theirs too)")
	}
	if grouped == 0 {
		return cpu, pids, nil
	}
	return cpu, pids, worker.NewMemGroups(f.cgroupRoot, cpu, log)
}

// defaultWorkerMaxPids is --worker-max-pids's default: room for a bundle's
// thread per CPU on large machines, far below a node's pid_max (32768 at
// least), and on a machine of so many CPUs that a worker's own threads
// (one per CPU and more, worker.OwnThreads) would take most of 512, those
// and 256 instances: a default the server refused to start with (a
// review's arithmetic: from 496 CPUs) helps nobody.
var defaultWorkerMaxPids = max(512, worker.OwnThreads()+256)

// minWorkerMaxPids is the least --worker-max-pids may be: a worker's own
// threads (5 on the host device, a CUDA context's more) with room to spare.
const minWorkerMaxPids = 32

// checkMemoryGroups checks --memory-groups before anything starts.
func checkMemoryGroups(mode string) error {
	switch mode {
	case "auto", "on", "off":
		return nil
	}
	return fmt.Errorf("--memory-groups %q: want auto, on or off", mode)
}

// memGroupsFor reports whether a worker of a device of target gets a
// memory group under --memory-groups mode. auto: the host device's only.
// A CUDA worker's driver memory (its context, pinned buffers, the page
// tables of its pinned slots) may be charged to its group beyond what its
// resident memory shows, by how much is not yet measured on a GPU, and a
// false kill of a GPU function is worse than the gap its check leaves
// (README); on is there for that comparison.
func memGroupsFor(mode, target string) bool {
	return mode == "on" || mode == "auto" && target == "host"
}

// checkWorkerScope checks --worker-scope before anything starts: tenant
// workers are worker processes, which --isolation none has none of. (MPS,
// which needs a process per function, is refused by isolate, where it is
// known to be on.)
func checkWorkerScope(f *serveFlags) error {
	switch f.workerScope {
	case "function":
		return nil
	case "tenant":
	default:
		return fmt.Errorf("--worker-scope %q: want function or tenant", f.workerScope)
	}
	if f.isolation == "none" {
		return errors.New("--worker-scope tenant: --isolation none runs every function inside the server, with no worker processes to share; use --isolation process")
	}
	return nil
}

// stageDir makes the directory of the workers' stages (where their
// bundles are linked), beside the bundle cache in data so that links
// work; leftovers of an earlier run go first.
func stageDir(data string) (string, error) {
	stages := filepath.Join(data, "workers")
	if err := os.RemoveAll(stages); err != nil {
		return "", fmt.Errorf("--isolation process: %w", err)
	}
	if err := os.Mkdir(stages, 0o700); err != nil { // not MkdirAll: never through a planted symlink
		return "", fmt.Errorf("--isolation process: %w", err)
	}
	return stages, nil
}

// serverRecord is where a server records itself for the next one of its
// data directory (contain.EndLeftovers).
func serverRecord(data string) string { return filepath.Join(data, "server.pid") }

// containTrees chooses how everything a worker starts is made to end with
// it (contain.Spawner.Contain), says so in the log, and records the server
// for the next one of its data directory.
func containTrees(spawner *contain.Spawner, f *serveFlags, mps bool, log *slog.Logger) {
	namespaces := f.pidNamespaces && !mps
	c, why := spawner.Contain(namespaces)
	const fallback = "workers and the server are child subreapers, and the server ends what a worker leaves; should the server be killed, the next one of this data directory ends what its workers started, unless that ran another program"
	switch {
	case c == contain.PIDNamespace:
		log.Info("worker process trees: a PID namespace per worker; whatever a function starts ends with its worker")
	case c == contain.ProcessGroup:
		log.Warn("worker process trees: process groups only; a process that leaves its worker's group (setsid) outlives the worker", "why", why)
	case mps && f.pidNamespaces:
		log.Info("worker process trees: no PID namespaces under MPS (its server knows clients by pid; untried inside namespaces): "+fallback, "mechanism", c.String(), "error", why)
	default:
		log.Info("worker process trees: no PID namespaces: "+fallback, "mechanism", c.String(), "why", why)
	}
	if err := spawner.Record(serverRecord(f.data)); err != nil {
		log.Warn("cannot record this server for the next one of its data directory: processes a killed server leaves will not be found", "error", err)
	}
}

// ioShares configures the server's I/O shares from --io-shares and the CPU
// weights in force. A piece moves at its function's CPU weight where the
// server's threads can be weighed as the workers are: by nice level where
// the workers' weights are nice levels, by a CPU group per level where
// they are cgroup v1 groups (worker.ThreadGroups). auto turns it on
// wherever they can: beside a 4 MB flood a light function's p99 was
// 0.16-0.18x of unscheduled under cgroup v1 on one machine and 0.68-0.99x
// on another, and 0.13-0.15x with nice levels, its p50 the same or lower,
// for the flood's rate beside it (0.5-0.7x: it gets the CPUs but one while
// a light function is about; BENCHMARKS.md, "the targets of issue 45"). Not under
// cgroup v2, where a piece could only keep the server's weight and
// scheduled pieces made that p99 worse, not better; nor where the server
// may not take a thread back.
func ioShares(f *serveFlags, cpu *worker.CPUGroups, cfg *ioshare.Config, log *slog.Logger) {
	mech := cpu.Mechanism()
	var threads ioshare.Threads
	switch {
	case f.ioShares == "off" || f.sched == "off":
	case mech == "nice" && ioshare.CanWeigh():
		threads = ioshare.NiceLevels{}
		if d := cpu.Slice(); d > 0 {
			nl, err := ioshare.SlicedNiceLevels(d, func() bool { return cpu.Slice() > 0 })
			if err != nil {
				log.Warn("the server's I/O threads keep their short EEVDF slice while they move a function's bytes", "error", err)
			} else {
				threads = nl
			}
		}
	default:
		if tg := cpu.Threads(); tg != nil {
			if _, ok := tg.Base(); ok {
				threads = tg
			}
		}
	}
	on := f.ioShares == "on" || (f.ioShares == "auto" && threads != nil)
	cfg.Off = !on
	if on && threads != nil {
		cfg.Threads, cfg.Log, cfg.Weighing = threads, log, cpu.On
		cfg.Nice = func(share float64, class sched.Class) int {
			return worker.NiceLevel(worker.WeightOf(share, class.String()))
		}
	}
	if f.sched == "off" {
		return // --sched off: nothing shared, said elsewhere
	}
	if on {
		log.Info("the server's I/O by share: request bodies and answers move a piece at a time in their functions' turns", "cpu_weights", mech, "at_functions_weights", threads != nil)
	} else {
		log.Info("the server's I/O moves as it comes (--io-shares; auto turns it on where the server can weigh its threads as the workers: nice levels it may take back, or cgroup v1 groups)", "cpu_weights", mech)
	}
}

// workerExe is the binary workers run: plover-worker beside this one when
// it is there (the worker without the server, the store clients and the
// CLI: it starts in about a third of the time, BENCHMARKS.md), else this
// binary itself as `plover worker`. Both answer with the worker protocol
// they speak, and a server refuses a worker of another.
//
// The server trusts it as it trusts itself, so it must be owned as the
// plover binary is and writable by no one else; otherwise it is not used.
func workerExe(log *slog.Logger) string {
	self, err := os.Executable()
	if err != nil {
		return "/proc/self/exe"
	}
	return workerExeBeside(self, log)
}

// workerExeBeside is workerExe for the plover binary at self.
func workerExeBeside(self string, log *slog.Logger) string {
	lean := filepath.Join(filepath.Dir(self), "plover-worker")
	fi, err := os.Stat(lean)
	if err != nil {
		log.Info("no plover-worker beside the plover binary: workers run plover worker, which starts a few milliseconds slower (make build installs both)", "looked_for", lean)
		return "/proc/self/exe"
	}
	sfi, serr := os.Stat(self)
	owner := func(fi os.FileInfo) int64 {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			return int64(st.Uid)
		}
		return -1
	}
	switch {
	case !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0:
		log.Warn("plover-worker beside the plover binary is not an executable file: not used", "path", lean)
	case fi.Mode()&0o022 != 0:
		log.Warn("plover-worker beside the plover binary is writable by others than its owner: not used", "path", lean, "mode", fi.Mode().String())
	case serr != nil || owner(fi) != owner(sfi):
		log.Warn("plover-worker beside the plover binary has another owner than plover: not used", "path", lean)
	default:
		return lean
	}
	return "/proc/self/exe"
}

// standbySizes is a device's standby pool, floor and ceiling, from the
// flags (-1 and 0: the target's defaults). On the host device an idle
// worker is about 2 MiB of memory, and 16 distinct functions waking at once
// on 2 CPUs answered within 26 ms with 16 workers waiting against 120 ms
// with one (BENCHMARKS.md); on a GPU each holds a CUDA context. A floor of
// 0 turns the pool off unless a ceiling is given.
func standbySizes(target string, floor, ceiling int) (int, int) {
	defFloor, defCeiling := device.Standby(target)
	if floor < 0 {
		floor = defFloor
	}
	if ceiling == 0 {
		if floor == 0 {
			return 0, 0
		}
		ceiling = defCeiling
	}
	return floor, max(floor, ceiling)
}
