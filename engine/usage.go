package engine

import (
	"slices"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/sched"
)

// processReporter is a program living in a process of its own.
type processReporter interface{ Process() device.ProcessStats }

// processes reports the processes v's programs live in (none in process).
func (v *version) processes() []api.WorkerInfo {
	var out []api.WorkerInfo
	for _, p := range v.pool.programs() {
		if r, ok := p.prog.(processReporter); ok {
			ps := r.Process()
			w := api.WorkerInfo{Device: p.dev.Name(), PID: ps.PID, RSSBytes: ps.RSSBytes, PSSBytes: ps.PSSBytes, Threads: ps.Threads}
			if ps.Programs > 1 { // said only of a shared process
				w.Programs = ps.Programs
			}
			out = append(out, w)
		}
	}
	return out
}

// batcher is v's batcher once it is loaded, else nil.
func (v *version) batcher() *batcher {
	if !v.loaded.Load() { // load writes batch before loaded
		return nil
	}
	return v.batch
}

// queueDepth is the requests waiting for vs, versions of one function:
// for an instance, for a batch, or for the device (its scheduler). Every
// version of a function runs in the function's one flow on a device
// (Engine.flow), so each flow counts once, not once per version placed
// there (a version pipelines pinned beside the current one).
func queueDepth(vs []*version) int {
	n := 0
	var flows []*sched.Flow // a few: one a device
	for _, v := range vs {
		n += v.pool.queued()
		if b := v.batcher(); b != nil {
			n += b.pendingCount()
		}
		for _, p := range v.pool.programs() {
			if p.flow != nil && !slices.Contains(flows, p.flow) {
				flows = append(flows, p.flow)
				n += p.flow.Waiting()
			}
		}
	}
	return n
}

// usage reports busy and idle instances and the device memory v holds.
func (v *version) usage() (busy, idle int, mem int64) {
	busy, idle, programs := v.pool.usage()
	if v.loaded.Load() { // manifest and constSize are written by load
		m := v.manifest
		mem = int64(busy+idle)*(m.MaxInputBytes+m.TmpBytes+m.OutBytes) + int64(programs)*v.constSize
	}
	return busy, idle, mem
}

// Flooding reports whether name has had two or more runs at once on one
// of this node's devices within d (sched.Flow.Flooding): what a worker's
// CPU weight cannot tell from its CPU time (worker.CPUGroups's Consult).
func (e *Engine) Flooding(name string, d time.Duration) bool {
	for _, s := range e.scheds {
		if fl := s.Lookup(name); fl != nil && fl.Flooding(d) {
			return true
		}
	}
	return false
}

// deviceTime is the device time name's runs held on this node's devices
// (seconds), and its part of the device time all functions used recently.
func (e *Engine) deviceTime(name string) (seconds, fraction float64) {
	var mine, all float64
	for _, s := range e.scheds {
		if fl := s.Lookup(name); fl != nil {
			seconds += fl.DeviceTime().Seconds()
			m, a := fl.Recent()
			mine, all = mine+m, all+a
		}
	}
	if all > 0 {
		fraction = min(1, mine/all)
	}
	return seconds, fraction
}
