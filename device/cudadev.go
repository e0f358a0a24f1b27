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
	"slices"
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

// libcuda is the driver library's soname; the versioned name is the one the
// driver package installs everywhere (the unversioned link is dev-only).
const libcuda = "libcuda.so.1"

// maxCaptureFailures is how many failed captures turn graphs off for an
// instance. One is not enough: a capture can be invalidated by what other
// threads do to the same device at that moment (reported for syncs and
// implicitly synchronising calls), which says nothing about the chain.
const maxCaptureFailures = 3

// constantsChunk bounds the pinned staging LoadConstants uses: pinning is
// slow and scarce, and constants load once per function version.
const constantsChunk = 4 << 20

// ErrOutOfMemory marks an allocation refused by the device or by its budget.
var ErrOutOfMemory = errors.New("out of device memory")

// DriverError is a CUDA driver call that failed.
type DriverError struct {
	Op   string // the driver entry point, e.g. "cuStreamSynchronize"
	Code int    // the CUresult
	Name string // e.g. "CUDA_ERROR_ILLEGAL_ADDRESS"
	Desc string // the driver's description, may be empty
}

func (e *DriverError) Error() string {
	if e.Desc != "" {
		return fmt.Sprintf("%s: %s (%s)", e.Op, e.Name, e.Desc)
	}
	return e.Op + ": " + e.Name
}

// Sticky reports whether the error leaves the context unusable: after one,
// every later call in the process returns it again, and only a restart
// gives the GPU back.
func (e *DriverError) Sticky() bool { return stickyCode(e.Code) }

func (e *DriverError) Unwrap() error {
	if e.Code == 2 { // CUDA_ERROR_OUT_OF_MEMORY
		return ErrOutOfMemory
	}
	return nil
}

func stickyCode(code int) bool {
	switch code {
	case 700, // CUDA_ERROR_ILLEGAL_ADDRESS
		702, // CUDA_ERROR_LAUNCH_TIMEOUT
		710, // CUDA_ERROR_ASSERT
		714, // CUDA_ERROR_HARDWARE_STACK_ERROR
		715, // CUDA_ERROR_ILLEGAL_INSTRUCTION
		716, // CUDA_ERROR_MISALIGNED_ADDRESS
		717, // CUDA_ERROR_INVALID_ADDRESS_SPACE
		718, // CUDA_ERROR_INVALID_PC
		719, // CUDA_ERROR_LAUNCH_FAILED
		// Not kernel faults, but the context is as unusable after them:
		214, // CUDA_ERROR_ECC_UNCORRECTABLE
		220, // CUDA_ERROR_NVLINK_UNCORRECTABLE
		709, // CUDA_ERROR_CONTEXT_IS_DESTROYED
		4,   // CUDA_ERROR_DEINITIALIZED
		999: // CUDA_ERROR_UNKNOWN: nothing says it is safe to go on
		return true
	}
	return false
}

// DeviceFault is the error of a GPU whose context a sticky error poisoned.
// Health returns it, and so does every later call that would touch the GPU.
type DeviceFault struct {
	Device string
	Err    *DriverError
}

func (e *DeviceFault) Error() string {
	return fmt.Sprintf("%s: %v after %v; restart the process to use this GPU again", e.Device, ErrUnhealthy, e.Err)
}

func (e *DeviceFault) Unwrap() []error { return []error{ErrUnhealthy, e.Err} }

// kernelFault is what the Run that hit a sticky error returns: the request
// failed like any kernel failure (errors.As finds the *KernelError), and the
// device is gone (errors.Is(err, ErrUnhealthy)).
type kernelFault struct {
	ke    *KernelError
	fault *DeviceFault
}

func (e *kernelFault) Error() string   { return e.ke.Error() }
func (e *kernelFault) Unwrap() []error { return []error{e.ke, e.fault} }

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
	c := C.plcu_open(cpath, &msg[0], C.size_t(len(msg)))
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

// GraphStats counts how chains ran.
type GraphStats struct {
	Direct          uint64 // entry points called, no graph
	Captured        uint64 // chain captured into a new graph, then launched
	Replayed        uint64 // the cached graph launched; entry points not called
	CaptureFailures uint64 // capture or replay failed and the chain ran directly
}

type graphCounters struct {
	direct, captured, replayed, failures atomic.Uint64
}

func (c *graphCounters) load() GraphStats {
	return GraphStats{Direct: c.direct.Load(), Captured: c.captured.Load(),
		Replayed: c.replayed.Load(), CaptureFailures: c.failures.Load()}
}

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

	used          atomic.Int64
	fault         atomic.Pointer[DeviceFault]
	closed        atomic.Bool
	captureLogged atomic.Bool
	graphs        graphCounters
}

var _ Device = (*GPU)(nil)

