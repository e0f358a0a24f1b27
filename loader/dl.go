package loader

import (
	"runtime"
	"sync"
)

// dlMu is the process's one lock over the dynamic linker: every dlopen,
// dlsym, dlclose and dlerror Plover makes runs under it, the loader's own,
// libcuda's (package device loads the driver through DL) and NVML's
// (go-nvml's Init and Shutdown, called through DL). glibc keeps dlerror's
// message per thread, so what pairs a call with the dlerror that explains
// it is the locked OS thread (lockDL), as in go-nvml's pkg/dl; the one
// mutex serialises the dynamic linker's work across the process, so that
// no two libraries' loads (and constructors) interleave.
var dlMu sync.Mutex

// lockDL takes the dynamic-linker lock on a locked OS thread: glibc keeps
// dlerror's message per thread, and a dlopen and its dlerror made as two
// cgo calls would otherwise run on whichever threads the goroutine had.
func lockDL() {
	runtime.LockOSThread()
	dlMu.Lock()
}

func unlockDL() {
	dlMu.Unlock()
	runtime.UnlockOSThread()
}

// DL runs fn under the process's dynamic-linker lock, on one OS thread. Code
// outside this package that opens libraries (the CUDA driver, NVML) calls
// them inside fn. fn must not call back into the loader: the lock is not
// reentrant.
func DL(fn func()) {
	lockDL()
	defer unlockDL()
	fn()
}
