package engine

import (
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/ioshare"
	"github.com/plover-run/plover/sched"
)

// The server's own I/O on functions' bytes, shared as their device time is
// (package ioshare): a function's flow there has its current version's
// share and priority, and what its pieces cost the server's CPU is charged
// to its runs on every device too, so that a function that costs the
// server more gets fewer turns there.

// newIO makes the node's I/O shares: scheduled unless the device
// schedulers are off (plover serve --sched off moves bytes as they come),
// with a slot kept for light functions unless the devices keep none, and
// none by the touches of a function flooding its devices (flooding).
func newIO(e *Engine, sc SchedConfig, flooding func(name string) bool) *ioshare.Shares {
	cfg := sc.IO
	cfg.Off = cfg.Off || sc.Off
	cfg.NoReserve = cfg.NoReserve || sc.NoReserve
	if cfg.Policy == "" {
		cfg.Policy = sc.Policy
	}
	if cfg.Recent == 0 {
		cfg.Recent = sc.ReserveHold
	}
	cfg.Charge = e.chargeIO
	if cfg.Flooding == nil {
		cfg.Flooding = flooding
	}
	return ioshare.New(cfg)
}

// IO is name's share of the server's I/O, or nil for a name this node has
// no record of (its request fails before a body is read). It reads no
// store: a transport asks once Admit or Invoke met the name.
func (e *Engine) IO(name string) *ioshare.Flow {
	return e.ioOf(e.tab.peek(name))
}

// ioOf is IO for function f at version v, as a request found them. The
// flow is f's own, kept on it: by name, a request of a function deleted
// and deployed again since it found it would take the new function's
// flow, give it the deleted version's share and charge its pieces to it.
// A flow is made only while f holds its name: one made after a delete's
// Forget would pass its I/O time, and the share charged with it, to the
// name's next function.
func (e *Engine) ioOf(f *function, v *version) *ioshare.Flow {
	if v == nil {
		return nil
	}
	fl := f.io.Load()
	if fl == nil && !e.tab.kept(f, func() { fl = e.io.Flow(f.name); f.io.Store(fl) }) { // the function's own name: the flows' key
		return nil
	}
	fl.Set(shareOf(v.rec))
	return fl
}

// shareOf is the weight and class a version's record gives its function's
// flows, device and I/O: its manifest's share and priority.
func shareOf(rv api.Version) (float64, sched.Class) {
	class, _ := sched.ParseClass(rv.Priority) // checked at deploy
	weight := rv.Share
	if weight <= 0 {
		weight = 1
	}
	return weight, class
}

// chargeIO charges the runs of fl's function on every device it has run
// on with cpu, the server's CPU time on its bytes (sched.Flow.Charge), and
// reports whether there was one: a device flow is made by a first run,
// which comes after its first body (ioshare keeps the charge owed until
// then). A pipeline runs nothing of its own: its first step's function,
// which reads its body, pays for its bytes. Only while fl is still its
// function's, checked and charged under the table's lock, which a delete
// forgets the name's flows under: a charge on its way as the function is
// deleted and deployed anew must not reach the new function's flows. The
// flows are charged after the lock (a request's lookup waits on it): one
// its function's delete forgot meanwhile is charged to nobody's harm.
func (e *Engine) chargeIO(fl *ioshare.Flow, cpu time.Duration) bool {
	var flows []*sched.Flow
	e.tab.ioOwned(fl, func(look func(string) *version) {
		flows = e.deviceFlows(fl.Name(), flows)
		if len(flows) == 0 {
			if first := firstStep(fl.Name(), look); first != "" {
				flows = e.deviceFlows(first, flows)
			}
		}
	})
	for _, f := range flows {
		f.Charge(cpu)
	}
	return len(flows) > 0
}

// deviceFlows appends name's flows on the devices' schedulers to out.
func (e *Engine) deviceFlows(name string, out []*sched.Flow) []*sched.Flow {
	for _, s := range e.scheds {
		if fl := s.Lookup(name); fl != nil {
			out = append(out, fl)
		}
	}
	return out
}

// IOTime is the server's CPU time on name's bytes so far
// (plover_io_seconds_total), none for a name without a flow here: what a
// worker's CPU weight cannot see of its function's cost (worker.CPUGroups's
// Consult).
func (e *Engine) IOTime(name string) time.Duration {
	return time.Duration(e.ioSeconds(name) * float64(time.Second))
}

// ioSeconds is the server's CPU time on name's bytes so far.
func (e *Engine) ioSeconds(name string) float64 {
	if fl := e.io.Lookup(name); fl != nil {
		return fl.Seconds()
	}
	return 0
}
