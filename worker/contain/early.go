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
//
// A process started as "EXE worker-init ..." is the first process of a
// worker's PID namespace (Spawner.Start), and never reaches Go: it is
// that namespace's init, which the kernel needs alive for anything to run
// in it and whose end kills everything in it. Every binary that links
// this package (the server, the worker, their tests) can be it.
//
// A worker started in such a namespace ("EXE worker ... --pid-namespace")
// still sees the server's /proc, where neither its pid nor its threads'
// ids are its own: psx, which Enter's every-thread calls go through, reads
// /proc/<getpid()>/task, and would miss every thread. It is started in a
// mount namespace of its own too, and mounts its namespace's /proc there
// first thing, while it is one thread and still root. "EXE worker-probe"
// does only that, for Spawner.Contain to try.

/*
// The Makefile turns deprecation warnings off for go-nvml; ours stay on.
#cgo CFLAGS: -Wdeprecated-declarations
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

// plover_stat_ppid is the parent pid /proc/self/stat gives, or -1.
static long plover_stat_ppid(void) {
	char b[512];
	int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		return -1;
	}
	ssize_t n = read(fd, b, sizeof b - 1);
	close(fd);
	if (n <= 0) {
		return -1;
	}
	b[n] = 0;
	char *p = strrchr(b, ')'); // the name in parentheses may hold anything
	if (p == NULL || p[1] != ' ' || p[2] == 0 || p[3] != ' ') {
		return -1;
	}
	return strtol(p + 4, NULL, 10);
}

// plover_oom_first makes this process the OOM killer's first choice, as
// Enter makes a worker (contain.OOMScoreAdj; the "1000" here is that
// constant). Best effort: the init runs no bundle code, and where it
// cannot set its score (no writable /proc) its worker cannot either, and
// fails its start (Enter) with the reason, which the init has no way to
// tell.
static void plover_oom_first(void) {
	int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
	if (fd < 0) {
		return;
	}
	if (write(fd, "1000", 4) != 4) {
		// Nothing to do: best effort.
	}
	close(fd);
}

// plover_pidns_init is a worker namespace's init: it says it is ready on
// stdout, then reaps whatever is orphaned into it until it is killed, by
// the server (the worker ended) or by its parent-death signal (the server
// ended). As init it ignores every signal but SIGKILL from outside, and
// it makes no other system call, so nothing a bundle does reaches it.
static void plover_pidns_init(int argc, char **argv) {
	long parent = 0;
	for (int i = 2; i + 1 < argc; i++) {
		if (strcmp(argv[i], "--parent") == 0) {
			parent = strtol(argv[i + 1], NULL, 10);
		}
	}
	plover_oom_first();
	sigset_t chld;
	sigemptyset(&chld);
	sigaddset(&chld, SIGCHLD);
	sigprocmask(SIG_BLOCK, &chld, NULL);
	// Set before exec already; again here so that the check below covers
	// the whole of its life: a server that died before this line is not
	// our parent any more.
	prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
	long ppid = plover_stat_ppid();
	if (parent > 0 && ppid >= 0 && ppid != parent) {
		_exit(1);
	}
	if (write(1, "R", 1) != 1) {
		_exit(1);
	}
	for (int fd = 0; fd < 3; fd++) {
		close(fd);
	}
	for (;;) {
		while (waitpid(-1, NULL, WNOHANG | __WALL) > 0) {
		}
		// SIGCHLD stays pending while blocked, so one that came since
		// the loop above ends the wait at once; the timeout is a backstop.
		struct timespec ts = {60, 0};
		sigtimedwait(&chld, NULL, &ts);
	}
}

// plover_own_proc mounts the /proc of this process's PID namespace over
// the one it sees, when that is another namespace's, and exits saying why
// if it cannot: a worker whose every-thread calls would miss threads must
// not run. Its mount namespace is its own (Spawner.Start gave it one, and
// only with --pid-namespace is this called), and made private first, so
// the mount reaches no other process.
static void plover_own_proc(void) {
	char self[32];
	ssize_t n = readlink("/proc/self", self, sizeof self - 1);
	if (n > 0) {
		self[n] = 0;
		if (strtol(self, NULL, 10) == (long)getpid()) {
			return;
		}
	}
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
	    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0) {
		fprintf(stderr, "worker: cannot mount the /proc of its PID namespace: %s\n", strerror(errno));
		_exit(1);
	}
}

static int plover_has_arg(int argc, char **argv, const char *arg) {
	for (int i = 2; i < argc; i++) {
		if (strcmp(argv[i], arg) == 0) {
			return 1;
		}
	}
	return 0;
}

__attribute__((constructor)) static void plover_contain_early(int argc, char **argv, char **envp) {
	(void)envp;
	if (argc < 2 || argv[1] == 0) {
		return;
	}
	if (strcmp(argv[1], "worker-init") == 0) {
		plover_pidns_init(argc, argv);
	}
	if (strcmp(argv[1], "worker-probe") == 0) {
		plover_own_proc();
		_exit(0);
	}
	if (strcmp(argv[1], "worker") != 0) {
		return;
	}
	if (plover_has_arg(argc, argv, "--pid-namespace")) {
		plover_own_proc();
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
