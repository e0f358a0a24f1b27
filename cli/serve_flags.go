package cli

// checkServeFlags checks the flags that bound memory, processes and copies,
// each refusal a usage error naming the flag.
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
	return nil
}
