package cli

import "time"

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
	if f.idleTTL == 0 {
		return usagef(env, "serve", "--idle-ttl 0s: want a positive duration, or a negative one to never release idle instances")
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
	return nil
}