// OpenCUDA opens every CUDA device visible to this process (as
// CUDA_VISIBLE_DEVICES filters them). limit is each device's memory budget
// in bytes, 0 for none. log may be nil.
func OpenCUDA(limit int64, log *slog.Logger) ([]*GPU, error) {
	return openGPUs(libcuda, limit, log)
}

func openGPUs(path string, limit int64, log *slog.Logger) ([]*GPU, error) {
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
		g, err := openGPU(d, i, limit, log)
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
	code := C.plcu_device_open(d.c, C.int(ordinal), &g.dev, &g.ctx, &name[0], C.int(len(name)), &total, &op)
	if code != 0 {
		return nil, fmt.Errorf("CUDA device %d: %w", ordinal, d.err(C.GoString(op), code))
	}
	g.name = fmt.Sprintf("%s (GPU %d)", C.GoString(&name[0]), ordinal)
	g.hwTotal = int64(total)
	log.Info("CUDA device opened", "device", g.name, "memory", g.hwTotal,
		"budget", limit, "driver_cuda_version", versionString(d.version))
	return g, nil
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
// the error is sticky.
func (g *GPU) check(op string, code C.CUresult) error {
	if code == 0 {
		return nil
	}
	de := g.drv.err(op, code)
	if de.Sticky() {
		return g.poison(de)
	}
	return de
}

func (g *GPU) poison(de *DriverError) *DeviceFault {
	f := &DeviceFault{Device: g.name, Err: de}
	if g.fault.CompareAndSwap(nil, f) {
		g.log.Error("GPU unhealthy: sticky CUDA error, restart the process to use it again",
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
	if !g.poisoned() && !g.closed.Load() {
		var f, t C.size_t
		if g.check("cuMemGetInfo_v2", C.plcu_mem_info(g.drv.c, g.ctx, &f, &t)) == nil {
			hwFree := int64(f)
			if g.limit <= 0 || int64(t) < g.limit {
				total = int64(t)
				free = hwFree
			} else if hwFree < free {
				free = hwFree
			}
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
	// Released even after a fault: it only drops Open's reference, and the
	// context goes away only with the last one (the bundles' cudart hold
	// theirs), so this never frees memory that instances still use.
	code := C.plcu_device_close(g.drv.c, g.dev)
	if code != 0 && !g.poisoned() {
		return g.drv.err("cuDevicePrimaryCtxRelease_v2", code)
	}
	return nil
}

// usable is nil when the GPU may be touched.
func (g *GPU) usable() error {
	if f := g.fault.Load(); f != nil {
		return f
	}
	if g.closed.Load() {
		return fmt.Errorf("%s: closed", g.name)
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

// graphKey is what a cached graph is valid for: Run.ChainKey's promise
// covers the chain, and the entry points bake the lengths into the launches
// they make.
type graphKey struct {
	chain        uint64
	in, tmp, out int64
}

type gpuInstance struct {
	g   *GPU
	c   *C.plcu_inst_t
	cfg InstanceConfig

	// cached[k] is the key of c.exec[k] (valid while that is not NULL),
	// used[k] when it last ran (a run counter: the least recently used
	// slot is replaced); candidates are keys whose last direct run went
	// cleanly, so their next run may capture (kernels are loaded and cudart
	// is initialised). Several, so that interleaved lengths (a batching
	// function's run sizes) each get recorded.
	cached          [C.PLCU_GRAPHS]graphKey
	used            [C.PLCU_GRAPHS]uint64
	runs            uint64
	candidates      [C.PLCU_GRAPHS]graphKey
	nextCandidate   int
	captureFailures int
	graphsOff       bool // captures kept failing here: direct launches only
	stats           graphCounters
}

func (g *GPU) NewInstance(cfg InstanceConfig) (Instance, error) {
	if err := g.usable(); err != nil {
		return nil, err
	}
	if cfg.MaxInput < 0 || cfg.Tmp < 0 || cfg.Out < 0 {
		return nil, fmt.Errorf("%s: instance sizes %d/%d/%d", g.name, cfg.MaxInput, cfg.Tmp, cfg.Out)
	}
	var cptr C.CUdeviceptr
	var clen C.size_t
	if cfg.Constants != nil {
		c, ok := cfg.Constants.(*gpuConstants)
		if !ok || c.g != g {
			return nil, fmt.Errorf("%s: instance: constants belong to another device", g.name)
		}
		if c.ptr == 0 {
			return nil, fmt.Errorf("%s: instance: constants were freed", g.name)
		}
		cptr, clen = c.ptr, C.size_t(c.size)
	}
	n := cfg.MaxInput + cfg.Tmp + cfg.Out
	if err := g.reserve(n); err != nil {
		return nil, fmt.Errorf("instance: %w", err)
	}
	var ci *C.plcu_inst_t
	var op *C.char
	var host unsafe.Pointer
	if int64(len(cfg.Host)) >= cfg.MaxInput+cfg.Out && len(cfg.Host) > 0 {
		host = unsafe.Pointer(&cfg.Host[0]) // not Go memory: C may keep it
	}
	code := C.plcu_inst_create(g.drv.c, g.ctx, C.size_t(cfg.MaxInput), C.size_t(cfg.Tmp),
		C.size_t(cfg.Out), cptr, clen, host, boolInt(cfg.Entries.abi1()), cfg.Entries.programPtr(), &ci, &op)
	if code != 0 {
		g.used.Add(-n)
		return nil, fmt.Errorf("%s: instance: %w", g.name, g.check(C.GoString(op), code))
	}
	inst := &gpuInstance{g: g, c: ci, cfg: cfg}
	if err := inst.hook(hookInstanceInit); err != nil {
		// No fini for an instance whose init failed.
		C.plcu_inst_destroy(ci, boolInt(g.poisoned()))
		g.used.Add(-n)
		return nil, err
	}
	return inst, nil
}

// hook runs an instance hook, if the bundle has it, and waits for it.
func (i *gpuInstance) hook(k hookKind) error {
	fn, name := i.cfg.Entries.hookFn(k)
	if fn == nil {
		return nil
	}
	var code C.CUresult
	var op *C.char
	msg := C.plcu_inst_hook(i.c, fn, i.cfg.Entries.lastErrorFn(), &code, &op)
	return i.g.hookResult(name, msg, code, op)
}

// hookResult turns what a hook left into an error: the bundle's message,
// a driver failure (which may poison the device), or nil.
func (g *GPU) hookResult(name string, msg *C.char, code C.CUresult, op *C.char) error {
	var kerr string
	if msg != nil {
		kerr = C.GoString(msg)
	}
	if code != 0 {
		if err := g.check(C.GoString(op), code); err != nil {
			if kerr != "" {
				return fmt.Errorf("%s failed: %s: %w", name, kerr, err)
			}
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	if kerr != "" {
		return &KernelError{Msg: name + " failed: " + kerr}
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
	msg := C.plcu_program_hook(g.drv.c, g.ctx, fn, e.lastErrorFn(), cptr, clen, &program, &code, &op)
	return program, g.hookResult(name, msg, code, op)
}

func (i *gpuInstance) DeviceBytes() int64 { return i.cfg.MaxInput + i.cfg.Tmp + i.cfg.Out }

func (i *gpuInstance) Close() {
	if i.c == nil {
		return
	}
	// After a fault the context rejects everything; after the device's Close
	// it may be gone with its allocations. Either way: only free the C side.
	skip := i.g.poisoned() || i.g.closed.Load()
	if !skip {
		_ = i.hook(hookInstanceFini) // documented: ignored
	}
	C.plcu_inst_destroy(i.c, boolInt(skip))
	i.c = nil
	i.g.used.Add(-i.DeviceBytes())
}

func (i *gpuInstance) Run(r *Run) error {
	if i.c == nil {
		return errors.New("cuda instance: closed")
	}
	if err := i.g.usable(); err != nil {
		return err
	}
	if err := checkRun(r, i.cfg.MaxInput, i.cfg.Tmp, i.cfg.Out, len(i.c.steps)); err != nil {
		return err
	}
	table := i.cfg.Entries.table()
	for k, s := range r.Chain {
		fn, err := entryFn(table, s)
		if err != nil {
			return err
		}
		i.c.steps[k] = C.plover_step_t{fn: fn, grid: C.int32_t(s.Grid), block: C.int32_t(s.Block)}
	}
	key := graphKey{chain: r.ChainKey, in: int64(len(r.Input)), tmp: r.TmpLen, out: int64(len(r.Output))}
	mode, slot := C.int(C.PLCU_DIRECT), -1
	if r.ChainKey != 0 && !i.graphsOff {
		if slot = i.graphSlot(key); slot >= 0 {
			mode = C.PLCU_REPLAY
		} else if slices.Contains(i.candidates[:], key) {
			mode, slot = C.PLCU_CAPTURE, i.victimSlot()
		}
	}
	var in, out unsafe.Pointer
	if len(r.Input) > 0 {
		in = unsafe.Pointer(&r.Input[0])
	}
	if len(r.Output) > 0 {
		out = unsafe.Pointer(&r.Output[0])
	}
	C.plcu_run(i.c, in, C.size_t(len(r.Input)), out, C.size_t(len(r.Output)), C.size_t(r.TmpLen),
		C.uint32_t(r.Items), zeroFlags(r), C.int(len(r.Chain)), mode, C.int(slot), i.cfg.Entries.lastErrorFn())
	res := &i.c.res
	r.Timing = Timing{
		CopyIn:  time.Duration(res.t.copy_in_ns),
		Kernels: time.Duration(res.t.kernels_ns),
		CopyOut: time.Duration(res.t.copy_out_ns),
	}
	var kerr string
	if res.kernel_err != nil {
		kerr = C.GoString(res.kernel_err)
	}

	switch res.ran {
	case C.PLCU_CAPTURE:
		i.count(&i.stats.captured, &i.g.graphs.captured)
		i.cached[slot] = key
		i.setCandidate(key, false)
		i.runs++
		i.used[slot] = i.runs
	case C.PLCU_REPLAY:
		i.count(&i.stats.replayed, &i.g.graphs.replayed)
		i.runs++
		i.used[slot] = i.runs
	default:
		i.count(&i.stats.direct, &i.g.graphs.direct)
		switch {
		case mode == C.PLCU_CAPTURE: // the capture failed: a clean direct run must come first again
			i.setCandidate(key, false)
		case mode == C.PLCU_DIRECT && r.ChainKey != 0 && res.err == 0 && kerr == "":
			i.setCandidate(key, true)
		}
	}
	if res.capture_op != nil && res.err == 0 {
		i.count(&i.stats.failures, &i.g.graphs.failures)
		// Only a chain that runs cleanly without a graph proves the graph was
		// the problem; a chain that fails either way is the bundle's.
		if kerr == "" {
			i.captureFailures++
			if i.captureFailures >= maxCaptureFailures {
				i.graphsOff = true
			}
			i.logCaptureFailure(res)
		}
	}

	if res.err != 0 {
		de := i.g.drv.err(C.GoString(res.err_op), res.err)
		msg := de.Error()
		if kerr != "" {
			msg = kerr + "; " + msg
		}
		ke := &KernelError{Msg: msg}
		if de.Sticky() {
			return &kernelFault{ke: ke, fault: i.g.poison(de)}
		}
		return ke
	}
	if kerr != "" {
		return &KernelError{Msg: kerr}
	}
	return outUsed(r, uint64(res.t.out_used))
}

// setCandidate adds key to the candidates (replacing the oldest) or
// removes it.
func (i *gpuInstance) setCandidate(key graphKey, on bool) {
	k := slices.Index(i.candidates[:], key)
	switch {
	case on && k < 0:
		i.candidates[i.nextCandidate] = key
		i.nextCandidate = (i.nextCandidate + 1) % len(i.candidates)
	case !on && k >= 0:
		i.candidates[k] = graphKey{}
	}
}

// graphSlot is the slot holding a graph recorded for key, or -1.
func (i *gpuInstance) graphSlot(key graphKey) int {
	for k := range i.cached {
		if i.c.exec[k] != nil && i.cached[k] == key {
			return k
		}
	}
	return -1
}

// victimSlot is where a new recording goes: an empty slot, else the least
// recently run graph's.
func (i *gpuInstance) victimSlot() int {
	v := 0
	for k := range i.cached {
		if i.c.exec[k] == nil {
			return k
		}
		if i.used[k] < i.used[v] {
			v = k
		}
	}
	return v
}

func (i *gpuInstance) count(inst, dev *atomic.Uint64) {
	inst.Add(1)
	dev.Add(1)
}

func (i *gpuInstance) logCaptureFailure(res *C.plcu_result_t) {
	if !i.g.captureLogged.CompareAndSwap(false, true) {
		return
	}
	attrs := []any{"device", i.g.name, "op", C.GoString(res.capture_op)}
	if res.capture_err != 0 {
		attrs = append(attrs, "err", i.g.drv.err(C.GoString(res.capture_op), res.capture_err).Error())
	}
	if res.capture_kernel_err != nil {
		attrs = append(attrs, "bundle_err", C.GoString(res.capture_kernel_err))
	}
	i.g.log.Warn(fmt.Sprintf("CUDA graph capture failed; the chain ran directly, and an instance "+
		"launches directly for good after %d failures (logged once per device)", maxCaptureFailures), attrs...)
}

// OpenOne opens one device: the host device, or CUDA device ordinal (and no
// other: a worker process serves one device and must not hold contexts on
// the rest) through the driver library at driver ("": libcuda.so.1). log
// may be nil.
func OpenOne(kind string, ordinal int, limit int64, driver string, log *slog.Logger) (Device, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	switch kind {
	case KindHost:
		return NewHost(limit), nil
	case KindCUDA:
		if driver == "" {
			driver = libcuda
		}
		d, err := loadDriver(driver)
		if err != nil {
			return nil, err
		}
		if code := C.plcu_init(d.c); code != 0 {
			return nil, fmt.Errorf("CUDA driver %s: %w", driver, d.err("cuInit", code))
		}
		return openGPU(d, ordinal, limit, log)
	}
	return nil, fmt.Errorf("device kind %q: want host or cuda", kind)
}
