package engine

import (
	"time"

	"github.com/plover-run/plover/sched"
)

// HuntRFFlow is the weight and class name's device flow has on the first
// scheduler that has one (ok false: none), for bug hunt rF's tests.
func (e *Engine) HuntRFFlow(name string) (weight float64, class sched.Class, ok bool) {
	for _, s := range e.scheds {
		if fl := s.Lookup(name); fl != nil {
			s.Flow(name) // takes the scheduler's lock: the reads below follow every Set
			return fl.Weight(), fl.Class(), true
		}
	}
	return 0, 0, false
}

// HuntRFChargeIO is chargeIO, for bug hunt rF's tests.
func (e *Engine) HuntRFChargeIO(name string, cpu time.Duration) bool { return e.chargeIO(name, cpu) }
