package loader

/*
// The Makefile turns deprecation warnings off for go-nvml; ours stay on.
#cgo CFLAGS: -Wdeprecated-declarations
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>

static void *plover_dlopen(const char *path) { return dlopen(path, RTLD_NOW | RTLD_LOCAL); }
// 1 when the file at path is mapped in this process (dlopen matches a
// loaded object by name, then by the file's device and inode).
static int plover_resident(const char *path) {
	void *h = dlopen(path, RTLD_LAZY | RTLD_NOLOAD);
	if (h == NULL) return 0;
	dlclose(h);
	return 1;
}
static const char *plover_dlerror(void) { return dlerror(); }
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/plover-run/plover/abi"
)

// Library is a dlopened bundle library.
type Library struct {
	Path      string
	Target    string
	Info      *Info          // the static read Open checked
	LastError unsafe.Pointer // plover_last_error
	// ABI1: the bundle speaks ABI 1 (its entries take the ABI 1 state).
	ABI1 bool
	// The ABI 2 lifecycle hooks the bundle defines; nil where it does not.
	Load, InstanceInit, InstanceFini, Unload unsafe.Pointer

	mu     sync.Mutex // guards handle and syms; the dynamic linker is dl.go's
	handle unsafe.Pointer
	syms   map[string]unsafe.Pointer
}

// Open checks the library at path statically (ELF, ABI version, target, the
// kernels), then dlopens it and resolves the ABI symbols and every kernel.
// The library's constructors run here. A bundle is opened with OpenBundle,
// which checks the manifest too.
func Open(path, target string, kernels []string) (*Library, error) {
	info, err := Inspect(path)
	if err != nil {
		return nil, err
	}
	if err := info.Check(path, target, kernels); err != nil {
		return nil, err
	}
	return open(path, info, target, kernels)
}

// Resident reports whether the library file at path is mapped in this
// process now: a library never closed (CUDA's), one closed that stays
// (linked -z nodelete, holding a GNU unique symbol or a thread_local's
// destructor), or one open. dlopen would hand that mapping back, its
// statics as they are, instead of loading the file afresh.
func Resident(path string) bool {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	lockDL()
	defer unlockDL()
	return C.plover_resident(cpath) == 1
}

// open dlopens a library that passed the static checks of info.
func open(path string, info *Info, target string, kernels []string) (*Library, error) {
	unclaim, err := claimUnique(path, info)
	if err != nil {
		return nil, err
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	lockDL()
	h := C.plover_dlopen(cpath)
	var msg string
	if h == nil {
		msg = C.GoString(C.plover_dlerror())
	}
	unlockDL()
	if h == nil {
		unclaim()
		return nil, &Error{Path: path, Reason: dlopenFailed + msg}
	}
	l := &Library{Path: path, Target: target, Info: info, handle: h, syms: map[string]unsafe.Pointer{}}
	if err := l.resolve(target, kernels); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// resolve re-reads the ABI values through the loaded image (the static read
// and the dynamic linker must agree) and resolves every kernel.
func (l *Library) resolve(target string, kernels []string) error {
	ver, err := l.Symbol(abi.SymABIVersion)
	if err != nil {
		return err
	}
	if v := abi.DecodeVersion(*(*uint32)(ver)); v != l.Info.ABI {
		return &Error{Path: l.Path, Reason: fmt.Sprintf("%s reads %s through the dynamic linker but %s in the file", abi.SymABIVersion, v, l.Info.ABI)}
	}
	tgt, err := l.Symbol(abi.SymTarget)
	if err != nil {
		return err
	}
	if t := C.GoString((*C.char)(tgt)); t != target {
		return &Error{Path: l.Path, Reason: fmt.Sprintf("built for target %q, the device is %q", t, target)}
	}
	if l.LastError, err = l.Symbol(abi.SymLastError); err != nil {
		return err
	}
	for _, k := range kernels {
		if _, err := l.Entry(k); err != nil {
			return err
		}
	}
	l.ABI1 = l.Info.ABI.Major == 1
	if l.ABI1 {
		return nil // ABI 1 has no hooks: a plover_load there is not one
	}
	for _, h := range []struct {
		name string
		p    *unsafe.Pointer
	}{{abi.SymLoad, &l.Load}, {abi.SymInstanceInit, &l.InstanceInit}, {abi.SymInstanceFini, &l.InstanceFini}, {abi.SymUnload, &l.Unload}} {
		if !l.Info.Exports[h.name] {
			continue
		}
		if !l.Info.Funcs[h.name] {
			return &Error{Path: l.Path, Reason: fmt.Sprintf("exports %s, but not as a function (a hook is void %s(plover_state_t *s))", h.name, h.name)}
		}
		if *h.p, err = l.Symbol(h.name); err != nil {
			return err
		}
	}
	return nil
}

// Entry resolves a kernel entry point, allowing only functions the library
// itself defines (see Info.CheckEntry).
func (l *Library) Entry(name string) (unsafe.Pointer, error) {
	if err := l.Info.CheckEntry(name); err != nil {
		return nil, &Error{Path: l.Path, Reason: err.Error()}
	}
	return l.Symbol(name)
}

// Symbol resolves an exported symbol, caching the result.
func (l *Library) Symbol(name string) (unsafe.Pointer, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p, ok := l.syms[name]; ok {
		return p, nil
	}
	if l.handle == nil {
		return nil, &Error{Path: l.Path, Reason: "library is closed"}
	}
	if !abi.ValidSymbol(name) {
		return nil, &Error{Path: l.Path, Reason: fmt.Sprintf("%q is not a C identifier", name)}
	}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	lockDL()
	C.plover_dlerror()
	p := C.dlsym(l.handle, cname)
	var msg string
	if p == nil {
		if e := C.plover_dlerror(); e != nil {
			msg = C.GoString(e)
		}
	}
	unlockDL()
	if p == nil {
		if msg == "" {
			msg = "symbol is NULL"
		}
		return nil, &Error{Path: l.Path, Reason: fmt.Sprintf("does not export %q (%s)", name, msg)}
	}
	l.syms[name] = p
	return p, nil
}

// StaysMapped reports whether a library built for target stays mapped in
// its process once closed (Close): a target that does not say its
// libraries unload (abi.Target.Unloads), CUDA's, or one not registered.
// A process that loads such libraries again and again (a tenant's worker)
// holds every copy it ever loaded.
func StaysMapped(target string) bool {
	t, ok := abi.TargetOf(target)
	return !ok || !t.Unloads
}

// Close unloads a library whose target says its libraries unload
// (abi.Target.Unloads: the host's). Others are never unloaded (CUDA's
// static cudart registered fatbins with the driver, and unregistering them
// at dlclose is a documented source of crashes): the handle is simply
// dropped, and the library stays mapped (StaysMapped).
func (l *Library) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.handle == nil {
		return nil
	}
	h := l.handle
	l.handle = nil
	l.syms = nil
	if StaysMapped(l.Target) {
		return nil
	}
	lockDL()
	defer unlockDL()
	if C.dlclose(h) != 0 {
		return &Error{Path: l.Path, Reason: "dlclose failed: " + C.GoString(C.plover_dlerror())}
	}
	return nil
}

// Preload maps and relocates the named system libraries (sonames such as
// "libstdc++.so.6") and keeps them for the life of the process, so that a
// bundle depending on them loads without paying for them: a standby worker
// does this while it waits. Libraries that are not installed are skipped;
// the ones loaded are returned.
func Preload(sonames ...string) []string {
	var loaded []string
	for _, name := range sonames {
		cname := C.CString(name)
		lockDL()
		h := C.plover_dlopen(cname)
		unlockDL()
		C.free(unsafe.Pointer(cname))
		if h != nil {
			loaded = append(loaded, name) // never closed: kept on purpose
		}
	}
	return loaded
}
