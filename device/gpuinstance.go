package device

/*
#cgo CFLAGS: -I${SRCDIR}/../abi
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "cudadrv.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"slices"
	"time"
	"unsafe"
)

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
	if int64(len(cfg.Host)) >= SlotSize(cfg.MaxInput, cfg.Out) && len(cfg.Host) > 0 {
		host = unsafe.Pointer(&cfg.Host[0]) // not Go memory: C may keep it
	}
	code := C.plcu_inst_create(g.drv.c, g.ctx, C.size_t(cfg.MaxInput), C.size_t(cfg.Tmp),
		C.size_t(cfg.Out), cptr, clen, host, C.size_t(SlotOut(cfg.MaxInput)), boolInt(cfg.Entries.abi1()), cfg.Entries.programPtr(),
		C.int(g.streamPriority(cfg.Priority)), &ci, &op)
	if code != 0 {
		g.used.Add(-n)
		return nil, fmt.Errorf("%s: instance: %w", g.name, g.check(C.GoString(op), code))
	}
	ci.piece = C.size_t(g.copyPiece.Load())
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
	defer onThread()()
	var reached C.int
	msg := C.plcu_inst_hook(i.c, fn, i.cfg.Entries.lastErrorFn(), &code, &op, &reached)
	return i.g.hookResult(name, msg, code, op, reached)
}

func (i *gpuInstance) DeviceBytes() int64 { return i.cfg.MaxInput + i.cfg.Tmp + i.cfg.Out }

// streamPriority is the priority the driver gave the instance's stream.
func (i *gpuInstance) streamPriority() (int, error) {
	var p C.int
	if code := C.plcu_inst_stream_priority(i.c, &p); code != 0 {
		return 0, i.g.check("cuStreamGetPriority", code)
	}
	return int(p), nil
}

var _ HostPinner = (*gpuInstance)(nil)

// HostPinned reports whether the driver registered the instance's Host
// memory; false with no error when none was given.
func (i *gpuInstance) HostPinned() (bool, error) {
	if i.c.h_ext != 0 {
		return true, nil
	}
	if code := i.c.host_err; code != 0 {
		return false, i.g.drv.err("cuMemHostRegister_v2", code)
	}
	return false, nil
}

func (i *gpuInstance) Close() { i.closeFault() }

// closeFault closes i and returns its plover_instance_fini's fault where
// the hook faulted the device once it ran (OwnFault), else nil: fini's
// failure is otherwise ignored (documented).
func (i *gpuInstance) closeFault() error {
	if i.c == nil {
		return nil
	}
	// After a fault the context rejects everything; after the device's Close
	// it may be gone with its allocations. Either way: only free the C side.
	var err error
	skip := i.g.poisoned() || i.g.closed.Load()
	if !skip {
		if err = i.hook(hookInstanceFini); !OwnFault(err) {
			err = nil
		}
	}
	C.plcu_inst_destroy(i.c, boolInt(skip))
	i.c = nil
	i.g.used.Add(-i.DeviceBytes())
	return err
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
	key, mode, slot, err := i.plan(r)
	if err != nil {
		return err
	}
	var in, out unsafe.Pointer
	if len(r.Input) > 0 {
		in = unsafe.Pointer(&r.Input[0])
	}
	if len(r.Output) > 0 {
		out = unsafe.Pointer(&r.Output[0])
	}
	defer onThread()()
	C.plcu_run(i.c, in, C.size_t(len(r.Input)), out, C.size_t(len(r.Output)), C.size_t(r.TmpLen),
		C.uint32_t(r.Items), zeroFlags(r), C.int(len(r.Chain)), mode, C.int(slot), i.cfg.Entries.lastErrorFn())
	res := &i.c.res
	r.Timing = Timing{
		CopyIn:  time.Duration(res.t.copy_in_ns),
		Kernels: time.Duration(res.t.kernels_ns),
		CopyOut: time.Duration(res.t.copy_out_ns),
		Copied:  int64(res.t.copied),
		Busy:    time.Duration(res.t.busy_ns),
	}
	var kerr string
	if res.kernel_err != nil {
		kerr = C.GoString(res.kernel_err)
	}
	i.settleGraphs(r, key, mode, slot, kerr)
	return i.runError(r, kerr)
}

// plan puts r's chain in the instance's steps and picks how it runs: a
// kept graph replayed, a graph captured into a slot, or the entries
// called directly.
func (i *gpuInstance) plan(r *Run) (graphKey, C.int, int, error) {
	table := i.cfg.Entries.table()
	for k, s := range r.Chain {
		fn, err := entryFn(table, s)
		if err != nil {
			return graphKey{}, 0, 0, err
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
	return key, mode, slot, nil
}

// settleGraphs counts how the run ran (its result in i.c.res, the chain's
// own error kerr) and keeps, drops or nominates its graph accordingly.
func (i *gpuInstance) settleGraphs(r *Run, key graphKey, mode C.int, slot int, kerr string) {
	res := &i.c.res
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
}

// runError is the run's outcome (its result in i.c.res, the chain's own
// error kerr): a driver error, the device's fault, the chain's failure or
// refusal, or its output length checked.
func (i *gpuInstance) runError(r *Run, kerr string) error {
	res := &i.c.res
	if res.err != 0 {
		de := i.g.drv.err(C.GoString(res.err_op), res.err)
		msg := de.Error()
		if kerr != "" {
			msg = unmarked(kerr) + "; " + msg
		}
		if de.EndsContext() {
			fault := i.g.poison(de)
			if res.reached == 0 {
				// Met before this run launched anything of its own: the
				// context was poisoned by other work (another instance's,
				// another program's in a tenant's worker), so the run is
				// refused as one that began on a poisoned device.
				return fault
			}
			return &kernelFault{ke: &KernelError{Msg: msg}, fault: fault}
		}
		return &KernelError{Msg: msg}
	}
	if kerr != "" {
		return chainError(kerr)
	}
	return outUsed(r, uint64(res.t.out_used))
}
