package inside

/*
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

// The program whose run (or control call) this thread is making, 0 for
// none: set by Go around each one in a tenant's worker. Initial-exec: the
// handler reads it without a call into the dynamic linker, which is not
// async-signal-safe (this code is linked into the executable anyway).
static __thread uint32_t plover_prog __attribute__((tls_model("initial-exec")));

static void plover_set_prog(uint32_t id) { plover_prog = id; }

// The pipe the mark goes to (wire.FatalFD), -1 until installed.
static int plover_fatal_fd = -1;

// plover_put_u appends v in decimal to b at *n.
static void plover_put_u(char *b, size_t *n, unsigned long v) {
	char d[24];
	size_t k = 0;
	do { d[k++] = (char)('0' + v % 10); v /= 10; } while (v != 0);
	while (k > 0) b[(*n)++] = d[--k];
}

// The fatal signals, and the action each had before plover_fatal took it
// over: the default (contain.DefaultFatalSignals), or for SIGSEGV and SIGBUS
// checked mode's fault reporter (device/host_checked.c), set before it.
static const int plover_sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP, SIGSYS};
#define PLOVER_NSIGS (sizeof plover_sigs / sizeof plover_sigs[0])
static struct sigaction plover_prev[PLOVER_NSIGS];

// plover_fatal names the program the signal took (wire.FatalMark), when
// the thread was running one, in one write(2) to its pipe (non-blocking: a
// pipe a bundle filled takes no mark, and never holds the death up); then
// lets the handler it replaced have its say (checked mode's line on
// stderr naming the entry and buffer of a guard fault, which the server
// finds anywhere in a line: after words the bundle left unended too), and
// dies by the signal: SA_RESETHAND put back the
// default action and SA_NODEFER leaves the signal unblocked, so the raise
// ends the process here (a fault's instruction would fault again anyway).
// Async-signal-safe calls only.
static void plover_fatal(int sig, siginfo_t *si, void *ctx) {
	uint32_t id = plover_prog;
	if (id != 0 && plover_fatal_fd >= 0) {
		static const char mark[] = "plover worker: fatal signal ";
		static const char mid[] = " in program ";
		char b[96];
		size_t n = 0;
		memcpy(b, mark, sizeof mark - 1); n += sizeof mark - 1;
		plover_put_u(b, &n, (unsigned long)sig);
		memcpy(b + n, mid, sizeof mid - 1); n += sizeof mid - 1;
		plover_put_u(b, &n, (unsigned long)id);
		b[n++] = '\n';
		ssize_t r = write(plover_fatal_fd, b, n);
		(void)r;
	}
	for (size_t i = 0; i < PLOVER_NSIGS; i++) {
		const struct sigaction *prev = &plover_prev[i];
		if (plover_sigs[i] != sig) continue;
		if (prev->sa_flags & SA_SIGINFO)
			prev->sa_sigaction(sig, si, ctx);
		else if (prev->sa_handler != SIG_DFL && prev->sa_handler != SIG_IGN)
			prev->sa_handler(sig);
	}
	raise(sig);
}

static int plover_install_fatal(int fd) {
	plover_fatal_fd = fd;
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_sigaction = plover_fatal;
	// On the alternate stack Go gives each of its threads: a stack
	// overflow's SIGSEGV still finds room to run.
	sa.sa_flags = SA_SIGINFO | SA_RESETHAND | SA_NODEFER | SA_ONSTACK;
	sigemptyset(&sa.sa_mask);
	for (size_t i = 0; i < PLOVER_NSIGS; i++)
		if (sigaction(plover_sigs[i], &sa, &plover_prev[i]) != 0) return -1;
	return 0;
}
*/
import "C"

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/plover-run/plover/worker/wire"
)

// reportPipe readies the pipe the server gave a tenant's worker, or one in
// checked mode (wire.FatalFD), for the fatal mark and checked mode's
// report, which signal handlers write: non-blocking, so that a handler's
// write cannot block on a pipe the bundle filled; closed on exec, so that
// a program the bundle runs does not inherit it.
func reportPipe() error {
	fd := wire.FatalFD
	if err := unix.SetNonblock(fd, true); err == unix.EBADF {
		return fmt.Errorf("the server gave this worker no report pipe (fd %d): install plover and plover-worker from one build", fd)
	} else if err != nil {
		return fmt.Errorf("the report pipe (fd %d): %w", fd, err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil {
		return fmt.Errorf("the report pipe (fd %d): %w", fd, err)
	}
	return nil
}

// installFatalHandler replaces the action of the fatal signals (the
// default, contain.DefaultFatalSignals, or checked mode's for SIGSEGV and SIGBUS:
// it must come after both) with a handler that names the program whose
// run or call the signal took (setProgram, marked) on the report pipe
// (wire.FatalFD, readied by reportPipe), then calls the handler it
// replaced, if any, and lets the
// signal kill the process as the default action would: the server reads
// the mark to tell the program at fault from those that only shared its
// process. A signal on a thread of no program's (one the bundle made)
// writes no mark: the server then blames every program. What a client
// makes a bundle print goes to stdout and stderr, never to the pipe.
func installFatalHandler() error {
	if C.plover_install_fatal(C.int(wire.FatalFD)) != 0 {
		return fmt.Errorf("cannot install the fatal-signal handler")
	}
	return nil
}

// setProgram tells the handler the program this thread runs (0: none).
// One cgo call: a tenant's worker pays two per control call and per
// instance.
func setProgram(id uint32) { C.plover_set_prog(C.uint32_t(id)) }

// marked locks the calling goroutine to its thread and marks the thread
// as program id's (setProgram), until unmark: a goroutine that calls into
// a program's bundle code (its runs, its instances' hooks, its unload
// hook) holds the mark around every call.
func marked(id uint32) (unmark func()) {
	runtime.LockOSThread()
	setProgram(id)
	return func() {
		setProgram(0)
		runtime.UnlockOSThread()
	}
}
