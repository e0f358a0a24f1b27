package engine

import (
	"sync"
	"time"

	"github.com/plover-run/plover/device"
)

// ledger decides device memory. It chooses what to evict under its lock
// and the caller frees it after the lock is released: closing an instance
// or unloading a program is a device call, or with worker processes a
// process to stop, and no lock is held across those.
//
// pending is memory reserved for allocations under way (so that they run
// outside the lock without two reservations counting the same free
// memory); freeing is memory that evicted instances and functions hold
// until they are freed (so that it counts as free for later decisions).
type ledger struct {
	mu      sync.Mutex
	pending map[device.Device]int64
	freeing map[device.Device]int64
}

func newLedger() ledger {
	return ledger{pending: map[device.Device]int64{}, freeing: map[device.Device]int64{}}
}

// eviction is what one reservation evicts, to be freed outside the lock.
type eviction struct {
	dev       device.Device
	bytes     int64
	instances []evictedInstance
	versions  []funcVersion
}

// evictedInstance holds a reference on its version, like a request, so the
// version is not torn down before the instance is closed.
type evictedInstance struct {
	in *instance
	v  *version
}

// reserve makes need bytes available on dev for forV, evicting least
// recently used idle instances first and then least recently used
// functions with no instance and no request. Memory of busy instances is
// never taken, and nothing is evicted when everything evictable would
// still not be enough. The returned func gives the reservation back once
// the allocation is done (or failed).
func (e *Engine) reserve(dev device.Device, need int64, forV *version) (func(), error) {
	l := &e.mem
	l.mu.Lock()
	// MemInfo is read under the lock because pending must be consistent
	// with it; it is a query (cuMemGetInfo at most), never an allocation.
	mi := dev.MemInfo()
	avail := mi.Free + l.freeing[dev] - l.pending[dev]
	ev := eviction{dev: dev}
	if avail < need {
		if avail+e.reclaimable(dev, forV) < need {
			l.mu.Unlock()
			return nil, errorf(KindUnavailable, nil, "function %s needs %d bytes on %s, %d are free of %d, and idle functions hold too little to make up the rest",
				forV.fn.name, need, dev.Name(), max(avail, 0), mi.Total)
		}
		for avail+ev.bytes < need {
			if ei, ok := e.takeIdleInstance(dev); ok {
				ev.instances = append(ev.instances, ei)
				ev.bytes += ei.in.bytes
				continue
			}
			if fv, bytes, ok := e.idleFunction(dev, forV); ok && e.detach(fv.f, fv.v) {
				ev.versions = append(ev.versions, fv)
				ev.bytes += bytes
				continue
			}
			l.freeing[dev] += ev.bytes
			l.mu.Unlock()
			e.free(ev, need, avail)
			return nil, errorf(KindUnavailable, nil, "function %s needs %d bytes on %s, %d are free of %d; everything else is in use",
				forV.fn.name, need, dev.Name(), max(avail, 0), mi.Total)
		}
	}
	l.pending[dev] += need
	l.freeing[dev] += ev.bytes
	l.mu.Unlock()
	e.free(ev, need, avail)
	return func() {
		l.mu.Lock()
		l.pending[dev] -= need
		l.mu.Unlock()
	}, nil
}

// free closes what an eviction chose, outside the ledger's lock. Each
// victim's bytes leave freeing just before it is closed: from then on the
// device's own count shows them free, and they must not count twice.
func (e *Engine) free(ev eviction, need, avail int64) {
	unfree := func(n int64) {
		e.mem.mu.Lock()
		e.mem.freeing[ev.dev] -= n
		e.mem.mu.Unlock()
	}
	for _, ei := range ev.instances {
		unfree(ei.in.bytes)
		ei.in.inst.Close()
		ei.v.unref()
		e.evictions.instances.Add(1)
	}
	for _, fv := range ev.versions {
		if p := fv.v.placement(ev.dev); p != nil {
			unfree(p.prog.ConstantsBytes())
		}
		fv.v.retire()
		e.evictions.functions.Add(1)
		e.cfg.Log.Info("evicted idle function", "function", fv.f.name, "device", ev.dev.Name(), "needed_bytes", need, "free_bytes", avail)
	}
}

// reclaimable is what evicting every idle instance (above min_instances)
// and then every function left without instances would free on dev.
func (e *Engine) reclaimable(dev device.Device, forV *version) int64 {
	var n int64
	for _, fv := range e.current() {
		v := fv.v
		if !v.loaded.Load() {
			continue
		}
		v.mu.Lock()
		spare := v.live - v.policy.min
		for _, in := range v.idle {
			if spare > 0 && in.dev.dev == dev {
				n += in.bytes
				spare--
			}
		}
		if v != forV && v.policy.min == 0 && v.refs == 0 && len(v.idle) == v.live {
			for _, p := range v.placements {
				if p.dev == dev {
					n += p.prog.ConstantsBytes()
				}
			}
		}
		v.mu.Unlock()
	}
	return n
}

// takeIdleInstance removes the least recently used idle instance on dev
// from its pool (keeping every function's min_instances) and returns it
// with a reference on its version, for the caller to close and unref.
func (e *Engine) takeIdleInstance(dev device.Device) (evictedInstance, bool) {
	for {
		var victim *version
		var oldest time.Time
		for _, fv := range e.current() {
			v := fv.v
			if !v.loaded.Load() { // policy is written by load
				continue
			}
			v.mu.Lock()
			if v.live > v.policy.min { // min_instances hold even under memory pressure
				for _, in := range v.idle {
					if in.dev.dev == dev && (victim == nil || in.lastUsed.Before(oldest)) {
						victim, oldest = v, in.lastUsed
					}
				}
			}
			v.mu.Unlock()
		}
		if victim == nil {
			return evictedInstance{}, false
		}
		victim.mu.Lock()
		for i, in := range victim.idle {
			if in.dev.dev == dev && in.lastUsed.Equal(oldest) && victim.live > victim.policy.min && !victim.dead {
				victim.idle = append(victim.idle[:i], victim.idle[i+1:]...)
				victim.live--
				victim.refs++ // released by free once the instance is closed
				victim.mu.Unlock()
				return evictedInstance{in, victim}, true
			}
		}
		victim.mu.Unlock() // the pool changed meanwhile: look again
	}
}

// idleFunction finds the least recently used loaded function, other than
// except, with constants on dev (so unloading it frees something), no
// instance and no request in flight, and the bytes unloading it frees.
func (e *Engine) idleFunction(dev device.Device, except *version) (funcVersion, int64, bool) {
	var best funcVersion
	var bytes int64
	var oldest time.Time
	for _, fv := range e.current() {
		v := fv.v
		if v == except || !v.loaded.Load() {
			continue
		}
		p := v.placement(dev)
		if p == nil || p.prog.ConstantsBytes() == 0 {
			continue
		}
		v.mu.Lock()
		idle, last := v.live == 0 && v.refs == 0, v.lastUsed
		v.mu.Unlock()
		if idle && (best.v == nil || last.Before(oldest)) {
			best, oldest, bytes = fv, last, p.prog.ConstantsBytes()
		}
	}
	return best, bytes, best.v != nil
}
