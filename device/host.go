package device

/*
#cgo CFLAGS: -O2 -I${SRCDIR}/../abi
#include <stdlib.h>
#include "host_run.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/cgrouplimit"
)

// Host is the host device: "device memory" is 256-byte aligned C memory and a
// chain runs on the calling OS thread. It runs the same bundles' host builds
// and the same runtime paths as the CUDA device, so everything above the
// device layer is testable without a GPU.
type Host struct {
	used    atomic.Int64
	total   int64
	checked atomic.Bool // instances made from now on are checked
}

// FaultMark starts the line a checked worker writes when an access past a
// buffer kills it (host_run.h's PLOVER_FAULT_MARK): on stderr, and on its
// report pipe, whence alone the server takes it.
const FaultMark = "plover: checked mode: "

// EnableChecks makes the instances this device creates from now on
// checked: an access past the end of in, tmp or out is caught (see
// host_checked.c); the runs copy in and out instead of working in place.
// With reportFD not negative it also installs the handler that names the
// entry and buffer of a fault on a guard page before the fault kills the
// process, in a line on stderr and, unless reportFD is stderr, on
// reportFD (a worker's report pipe): for a worker process only, as it
// replaces the process's SIGSEGV and SIGBUS handlers (Go's among them).
func (h *Host) EnableChecks(reportFD int) error {
	if reportFD >= 0 && C.plover_checked_install(C.int(reportFD)) != 0 {
		return fmt.Errorf("checked mode: cannot install the fault handler")
	}
	h.checked.Store(true)
	return nil
}

// ChargeProcessCPU makes every later run's device time (Timing.Busy) its
// share of the process's CPU time, split equally among the runs in flight
// in it, rather than the CPU time of the thread that ran the chain: for a
// worker process, where the threads a chain starts are its function's work
// (on one thread's clock, a chain computing on eight would be charged an
// eighth of its time, and get eight times its share). Process-wide, for
// the process's life.
func (h *Host) ChargeProcessCPU() { C.plover_host_process_clock() }

// NewHost returns a host device whose memory budget is limit bytes; when
// limit is 0, the machine's RAM or, where less, seven eighths of what the
// process's cgroup may use (a pod's memory limit; the rest is the
// server's own: bodies, answers, logs).
func NewHost(limit int64) *Host {
	if limit <= 0 {
		var si syscall.Sysinfo_t
		if syscall.Sysinfo(&si) == nil {
			limit = int64(si.Totalram) * int64(si.Unit)
		}
		if g := cgrouplimit.Memory() / 8 * 7; g > 0 && (limit <= 0 || g < limit) {
			limit = g
		}
	}
	return &Host{total: limit}
}

func init() {
	Register(Kind{Target: abi.TargetHost, Name: "host", Fallback: true,
		Open: func(_ string, limit int64, _ *slog.Logger) ([]Device, error) { return []Device{NewHost(limit)}, nil },
		OpenOne: func(_ int, limit int64, _ string, _ *slog.Logger) (Device, error) {
			return NewHost(limit), nil
		},
		// Twice the CPUs: a run is also copies and a round trip to its
		// worker, so one run per CPU leaves CPUs idle between runs. Half
		// kept for light functions, so that floods have as many runs as
		// there are CPUs and an interactive function's run finds a CPU of
		// its own (with one of four kept, its p99 beside a compute-bound
		// flood was 3.1-3.6x alone on 2 CPUs; with half, 1.3-2.2x:
		// BENCHMARKS.md).
		Runs:    func() int { return 2 * cgrouplimit.CPUs() },
		Reserve: func(runs int) int { return runs / 2 },
		// While two functions want the CPUs, a run per CPU and one more:
		// a run past the CPUs slows the others, and nice levels do not
		// split CPUs by weight across them (a run alone on a CPU has it
		// whole). Spin at share 3 against share 1, 4 clients each, on 2
		// CPUs with nice levels: 0.57-0.60 of the work to share 3 with all
		// four runs, 0.73-0.74 with three, 0.75 with two, but two served
		// 10-17% fewer (BENCHMARKS.md, "Runs past the CPUs").
		SharedRuns: func() int { return cgrouplimit.CPUs() + 1 },
		// An idle worker is about 2 MiB, and 16 distinct functions waking
		// at once on 2 CPUs answered within 26 ms with 16 workers waiting
		// against 120 ms with one (BENCHMARKS.md).
		StandbyFloor: 8, StandbyCeiling: 16,
	})
}

func (h *Host) Target() string { return abi.TargetHost }
func (h *Host) Name() string {
	if n := cgrouplimit.CPUs(); n != 1 {
		return fmt.Sprintf("host (%s, %d CPUs)", runtime.GOARCH, n)
	}
	return "host (" + runtime.GOARCH + ", 1 CPU)"
}
func (h *Host) Health() error { return nil }

// Load loads a bundle into this process.
func (h *Host) Load(ctx context.Context, spec ProgramSpec) (Program, error) {
	return loadProgram(ctx, h, spec)
}
func (h *Host) Close() error { return nil }

func (h *Host) MemInfo() MemInfo {
	used := h.used.Load()
	return MemInfo{Total: h.total, Free: h.total - used, Used: used}
}

func (h *Host) alloc(n int64) (unsafe.Pointer, error) { return h.allocBuf(n, false) }

// allocBuf allocates an instance's buffer of n bytes: guarded (checked
// mode: its end against an inaccessible page), or plain.
func (h *Host) allocBuf(n int64, guarded bool) (unsafe.Pointer, error) {
	if n < 0 || n > int64(^uint(0)>>1) {
		return nil, fmt.Errorf("host alloc of %d bytes", n)
	}
	var p unsafe.Pointer
	if guarded {
		p = C.plover_guarded_alloc(C.size_t(n))
	} else {
		p = C.plover_host_alloc(C.size_t(n))
	}
	if p == nil {
		if guarded {
			return nil, fmt.Errorf("guarded host alloc of %d bytes: out of memory or of mappings", n)
		}
		return nil, fmt.Errorf("host alloc of %d bytes: out of memory", n)
	}
	h.used.Add(n)
	return p, nil
}

func (h *Host) freeBuf(p unsafe.Pointer, n int64, guarded bool) {
	if !guarded {
		h.free(p, n)
	} else if p != nil {
		C.plover_guarded_free(p, C.size_t(n))
		h.used.Add(-n)
	}
}

func (h *Host) free(p unsafe.Pointer, n int64) {
	if p != nil {
		C.plover_host_free(p, C.size_t(n))
		h.used.Add(-n)
	}
}

type hostConstants struct {
	h    *Host
	ptr  unsafe.Pointer
	size int64
}

func (c *hostConstants) Size() int64 { return c.size }
func (c *hostConstants) Free()       { c.h.free(c.ptr, c.size); c.ptr = nil }

func (h *Host) LoadConstants(r io.Reader, size int64) (Constants, error) {
	p, err := h.alloc(size)
	if err != nil {
		return nil, fmt.Errorf("constants: %w", err)
	}
	if _, err := io.ReadFull(r, unsafe.Slice((*byte)(p), size)); err != nil {
		h.free(p, size)
		return nil, fmt.Errorf("read constants: %w", err)
	}
	return &hostConstants{h: h, ptr: p, size: size}, nil
}

type hostInstance struct {
	h   *Host
	cfg InstanceConfig
	// C memory, so the per-request cgo call passes no Go pointers except the
	// input and output bytes: cgocheck walks every pointer it is given, and a
	// Go-held step table cost 3.5 µs a request.
	state   *C.plover_inst_state_t
	steps   *[abi.MaxChainLength]C.plover_step_t
	timing  *C.plover_timing_t
	bufs    [3]unsafe.Pointer // in, tmp, out
	checked bool              // bufs are guarded (host_checked.c)
}

func (h *Host) NewInstance(cfg InstanceConfig) (Instance, error) {
	st := (*C.plover_inst_state_t)(C.calloc(1, C.size_t(unsafe.Sizeof(C.plover_inst_state_t{}))))
	if st == nil {
		return nil, fmt.Errorf("host instance: out of memory")
	}
	inst := &hostInstance{h: h, cfg: cfg, state: st,
		steps:  (*[abi.MaxChainLength]C.plover_step_t)(C.calloc(abi.MaxChainLength, C.size_t(unsafe.Sizeof(C.plover_step_t{})))),
		timing: (*C.plover_timing_t)(C.calloc(1, C.size_t(unsafe.Sizeof(C.plover_timing_t{}))))}
	if inst.steps == nil || inst.timing == nil {
		inst.free()
		return nil, fmt.Errorf("host instance: out of memory")
	}
	inst.checked = h.checked.Load()
	for k, n := range []int64{cfg.MaxInput, cfg.Tmp, cfg.Out} {
		p, err := h.allocBuf(n, inst.checked)
		if err != nil {
			inst.free()
			return nil, fmt.Errorf("host instance: %w", err)
		}
		inst.bufs[k] = p // as they come, so free() releases exactly what exists
	}
	bufs := inst.bufs
	var cptr unsafe.Pointer
	var clen int64
	if c, ok := cfg.Constants.(*hostConstants); ok && c != nil {
		cptr, clen = c.ptr, c.size
	} else if cfg.Constants != nil {
		inst.free()
		return nil, fmt.Errorf("host instance: constants belong to another device")
	}
	C.plover_state_init(st, boolInt(cfg.Entries.abi1()), bufs[0], C.size_t(cfg.MaxInput), cptr, C.size_t(clen),
		bufs[1], C.size_t(cfg.Tmp), bufs[2], C.size_t(cfg.Out), nil, cfg.Entries.programPtr())
	if inst.checked {
		C.plover_checked_init(st, bufs[0], C.size_t(cfg.MaxInput), bufs[1], C.size_t(cfg.Tmp), bufs[2], C.size_t(cfg.Out))
	}
	if err := inst.hook(hookInstanceInit); err != nil {
		inst.free()
		return nil, err
	}
	st.base.instance = st.st.instance
	return inst, nil
}

func (i *hostInstance) DeviceBytes() int64 { return i.cfg.MaxInput + i.cfg.Tmp + i.cfg.Out }

// Close runs the bundle's plover_instance_fini, then frees the instance.
func (i *hostInstance) Close() {
	if i.state == nil {
		return
	}
	i.state.st = i.state.base
	// Documented: fini's failure is ignored. An overrun checked mode
	// finds in it is reported where the function's output goes (a
	// worker's stderr), as nothing else would show it.
	var ke *KernelError
	if err := i.hook(hookInstanceFini); errors.As(err, &ke) {
		fmt.Fprintln(os.Stderr, ke.Msg)
	}
	i.free()
}

// hook runs the instance's hook k. Checked, it runs under the fault
// handler and the patterns are checked after it, as after a chain's
// entries: an overrun there is named as one in a request is.
func (i *hostInstance) hook(k hookKind) error {
	if !i.checked {
		return i.cfg.Entries.hook(k, &i.state.st)
	}
	fn, name := i.cfg.Entries.hookFn(k)
	if fn == nil {
		return nil
	}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	defer onThread()()
	msg := C.plover_checked_hook(i.state, fn, cname, i.cfg.Entries.lastErrorFn())
	switch {
	case msg == nil:
		return nil
	case strings.HasPrefix(C.GoString(msg), FaultMark):
		return &KernelError{Msg: C.GoString(msg)}
	}
	return hookError(name, C.GoString(msg))
}

func (i *hostInstance) free() {
	if i.state == nil {
		return
	}
	for k, n := range []int64{i.cfg.MaxInput, i.cfg.Tmp, i.cfg.Out} {
		i.h.freeBuf(i.bufs[k], n, i.checked)
	}
	C.free(unsafe.Pointer(i.state))
	C.free(unsafe.Pointer(i.steps))
	C.free(unsafe.Pointer(i.timing))
	i.state, i.steps, i.timing = nil, nil, nil
}

func (i *hostInstance) Run(r *Run) error {
	if err := checkRun(r, i.cfg.MaxInput, i.cfg.Tmp, i.cfg.Out, len(i.steps)); err != nil {
		return err
	}
	table := i.cfg.Entries.table()
	for k, s := range r.Chain {
		fn, err := entryFn(table, s)
		if err != nil {
			return err
		}
		i.steps[k] = C.plover_step_t{fn: fn, grid: C.int32_t(s.Grid), block: C.int32_t(s.Block), name: table.name(s.Entry)}
	}
	var in, out unsafe.Pointer
	if len(r.Input) > 0 {
		in = unsafe.Pointer(&r.Input[0])
	}
	if len(r.Output) > 0 {
		out = unsafe.Pointer(&r.Output[0])
	}
	defer onThread()()
	msg := C.plover_host_run(i.state, in, C.size_t(len(r.Input)), out, C.size_t(len(r.Output)),
		C.size_t(r.TmpLen), C.uint32_t(r.Items), zeroFlags(r), &i.steps[0], C.int(len(r.Chain)), i.cfg.Entries.lastErrorFn(), i.timing)
	r.Timing = Timing{
		CopyIn:  time.Duration(i.timing.copy_in_ns),
		Kernels: time.Duration(i.timing.kernels_ns),
		CopyOut: time.Duration(i.timing.copy_out_ns),
		Copied:  int64(i.timing.copied),
		Busy:    time.Duration(i.timing.busy_ns),
	}
	if msg != nil {
		r.OutLen = 0
		return chainError(C.GoString(msg))
	}
	return outUsed(r, uint64(i.timing.out_used))
}

// outUsed records how much of the output the chain produced, refusing an
// out.len raised above the output's length.
func outUsed(r *Run, used uint64) error {
	if used > uint64(len(r.Output)) {
		r.OutLen = 0
		return &KernelError{Msg: fmt.Sprintf("an entry set s->out.len to %d, above the %d bytes of out (entries may only lower it)", used, len(r.Output))}
	}
	r.OutLen = int64(used)
	return nil
}

// hook calls the bundle's hook k, if it has one, on the calling thread
// (host target) and returns its plover_fail as a *KernelError.
func (e *Entries) hook(k hookKind, st *C.plover_state_t) error {
	fn, name := e.hookFn(k)
	if fn == nil {
		return nil
	}
	defer onThread()()
	if msg := C.plover_call_hook(fn, st, e.lastError); msg != nil {
		return hookError(name, C.GoString(msg))
	}
	return nil
}

// programHook runs plover_load or plover_unload (k) with the constants
// writable and s->program as program; it returns what the hook left there.
func (h *Host) programHook(e *Entries, k hookKind, c Constants, program unsafe.Pointer) (unsafe.Pointer, error) {
	if fn, _ := e.hookFn(k); fn == nil {
		return program, nil
	}
	st := (*C.plover_inst_state_t)(C.calloc(1, C.size_t(unsafe.Sizeof(C.plover_inst_state_t{}))))
	if st == nil {
		return program, fmt.Errorf("%s: out of memory", abi.SymLoad)
	}
	defer C.free(unsafe.Pointer(st))
	var cptr unsafe.Pointer
	var clen int64
	if hc, ok := c.(*hostConstants); ok && hc != nil {
		cptr, clen = hc.ptr, hc.size
	}
	C.plover_state_init(st, 0, nil, 0, cptr, C.size_t(clen), nil, 0, nil, 0, nil, program)
	err := e.hook(k, &st.st)
	return st.st.program, err
}
