package cli

import (
	"fmt"
	"syscall"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/netguard"
	"github.com/plover-run/plover/worker"
)

// Bounds of the serve flags whose larger (or, for periods, smaller) values
// were taken and then did harm: --poll 1ns and --repository-poll 1ns kept
// a core busy; an --idle-ttl of 1-3 ns gave the reaper a period of 0,
// which panicked once the server served; a --worker-max-pids past the
// kernel's PID_MAX_LIMIT could not be written (pids.max refused it) and
// left workers unbounded; a --device-runs of 2^62 overflowed the
// scheduler's charges (a run's time times the runs); each standby worker
// is a process, its threads and descriptors, and on a GPU a CUDA context.
const (
	leastPoll      = 100 * time.Millisecond
	leastIdleTTL   = 10 * time.Millisecond
	pidMaxLimit    = 4 << 20
	mostDeviceRuns = 4096
	mostStandby    = 256
)

// checkServeFlags checks the flags that bound memory, processes, copies,
// instances and deadlines, each refusal a usage error naming the flag.
func checkServeFlags(f *serveFlags, env *Env) error {
	if err := checkWorkerScope(f); err != nil {
		return usagef(env, "serve", "%v", err)
	}
	for _, c := range []struct {
		name     string
		v, least int64
	}{{"max-body", int64(f.maxBodyMB), 1}, {"memory-limit", f.memLimitMB, 0}, {"cache-limit", f.cacheMB, 0}, {"max-body-memory", f.maxBodyMemMB, 0}, {"max-pipeline-memory", f.maxPipeMemMB, 0},
		{"worker-max-memory", f.workerMaxMemMB, 0}, {"max-pinned-memory", f.maxPinnedMB, 0}} {
		if err := mibFlag(c.name, c.v, c.least); err != nil {
			return usagef(env, "serve", "%v", err)
		}
	}
	if n := f.maxSpoolMB; n < 0 || n > topMiB || n > 0 && n < int64(f.maxBodyMB) {
		return usagef(env, "serve", "--max-spool %d: want 0 (4 times --max-body) or --max-body (%d) to %d MiB: a bundle of --max-body must fit", n, f.maxBodyMB, topMiB)
	}
	if err := checkMemoryGroups(f.memoryGroups); err != nil {
		return usagef(env, "serve", "%v", err)
	}
	if n := f.workerMaxPids; n < 0 || n > 0 && n < minWorkerMaxPids {
		return usagef(env, "serve", "--worker-max-pids %d: want 0 (no bound) or at least %d: a worker's own threads need a few", n, minWorkerMaxPids)
	}
	if n := f.workerMaxPids; n > pidMaxLimit {
		return usagef(env, "serve", "--worker-max-pids %d: want at most %d, the kernel's PID_MAX_LIMIT (0: no bound)", n, pidMaxLimit)
	}
	if n, _ := workerInstances(f); f.isolation == "process" && f.workerMaxPids > 0 && n < 1 {
		return usagef(env, "serve", "--worker-max-pids %d: leaves a worker's instances no thread: its own take up to %d on this machine (one per CPU, and 16 more)", f.workerMaxPids, worker.OwnThreads())
	}
	if err := checkCountFlags(f); err != nil {
		return usagef(env, "serve", "%v", err)
	}
	if k := f.copyPieceKiB; k < 0 || k > 0 && k < minCopyPieceKiB || k > maxCopyPieceKiB {
		return usagef(env, "serve", "--copy-piece %d: want 0 (whole copies) or %d to %d KiB: smaller pieces cost a driver call each (a 4 MB body in 1 KiB pieces is 4096 calls a way)", k, minCopyPieceKiB, maxCopyPieceKiB)
	}
	return checkPoolFlags(f, env)
}

