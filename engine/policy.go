package engine

import (
	"fmt"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/errdefs"
)

// policy is a version's pool policy: its manifest over the server defaults.
type policy struct {
	min, max, queue int
	idleTTL         time.Duration // < 0 (the server's --idle-ttl alone): never release for idleness
}

// sideTTL is the idle_ttl of a version pipelines pinned that is not
// current, when its own policy never releases: such a version serves
// pipelines alone and must not hold a worker and device memory for ever.
const sideTTL = 5 * time.Minute

// minInstances is the instances v keeps: none for a pinned version that is
// not current (its min_instances is for when it is the function's).
func (v *version) minInstances() int {
	if v.side.Load() {
		return 0
	}
	return v.policy.min
}

// idleTTL is how long v's idle instances, and v itself, are kept.
func (v *version) idleTTL() time.Duration {
	if v.side.Load() && v.policy.idleTTL <= 0 {
		return sideTTL
	}
	return v.policy.idleTTL
}

func (e *Engine) policyFor(m *abi.Manifest) policy {
	p := policy{min: e.cfg.MinInstances, max: e.cfg.MaxInstances, queue: e.cfg.MaxQueue, idleTTL: e.cfg.IdleTTL}
	if m.MinInstances > 0 {
		p.min = m.MinInstances
	}
	if m.MaxInstances > 0 {
		p.max = m.MaxInstances
	}
	if m.MaxQueue > 0 {
		p.queue = m.MaxQueue
	}
	switch d, ok := m.IdleTTLDuration(); {
	case ok && d > 0:
		p.idleTTL = d
	case ok:
		// 0 kept everything for good until deploys refused it (abi's
		// idleTTLAdmitted): a version stored with it is read as the docs
		// always said a manifest without one is, and the log says why
		// its instances now go.
		e.cfg.Log.Warn("idle_ttl 0 in a manifest stored before deploys refused it: the server's --idle-ttl applies", "function", m.Name, "idle_ttl", p.idleTTL)
	}
	if b := e.cfg.WorkerInstances; b > 0 && p.max > b {
		if m.MinInstances > b {
			// Stored before the bound refused it at deploy, or by a node
			// with a higher one: kept warm up to the bound, not past it.
			e.cfg.Log.Warn("min_instances over the instances one worker may hold: kept at the bound", "function", m.Name, "min_instances", m.MinInstances, "bound", b, "why", e.cfg.WorkerInstancesWhy)
		}
		p.max = b
	}
	if p.min > p.max {
		p.min = p.max
	}
	return p
}

// checkInstances refuses a manifest whose min_instances a worker could not
// hold (422): each instance holds a thread of its worker, and past the
// worker's task bound the Go runtime aborts it, every function in it
// with it, again at each restart.
func (e *Engine) checkInstances(m *abi.Manifest) error {
	if b := e.cfg.WorkerInstances; b > 0 && !m.IsPipeline() && m.MinInstances > b {
		return errorf(errdefs.KindInvalid, nil, "min_instances: %d is more than the %d instances one worker may hold on this node (%s): each holds a thread of its worker", m.MinInstances, b, e.cfg.WorkerInstancesWhy)
	}
	return nil
}

// instancesCapped is the warning a deploy of m answers with when its
// max_instances is over WorkerInstances, which it is served as (its
// further requests queue); "" when it is not.
func (e *Engine) instancesCapped(m *abi.Manifest) string {
	b := e.cfg.WorkerInstances
	if b <= 0 || m.IsPipeline() || m.MaxInstances <= b {
		return ""
	}
	return fmt.Sprintf("max_instances: %d is served as %d, the instances one worker may hold on this node (%s): requests past them queue", m.MaxInstances, b, e.cfg.WorkerInstancesWhy)
}
