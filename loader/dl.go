package loader

import (
	"runtime"
	"sync"
)

// dlMu is the process's one lock over the dynamic linker: every dlopen,
// dlsym, dlclose and dlerror Plover makes runs under it, the loader's own,
// libcuda's (package device loads the driver through DL) and NVML's
// (go-nvml's Init and Shutdown, called through DL). dlerror reports the
// last failure of any of them, so a call and the dlerror that explains it
// must not interleave with another library's, as go-nvml's pkg/dl keeps
// them under one lock too.
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