// checkPoolFlags refuses the pool and deadline flags whose 0 or negative
// value the engine and the transports would take as their defaults: a
// zero field is a Go caller's "the default" there, but on the command
// line it is a mistake that ran as something else (--timeout 0 gave every
// request 30 s, --max-queue -5 queued 64, --idle-ttl 0 released after 5
// minutes).
func checkPoolFlags(f *serveFlags, env *Env) error {
	for _, c := range []struct {
		name string
		v    int
	}{{"max-instances", f.maxInstances}, {"max-queue", f.maxQueue}} {
		if c.v < 1 {
			return usagef(env, "serve", "--%s %d: want 1 or more", c.name, c.v)
		}
	}
	if f.minInstances < 0 {
		return usagef(env, "serve", "--min-instances %d: want 0 (none kept warm) or more", f.minInstances)
	}
	if err := checkInstanceFlags(f); err != nil {
		return usagef(env, "serve", "%v", err)
	}
	// A --min-instances over --max-instances is no mistake: both are
	// defaults, and a function whose manifest allows more instances keeps
	// the whole --min-instances warm (policyFor caps it per function).
	for _, c := range []struct {
		name string
		v    time.Duration
	}{{"timeout", f.timeout}, {"max-timeout", f.maxTimeout}, {"read-timeout", f.readTimeout}, {"write-timeout", f.writeTimeout}} {
		if c.v <= 0 {
			return usagef(env, "serve", "--%s %v: want a positive duration", c.name, c.v)
		}
	}
	if f.idleTTL >= 0 && f.idleTTL < leastIdleTTL {
		return usagef(env, "serve", "--idle-ttl %v: want %v or more, or a negative duration to never release idle instances", f.idleTTL, leastIdleTTL)
	}
	// Negative, these silently meant their 0: never re-read the records,
	// cut the requests in flight at once on SIGTERM.
	for _, c := range []struct {
		name, zero string
		v          time.Duration
	}{{"poll", "never re-read", f.poll}, {"grace", "cut requests in flight at once", f.grace}} {
		if c.v < 0 {
			return usagef(env, "serve", "--%s %v: want 0 (%s) or a positive duration", c.name, c.v, c.zero)
		}
	}
	if f.poll > 0 && f.poll < leastPoll {
		return usagef(env, "serve", "--poll %v: want 0 (never re-read) or %v or more: each poll reads every function's record", f.poll, leastPoll)
	}
	return nil
}

// checkInstanceFlags bounds --min-instances, --max-instances and
// --max-queue by what a manifest may say, and the instances by what one
// worker may hold (workerInstances).
func checkInstanceFlags(f *serveFlags) error {
	most, why := abi.MaxInstances, "a manifest's bound"
	if n, w := workerInstances(f); n > 0 && n < most {
		most, why = n, "the instances one worker may hold: "+w
	}
	if f.maxInstances > most {
		return fmt.Errorf("--max-instances %d: want 1 to %d (%s)", f.maxInstances, most, why)
	}
	if f.minInstances > most {
		return fmt.Errorf("--min-instances %d: want 0 to %d (%s)", f.minInstances, most, why)
	}
	if f.maxQueue > abi.MaxQueue {
		return fmt.Errorf("--max-queue %d: want 1 to %d (a manifest's bound)", f.maxQueue, abi.MaxQueue)
	}
	return nil
}

// workerInstances is the most instances of one function a worker may
// hold under --worker-max-pids (worker.InstanceRoom), and what says so;
// 0 where there are no workers (--isolation none) or no bound on their
// tasks.
func workerInstances(f *serveFlags) (int, string) {
	if f.isolation != "process" || f.workerMaxPids <= 0 {
		return 0, ""
	}
	return worker.InstanceRoom(f.workerMaxPids), fmt.Sprintf("--worker-max-pids %d, less up to %d threads of the worker's own", f.workerMaxPids, worker.OwnThreads())
}

// checkCountFlags bounds the standby pool's flags, --device-runs and
// --max-conns.
func checkCountFlags(f *serveFlags) error {
	for _, c := range []struct {
		name string
		v    int
		most int
		why  string
	}{
		{"standby-workers", f.standby, mostStandby, "each a process, and on a GPU a CUDA context"},
		{"standby-max", f.standbyMax, mostStandby, "each a process, and on a GPU a CUDA context"},
		{"device-runs", f.deviceRuns, mostDeviceRuns, "a device's runs at once"},
	} {
		if c.v > c.most {
			return fmt.Errorf("--%s %d: want at most %d (%s)", c.name, c.v, c.most, c.why)
		}
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil && f.maxConns > netguard.MostConns(lim.Max) {
		return fmt.Errorf("--max-conns %d: want 0 (derived) or at most %d: the open-file limit (%d) less the %d descriptors the server keeps for its workers, bundles and store", f.maxConns, netguard.MostConns(lim.Max), lim.Max, netguard.ConnsReserve)
	}
	return nil
}
