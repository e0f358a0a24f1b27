package device

/*
#cgo CFLAGS: -I${SRCDIR}/../abi
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "cudadrv.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/plover-run/plover/abi"
)

// The C instance's step array must hold exactly a maximal chain.
var (
	_ [C.PLCU_MAX_STEPS - abi.MaxChainLength]struct{}
	_ [abi.MaxChainLength - C.PLCU_MAX_STEPS]struct{}
)

// constantsChunk bounds the pinned staging LoadConstants uses: pinning is
// slow and scarce, and constants load once per function version.
const constantsChunk = 4 << 20

// GPU is one CUDA device, driven through its primary context.
type GPU struct {
	drv     *driver
	ordinal int
	dev     C.CUdevice
	ctx     C.CUcontext
	name    string
	hwTotal int64
	limit   int64 // 0: no budget
	log     *slog.Logger

	// mem, when set, reads the device's memory in place of the context:
	// a GPU opened bare (OpenBare), ctx nil, which runs nothing here.
	mem       memReader
	memWarned atomic.Bool

	used          atomic.Int64
	fault         atomic.Pointer[DeviceFault]
	closed        atomic.Bool
	captureLogged atomic.Bool
	graphs        graphCounters
	copyPiece     atomic.Int64 // bytes; 0: whole copies
	// The context's stream priorities: least (a plain stream's, usually
	// 0) to greatest (a smaller number).
	prioLeast, prioGreatest int
}

var _ Device = (*GPU)(nil)
var _ HostUnregistrar = (*GPU)(nil)
var _ CopyPiecer = (*GPU)(nil)

// SetCopyPiece makes the instances made from now on issue each run's copy
// in and copy out as async pieces of at most n bytes (0 or less: whole).
func (g *GPU) SetCopyPiece(n int64) { g.copyPiece.Store(max(n, 0)) }

// OpenCUDA opens every CUDA device visible to this process (as
// CUDA_VISIBLE_DEVICES filters them). limit is each device's memory budget
// in bytes, 0 for none. log may be nil.
func OpenCUDA(limit int64, log *slog.Logger) ([]*GPU, error) {
	return openGPUs(libcuda, limit, log)
}

func openGPUs(path string, limit int64, log *slog.Logger) ([]*GPU, error) {
	return openEach(path, limit, log, openGPU)
}

// openEach opens every visible CUDA device through the driver at path with
// open (openGPU, or openBareGPU), closing those it opened if one fails.
func openEach(path string, limit int64, log *slog.Logger, open func(*driver, int, int64, *slog.Logger) (*GPU, error)) ([]*GPU, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	d, err := loadDriver(path)
	if err != nil {
		return nil, err
	}
	// cuInit is cheap after the first call and reports a driver that broke
	// since (or, in tests, an environment that changed).
	if code := C.plcu_init(d.c); code != 0 {
		return nil, fmt.Errorf("CUDA driver %s: %w", path, d.err("cuInit", code))
	}
	var n C.int
	if code := C.plcu_device_count(d.c, &n); code != 0 {
		return nil, fmt.Errorf("CUDA driver %s: %w", path, d.err("cuDeviceGetCount", code))
	}
	if n == 0 {
		return nil, fmt.Errorf("CUDA driver %s: no CUDA devices visible (CUDA_VISIBLE_DEVICES=%q)",
			path, os.Getenv("CUDA_VISIBLE_DEVICES"))
	}
	gpus := make([]*GPU, 0, int(n))
	for i := 0; i < int(n); i++ {
		g, err := open(d, i, limit, log)
		if err != nil {
			for _, g := range gpus {
				g.Close()
			}
			return nil, err
		}
		gpus = append(gpus, g)
	}
	return gpus, nil
}

func openGPU(d *driver, ordinal int, limit int64, log *slog.Logger) (*GPU, error) {
	g := &GPU{drv: d, ordinal: ordinal, limit: limit, log: log}
	var name [256]C.char
	var total C.size_t
	var op *C.char
	var least, greatest C.int
	code := C.plcu_device_open(d.c, C.int(ordinal), &g.dev, &g.ctx, &name[0], C.int(len(name)), &total, &least, &greatest, &op)
	if code != 0 {
		return nil, fmt.Errorf("CUDA device %d: %w", ordinal, d.err(C.GoString(op), code))
	}
	g.name = fmt.Sprintf("%s (GPU %d)", C.GoString(&name[0]), ordinal)
	g.hwTotal = int64(total)
	g.prioLeast, g.prioGreatest = int(least), int(greatest)
	log.Info("CUDA device opened", "device", g.name, "memory", g.hwTotal,
		"budget", limit, "driver_cuda_version", versionString(d.version))
	return g, nil
}

// openBareGPUs opens every visible CUDA device bare (openBareGPU).
func openBareGPUs(path string, limit int64, log *slog.Logger) ([]*GPU, error) {
	return openEach(path, limit, log, openBareGPU)
}

// openBareGPU opens CUDA device ordinal for a server whose functions run
// in MPS worker processes: with no context. A process that holds a
// context on a GPU under MPS is one of its MPS server's clients, and
// after any client's fatal fault that server waits for every client to
// exit, refusing new ones (CUDA_ERROR_MPS_SERVER_NOT_READY) meanwhile:
// workers exit, the server does not, so one function's fault took the GPU
// until the server restarted. Its name and memory need no context;
// free memory comes from NVML, found by the UUID CUDA gives the device.
// Without NVML (or where it does not know the device) the GPU is opened
// with a context as before, and the log says what that risks.
func openBareGPU(d *driver, ordinal int, limit int64, log *slog.Logger) (*GPU, error) {
	g := &GPU{drv: d, ordinal: ordinal, limit: limit, log: log}
	var name [256]C.char
	var total C.size_t
	var uuid [16]C.uchar
	var hasUUID C.int
	var op *C.char
	code := C.plcu_device_info(d.c, C.int(ordinal), &g.dev, &name[0], C.int(len(name)), &total, &uuid[0], &hasUUID, &op)
	if code != 0 {
		return nil, fmt.Errorf("CUDA device %d: %w", ordinal, d.err(C.GoString(op), code))
	}
	g.name = fmt.Sprintf("%s (GPU %d)", C.GoString(&name[0]), ordinal)
	g.hwTotal = int64(total)
	var why error
	if hasUUID == 0 {
		why = errors.New("the driver exports no cuDeviceGetUuid_v2 to match it with NVML")
	} else {
		var u [16]byte
		for i := range u {
			u[i] = byte(uuid[i])
		}
		g.mem, why = openMemReader(u)
	}
	if why != nil {
		log.Warn("under MPS the server holds a CUDA context on this GPU, to read its free memory: a kernel fault in any function may then take the GPU until the server restarts (its MPS server waits for every client to exit, this one too)",
			"device", g.name, "reason", why.Error())
		return openGPU(d, ordinal, limit, log)
	}
	log.Info("CUDA device opened", "device", g.name, "memory", g.hwTotal,
		"budget", limit, "driver_cuda_version", versionString(d.version),
		"context", "none: its functions run in MPS worker processes; free memory from NVML")
	return g, nil
}

// streamPriority is the stream priority of an instance of a function of
// priority class (abi.Manifest.Priority): latency the greatest, batch the
// least, default midway. Where several functions' kernels share a context
// (a tenant's worker) the GPU then prefers a latency function's waiting
// kernels, as the device scheduler orders their runs; the driver does not
// preempt running work for it nor order copies by it, and time-slices
// separate contexts whatever their streams' priorities.
func (g *GPU) streamPriority(class string) int {
	switch class {
	case abi.PriorityLatency:
		return g.prioGreatest
	case abi.PriorityBatch:
		return g.prioLeast
	}
	return g.prioLeast + (g.prioGreatest-g.prioLeast)/2
}

// openAll is a Kind's Open of every visible GPU by open (openGPUs, or
// openBareGPUs), through the driver named ("": libcuda).
func openAll(open func(string, int64, *slog.Logger) ([]*GPU, error)) func(string, int64, *slog.Logger) ([]Device, error) {
	return func(driver string, limit int64, log *slog.Logger) ([]Device, error) {
		if driver == "" {
			driver = libcuda
		}
		gpus, err := open(driver, limit, log)
		if err != nil {
			return nil, err
		}
		devs := make([]Device, len(gpus))
		for i, g := range gpus {
			devs[i] = g
		}
		return devs, nil
	}
}

func init() {
	Register(Kind{Target: abi.TargetCUDA, Name: "CUDA",
		Open: openAll(openGPUs),
		OpenOne: func(ordinal int, limit int64, driver string, log *slog.Logger) (Device, error) {
			if driver == "" {
				driver = libcuda
			}
			g, err := openOneGPU(driver, ordinal, limit, log)
			if err != nil {
				return nil, err // not a nil *GPU in a non-nil Device
			}
			return g, nil
		},
		OpenBare: openAll(openBareGPUs),
		// Four runs at once, one kept for light functions: a run is
		// mostly the GPU's, and copies overlap another's kernels.
		Runs:    func() int { return 4 },
		Reserve: func(int) int { return 1 },
		// A run's events time a span of its stream, and other runs'
		// kernels fall inside it (other contexts' while contexts
		// time-slice, other streams' in one): runs in flight together
		// split the GPU's time for charging (sched.Config.Capacity).
		SharedTime: 1,
		// Workers register their slots (cuMemHostRegister): pinned whole.
		PinsHost: true,
		// Graphs replay by shape: a batch is padded to the full batch.
		PadBatches: true,
		MPS:        true,
		// Each standby worker holds a CUDA context.
		StandbyFloor: 1, StandbyCeiling: 4,
	})
}

func (g *GPU) Target() string { return abi.TargetCUDA }

// Load loads a bundle into this process, on this GPU.
func (g *GPU) Load(ctx context.Context, spec ProgramSpec) (Program, error) {
	if err := g.usable(); err != nil {
		return nil, err
	}
	return loadProgram(ctx, g, spec)
}
func (g *GPU) Name() string { return g.name }

// Ordinal is the device's index among the visible CUDA devices.
func (g *GPU) Ordinal() int { return g.ordinal }

// DriverVersion is the CUDA version the driver supports, e.g. "12.4".
func (g *GPU) DriverVersion() string { return versionString(g.drv.version) }

// GraphStats counts how this device's chains ran, over all instances.
func (g *GPU) GraphStats() GraphStats { return g.graphs.load() }

func (g *GPU) Health() error {
	if f := g.fault.Load(); f != nil {
		return f
	}
	if g.closed.Load() {
		return fmt.Errorf("%s: %w: closed", g.name, ErrUnhealthy)
	}
	return nil
}

// poisoned reports whether GPU calls must be skipped.
func (g *GPU) poisoned() bool { return g.fault.Load() != nil }

// check turns a CUresult into an error, marking the device unhealthy when
// the error ends the context (sticky, or the MPS server lost).
func (g *GPU) check(op string, code C.CUresult) error {
	if code == 0 {
		return nil
	}
	de := g.drv.err(op, code)
	if de.EndsContext() {
		return g.poison(de)
	}
	return de
}

func (g *GPU) poison(de *DriverError) *DeviceFault {
	f := &DeviceFault{Device: g.name, Err: de}
	if g.fault.CompareAndSwap(nil, f) {
		g.log.Error("GPU unhealthy: a CUDA error that ends this process's context (sticky, or its MPS server lost), restart the process to use it again",
			"device", g.name, "err", de.Error())
		return f
	}
	return g.fault.Load()
}

func (g *GPU) total() int64 {
	if g.limit > 0 && g.limit < g.hwTotal {
		return g.limit
	}
	return g.hwTotal
}

// reserve charges n bytes against the budget before the driver is asked, so
// that concurrent allocations cannot overshoot it together.
func (g *GPU) reserve(n int64) error {
	if n < 0 {
		return fmt.Errorf("%s: allocation of %d bytes", g.name, n)
	}
	for {
		u := g.used.Load()
		if g.limit > 0 && u+n > g.limit {
			return fmt.Errorf("%s: %w: %d bytes in use, %d more requested, budget %d",
				g.name, ErrOutOfMemory, u, n, g.limit)
		}
		if g.used.CompareAndSwap(u, u+n) {
			return nil
		}
	}
}

func (g *GPU) MemInfo() MemInfo {
	used := g.used.Load()
	total := g.total()
	free := total - used
	if g.mem != nil {
		// Opened bare: no context, so nothing to poison; a failed read
		// leaves the budget's figures.
		if !g.closed.Load() {
			if hwFree, t, err := g.mem.memInfo(); err == nil {
				if g.limit <= 0 || t < g.limit {
					total = t
					free = hwFree
				} else if hwFree < free {
					free = hwFree
				}
			} else if g.memWarned.CompareAndSwap(false, true) {
				g.log.Warn("cannot read the GPU's free memory; its budget stands in (said once)", "device", g.name, "error", err.Error())
			}
		}
	} else if !g.poisoned() && !g.closed.Load() {
		var f, t C.size_t
		if code := C.plcu_mem_info(g.drv.c, g.ctx, &f, &t); code == 0 {
			hwFree := int64(f)
			if g.limit <= 0 || int64(t) < g.limit {
				total = int64(t)
				free = hwFree
			} else if hwFree < free {
				free = hwFree
			}
		} else if de := g.drv.err("cuMemGetInfo_v2", code); de.Sticky() {
			// Only a sticky error poisons here, not a lost MPS server
			// (check's other case): a server whose functions run in
			// worker processes may hold a context for this read alone
			// (no NVML under MPS), and its workers, each with a
			// connection of its own, go on once the MPS server is back.
			// The budget's figures stand in meanwhile.
			g.poison(de)
		}
	}
	if free < 0 {
		free = 0
	}
	return MemInfo{Total: total, Free: free, Used: used}
}

func (g *GPU) Close() error {
	if !g.closed.CompareAndSwap(false, true) {
		return nil
	}
	if g.ctx == nil { // opened bare: no context retained to release
		if g.mem != nil {
			g.mem.close()
		}
		return nil
	}
	// Released even after a fault: it only drops Open's reference, and the
	// context goes away only with the last one (the bundles' cudart hold
	// theirs), so this never frees memory that instances still use.
	code := C.plcu_device_close(g.drv.c, g.dev)
	if code != 0 && !g.poisoned() {
		return g.drv.err("cuDevicePrimaryCtxRelease_v2", code)
	}
	return nil
}

// RegisterHost pins b where it is, for every context (a worker's slot, once
// per slot): runs in place copy straight between it and the GPU. b must
// stay mapped until it is unregistered (UnregisterHost: a tenant's worker
// unloading a program) or the process ends.
func (g *GPU) RegisterHost(b []byte) error {
	if err := g.usable(); err != nil {
		return err
	}
	if len(b) == 0 {
		return nil
	}
	return g.check("cuMemHostRegister_v2", C.plcu_host_register(g.drv.c, g.ctx, unsafe.Pointer(&b[0]), C.size_t(len(b))))
}

// UnregisterHost undoes RegisterHost for b, which must then not be run on
// in place: for memory a process is done with (a benchmark's buffers, the
// pool slots of a program a tenant's worker unloaded).
func (g *GPU) UnregisterHost(b []byte) error {
	if err := g.usable(); err != nil {
		return err
	}
	if len(b) == 0 {
		return nil
	}
	return g.check("cuMemHostUnregister", C.plcu_host_unregister(g.drv.c, g.ctx, unsafe.Pointer(&b[0])))
}

// copyProbe times iters plain synchronous copies of b (pinned: registered
// with RegisterHost) to a device allocation of its size, then iters back:
// the floor BenchmarkCopy sets Run's copies beside, timed on the host.
func (g *GPU) copyProbe(b []byte, iters int) (in, out time.Duration, err error) {
	if err := g.usable(); err != nil {
		return 0, 0, err
	}
	if len(b) == 0 || iters <= 0 {
		return 0, 0, nil
	}
	var nsIn, nsOut C.int64_t
	var op *C.char
	code := C.plcu_copy_probe(g.drv.c, g.ctx, unsafe.Pointer(&b[0]), C.size_t(len(b)), C.int(iters), &nsIn, &nsOut, &op)
	if err := g.check(C.GoString(op), code); err != nil {
		return 0, 0, err
	}
	return time.Duration(nsIn), time.Duration(nsOut), nil
}

// usable is nil when the GPU may be touched.
func (g *GPU) usable() error {
	if f := g.fault.Load(); f != nil {
		return f
	}
	if g.closed.Load() {
		return fmt.Errorf("%s: closed", g.name)
	}
	if g.ctx == nil {
		return fmt.Errorf("%s: opened without a CUDA context (under MPS its functions run in worker processes): nothing runs on it in this process", g.name)
	}
	return nil
}

type gpuConstants struct {
	g    *GPU
	ptr  C.CUdeviceptr
	size int64
	once sync.Once
}

func (c *gpuConstants) Size() int64 { return c.size }

func (c *gpuConstants) Free() {
	c.once.Do(func() {
		if !c.g.poisoned() && !c.g.closed.Load() {
			c.g.check("cuMemFree_v2", C.plcu_free(c.g.drv.c, c.g.ctx, c.ptr))
		}
		c.ptr = 0
		c.g.used.Add(-c.size)
	})
}

func (g *GPU) LoadConstants(r io.Reader, size int64) (Constants, error) {
	if err := g.usable(); err != nil {
		return nil, err
	}
	if err := g.reserve(size); err != nil {
		return nil, fmt.Errorf("constants: %w", err)
	}
	var p C.CUdeviceptr
	if err := g.check("cuMemAlloc_v2", C.plcu_alloc(g.drv.c, g.ctx, C.size_t(size), &p)); err != nil {
		g.used.Add(-size)
		return nil, fmt.Errorf("%s: constants: %w", g.name, err)
	}
	c := &gpuConstants{g: g, ptr: p, size: size}
	if size == 0 {
		return c, nil
	}
	chunk := min(size, constantsChunk)
	var h unsafe.Pointer
	if err := g.check("cuMemHostAlloc", C.plcu_host_alloc(g.drv.c, g.ctx, C.size_t(chunk), &h)); err != nil {
		c.Free()
		return nil, fmt.Errorf("%s: constants staging: %w", g.name, err)
	}
	defer func() {
		if !g.poisoned() {
			C.plcu_host_free(g.drv.c, g.ctx, h)
		}
	}()
	buf := unsafe.Slice((*byte)(h), chunk)
	for off := int64(0); off < size; {
		n := min(chunk, size-off)
		if _, err := io.ReadFull(r, buf[:n]); err != nil {
			c.Free()
			return nil, fmt.Errorf("read constants: %w", err)
		}
		code := C.plcu_htod(g.drv.c, g.ctx, p+C.CUdeviceptr(off), h, C.size_t(n))
		if err := g.check("cuMemcpyHtoD_v2", code); err != nil {
			c.Free()
			return nil, fmt.Errorf("%s: upload constants: %w", g.name, err)
		}
		off += n
	}
	return c, nil
}

// hookResult turns what a hook left into an error: the bundle's message,
// a driver failure (which may poison the device), or nil.
func (g *GPU) hookResult(name string, msg *C.char, code C.CUresult, op *C.char, reached C.int) error {
	var kerr string
	if msg != nil {
		kerr = C.GoString(msg)
	}
	if code != 0 {
		if derr := g.check(C.GoString(op), code); derr != nil {
			err := fmt.Errorf("%s: %w", name, derr)
			if kerr != "" {
				err = fmt.Errorf("%s failed: %s: %w", name, unmarked(kerr), derr)
			}
			if fault, ok := derr.(*DeviceFault); ok && reached != 0 {
				// Met once the hook ran: its own, as a run's that
				// launched its chain. Met before (the driver calls that
				// set the hook up), it was other work's, and the bare
				// fault says so.
				return &kernelFault{ke: &KernelError{Msg: err.Error()}, fault: fault}
			}
			return err
		}
	}
	if kerr != "" {
		return hookError(name, kerr)
	}
	return nil
}

func (g *GPU) programHook(e *Entries, k hookKind, c Constants, program unsafe.Pointer) (unsafe.Pointer, error) {
	fn, name := e.hookFn(k)
	if fn == nil {
		return program, nil
	}
	if err := g.usable(); err != nil {
		return program, err
	}
	var cptr C.CUdeviceptr
	var clen C.size_t
	if gc, ok := c.(*gpuConstants); ok && gc != nil {
		cptr, clen = gc.ptr, C.size_t(gc.size)
	}
	var code C.CUresult
	var op *C.char
	defer onThread()()
	var reached C.int
	msg := C.plcu_program_hook(g.drv.c, g.ctx, fn, e.lastErrorFn(), cptr, clen, &program, &code, &op, &reached)
	return program, g.hookResult(name, msg, code, op, reached)
}

// openOneGPU opens CUDA device ordinal, and no other, through the driver
// library at driver.
func openOneGPU(driver string, ordinal int, limit int64, log *slog.Logger) (*GPU, error) {
	d, err := loadDriver(driver)
	if err != nil {
		return nil, err
	}
	if code := C.plcu_init(d.c); code != 0 {
		return nil, fmt.Errorf("CUDA driver %s: %w", driver, d.err("cuInit", code))
	}
	return openGPU(d, ordinal, limit, log)
}
