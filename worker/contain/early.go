package contain

// The bounding set is per thread, so Enter must drop each capability on
// every thread of the worker: one psx broadcast per capability, about 40
// of them, 4 ms of a worker's start (BenchmarkSpawn). A constructor runs
// before the Go runtime has started its first thread other than the main
// one, and every thread the runtime or a library makes later is cloned
// from a thread that descends from it and inherits its bounding set: one
// plain prctl per capability there does the work for all. Enter still
// drops whatever is left and verifies every thread; this only makes its
// work cheap. It acts in a process started as "EXE worker ..." (the
// server's spawn), never in the server or the CLI.

/*
// The Makefile turns deprecation warnings off for go-nvml; ours stay on.
#cgo CFLAGS: -Wdeprecated-declarations
#include <string.h>
#include <sys/prctl.h>

__attribute__((constructor)) static void plover_contain_early(int argc, char **argv, char **envp) {
	(void)envp;
	if (argc < 2 || argv[1] == 0 || strcmp(argv[1], "worker") != 0) {
		return;
	}
	// EINVAL past the last capability the kernel knows; EPERM without
	// CAP_SETPCAP, where Enter does not drop it either.
	for (int c = 0; c < 64; c++) {
		if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) != 0) {
			return;
		}
	}
}
*/
import "C"
