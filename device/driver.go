package device

/*
#cgo CFLAGS: -I${SRCDIR}/../abi
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "cudadrv.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/plover-run/plover/loader"
)

// libcuda is the driver library's soname; the versioned name is the one the
// driver package installs everywhere (the unversioned link is dev-only).
const libcuda = "libcuda.so.1"

// driver is one loaded copy of libcuda. Drivers are cached by path and never
// unloaded: bundles' cudart hold on to the same library.
type driver struct {
	c       *C.plcu_driver_t
	path    string
	version int // e.g. 12040
}

var (
	driversMu sync.Mutex
	drivers   = map[string]*driver{}
)

func loadDriver(path string) (*driver, error) {
	driversMu.Lock()
	defer driversMu.Unlock()
	if d := drivers[path]; d != nil {
		return d, nil
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var msg [512]C.char
	var c *C.plcu_driver_t
	// plcu_open dlopens libcuda and dlsyms its entry points: under the
	// process's one dynamic-linker lock.
	loader.DL(func() { c = C.plcu_open(cpath, &msg[0], C.size_t(len(msg))) })
	if c == nil {
		return nil, fmt.Errorf("CUDA driver unavailable: %s", C.GoString(&msg[0]))
	}
	d := &driver{c: c, path: path}
	var v C.int
	if C.plcu_driver_version(c, &v) == 0 {
		d.version = int(v)
	}
	drivers[path] = d
	return d, nil
}

func (d *driver) err(op string, code C.CUresult) *DriverError {
	e := &DriverError{Op: op, Code: int(code)}
	if s := C.plcu_error_name(d.c, code); s != nil {
		e.Name = C.GoString(s)
	} else {
		e.Name = fmt.Sprintf("CUDA error %d", int(code))
	}
	if s := C.plcu_error_string(d.c, code); s != nil {
		e.Desc = C.GoString(s)
	}
	return e
}

// versionString renders cuDriverGetVersion's 1000*major + 10*minor.
func versionString(v int) string {
	if v <= 0 {
		return "unknown"
	}
	return fmt.Sprintf("%d.%d", v/1000, v%1000/10)
}
