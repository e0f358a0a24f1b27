package engine

import (
	"time"

	"github.com/plover-run/plover/abi"
)

// policy is a version's pool policy: its manifest over the server defaults.
type policy struct {
	min, max, queue int
	idleTTL         time.Duration // <= 0: never release for idleness
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
	if d, ok := m.IdleTTLDuration(); ok {
		p.idleTTL = d
	}
	if p.min > p.max {
		p.min = p.max
	}
	return p
}
