package contain

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// DefaultFatalSignals gives the signals a crashing bundle raises back their
// default action. Go's runtime handles them, and turns a fault in C code
// into "exit status 2" with a Go traceback; with the default action the
// worker dies by the signal itself, so the server can say which. The
// worker's own Go code has no use for recovering from them.
func DefaultFatalSignals() error {
	type sigaction struct { // struct kernel_sigaction, x86-64 and arm64
		handler  uintptr
		flags    uint64
		restorer uintptr
		mask     uint64
	}
	var sa sigaction // handler 0: SIG_DFL
	for _, sig := range []unix.Signal{unix.SIGSEGV, unix.SIGBUS, unix.SIGFPE, unix.SIGILL, unix.SIGABRT, unix.SIGTRAP, unix.SIGSYS} {
		if _, _, e := unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(sig), uintptr(unsafe.Pointer(&sa)), 0, 8, 0, 0); e != 0 {
			return e
		}
	}
	// Nothing to dump a core into, and no core of a tenant's memory left
	// behind.
	return unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{})
}
