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
	"slices"
	"sync/atomic"
)

// maxCaptureFailures is how many failed captures turn graphs off for an
// instance. One is not enough: a capture can be invalidated by what other
// threads do to the same device at that moment (reported for syncs and
// implicitly synchronising calls), which says nothing about the chain.
const maxCaptureFailures = 3

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

// graphKey is what a cached graph is valid for: Run.ChainKey's promise
// covers the chain, and the entry points bake the lengths into the launches
// they make.
type graphKey struct {
	chain        uint64
	in, tmp, out int64
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
