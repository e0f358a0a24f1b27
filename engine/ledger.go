package engine

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/evict"
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
	tab       *table        // what may be evicted: the functions' versions
	evictor   evict.Evictor // picks what goes
	log       *slog.Logger
	evictions *evictionCounts

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
	versions  []evictedVersion
}

// evictedVersion is a function unloaded from dev, and the bytes of its
// constants there, as they were when it was taken.
type evictedVersion struct {
	funcVersion
	bytes int64
}

// evictedInstance holds a reference on its version, like a request, so the
// version is not torn down before the instance is closed.
type evictedInstance struct {
	in *instance
	v  *version
}

// instanceBytes is what one instance of m holds on its device.
func instanceBytes(m *abi.Manifest) int64 { return m.MaxInputBytes + m.TmpBytes + m.OutBytes }

// fitsDevice refuses a function whose constants (constSize bytes) and one
// instance need more than total, the whole memory of dev: no eviction can
// make that room, so it is the manifest's fault (422, naming the field)
// and no outage for a client to retry (503).
func fitsDevice(m *abi.Manifest, constSize int64, dev device.Device, total int64) *abi.FieldError {
	per := instanceBytes(m)
	if constSize+per <= total {
		return nil
	}
	of := fmt.Sprintf("more than the %d bytes of memory of %s (its memory, or --memory-limit)", total, dev.Name())
	if constSize > 0 {
		return &abi.FieldError{Field: "constants", Reason: fmt.Sprintf("%s is %d bytes; with one instance's buffers (max_input_bytes + tmp_bytes + out_bytes: %d bytes) the function needs %d bytes, %s", m.Constants, constSize, per, constSize+per, of)}
	}
	return &abi.FieldError{Field: "max_input_bytes + tmp_bytes + out_bytes", Reason: fmt.Sprintf("one instance's buffers are %d bytes, %s", per, of)}
}

// reserve makes need bytes available on dev for forV, where evicting,
// evicting what the Evictor picks among idle instances and functions with
// no instance and no request (idleOn). Memory of busy instances is never
// taken, and nothing is evicted when everything evictable would still not
// be enough. The returned func gives the reservation back once the
// allocation is done (or failed).
func (l *ledger) reserve(dev device.Device, need int64, forV *version, evicting bool) (func(), *shortage) {
	ev := eviction{dev: dev}
	var avail int64
	// Deferred: a panic in plan (MemInfo, the Evictor) after it took
	// victims still closes them, outside the lock (plan's defer first).
	defer func() { l.free(ev, need, avail) }()
	var back []evictedInstance
	s := l.plan(dev, need, forV, evicting, &ev, &back, &avail)
	for _, ei := range back {
		ei.v.pool.unevict(ei.in)
	}
	if s != nil {
		return nil, s
	}
	return func() {
		l.mu.Lock()
		l.pending[dev] -= need
		l.mu.Unlock()
	}, nil
}

// shortage is a reservation refused for room on dev: the bytes it needed,
// those available there (free, less other loads' reservations) and dev's
// total; inUse: idle functions held enough, but the Evictor or requests
// meanwhile left too little of it to take.
type shortage struct {
	dev                device.Device
	need, avail, total int64
	inUse              bool
}

// noRoom is the 503 of a function that no device had room for (short:
// each device's refusal, in the order tried). It names what the function
// needs and each device's size, not what is free there: that figure is
// what other tenants hold, which /healthz shows only to a token that may
// read the node (the ledger's figures: ls -o wide, /metrics).
func noRoom(name string, short []*shortage) error {
	if len(short) == 1 {
		s := short[0]
		if s.need > s.total {
			return errorf(errdefs.KindUnavailable, nil, "function %s needs %d bytes on %s, which has %d in all", name, s.need, s.dev.Name(), s.total)
		}
		why := ", and idle functions hold too little to make up the rest"
		if s.inUse {
			why = "; everything else is in use"
		}
		return errorf(errdefs.KindUnavailable, nil, "function %s needs %d bytes on %s (of %d in all), more than is free there now%s", name, s.need, s.dev.Name(), s.total, why)
	}
	each := make([]string, len(short))
	for i, s := range short {
		each[i] = fmt.Sprintf("%d bytes on %s (of %d in all)", s.need, s.dev.Name(), s.total)
	}
	return errorf(errdefs.KindUnavailable, nil, "function %s needs %s; no device of the node has that free or can make it by evicting idle functions", name, strings.Join(each, "; "))
}

// room is what dev has for a new reservation, given free (its MemInfo's):
// less what loads under way reserved, plus what evictions are freeing.
func (l *ledger) room(dev device.Device, free int64) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return free + l.freeing[dev] - l.pending[dev]
}

// pendingOn is the bytes reserved on dev for allocations under way: what
// dev must have free for all of them.
func (l *ledger) pendingOn(dev device.Device) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pending[dev]
}

// plan is reserve's part under l.mu: it counts need as pending unless it
// fails, and returns what to evict (counted freeing), the bytes dev had
// available and, when it fails, in back the instances it took and gives
// back. The lock is released by a defer: the device's MemInfo and the
// Evictor are called under it, and a panic there, recovered by a
// transport, must not lock every later load out.
func (l *ledger) plan(dev device.Device, need int64, forV *version, evicting bool, evp *eviction, backp *[]evictedInstance, availp *int64) *shortage {
	l.mu.Lock()
	defer l.mu.Unlock()
	defer func() { l.freeing[dev] += evp.bytes }() // what was taken, however plan ends
	ev := evp
	// MemInfo is read under the lock because pending must be consistent
	// with it; it is a query (cuMemGetInfo at most), never an allocation.
	mi := dev.MemInfo()
	avail := mi.Free + l.freeing[dev] - l.pending[dev]
	*availp = avail
	if avail < need {
		if !evicting || avail+l.reclaimable(dev, forV) < need {
			return &shortage{dev: dev, need: need, avail: max(avail, 0), total: mi.Total}
		}
		if !l.evictFor(need-avail, forV, ev) {
			// Nothing taken is closed for a reservation refused: the
			// instances go back to their pools (reserve), warm as they were.
			*backp = ev.instances
			ev.instances = nil
			ev.bytes = 0
			for _, fv := range ev.versions {
				ev.bytes += fv.bytes
			}
			return &shortage{dev: dev, need: need, avail: max(avail, 0), total: mi.Total, inUse: true}
		}
	}
	l.pending[dev] += need
	return nil
}

// evictFor takes into ev what the Evictor picks on ev.dev until ev frees
// want bytes, and reports whether it did. An instance is taken as it is
// picked (its function may then be left with none, and be offered whole),
// and can be given back; a whole function only once the room is certain,
// as its unloading cannot be undone: a reservation that failed after
// picking unloaded it for nothing (review G, LOW 6). Only where a
// request takes one of those functions between its pick and its taking
// (a miss, looked past) may the others picked with it be gone for a
// reservation refused after all.
func (l *ledger) evictFor(want int64, forV *version, ev *eviction) bool {
	var idle []evict.Idle
	var from, whole []idleRef
	var wholeBytes int64
	for missed := 0; ; {
		if ev.bytes+wholeBytes >= want {
			// The room is certain: the functions picked go now. One a
			// request took since it was picked is a miss: look again.
			all := true
			for _, r := range whole {
				if !l.take1(ev, r) {
					all = false
					missed++
				}
			}
			if all {
				return true
			}
			whole, wholeBytes = whole[:0], 0
			continue
		}
		// Gathered afresh each time: taking an instance may leave its
		// function with none, and so evictable as a whole.
		idle, from = l.idleOn(ev.dev, forV, ev, whole, idle[:0], from[:0])
		if len(idle) == 0 || missed > len(idle) {
			return false
		}
		i := l.evictor.Pick(idle)
		switch {
		case i < 0 || i >= len(idle):
			return false
		case from[i].in == nil:
			whole = append(whole, from[i])
			wholeBytes += idle[i].Bytes
		case l.take1(ev, from[i]):
			missed = 0
		default: // requests took it meanwhile: look again, but not forever
			missed++
		}
	}
}

// free closes what an eviction chose, outside the ledger's lock. Each
// victim's bytes leave freeing just before it is closed: from then on the
// device's own count shows them free, and they must not count twice.
func (l *ledger) free(ev eviction, need, avail int64) {
	unfree := func(n int64) {
		l.mu.Lock()
		l.freeing[ev.dev] -= n
		l.mu.Unlock()
	}
	for _, ei := range ev.instances {
		unfree(ei.in.bytes)
		ei.in.inst.Close()
		ei.v.pool.unref()
		l.evictions.instances.Add(1)
	}
	for _, fv := range ev.versions {
		// The bytes counted when it was taken: its placement may be gone
		// by now (its worker died), and they must leave freeing anyway.
		unfree(fv.bytes)
		fv.v.pool.retire()
		l.evictions.functions.Add(1)
		l.log.Info("evicted idle function", "function", fv.f.name, "device", ev.dev.Name(), "needed_bytes", need, "free_bytes", avail)
	}
}

// reclaimable is what evicting every idle instance (above min_instances)
// and then every function left without instances would free on dev.
func (l *ledger) reclaimable(dev device.Device, forV *version) int64 {
	var n int64
	for _, fv := range l.tab.versions(true) {
		v := fv.v
		if !v.loaded.Load() {
			continue
		}
		n += v.pool.reclaimable(dev, v.minInstances(), v != forV)
	}
	return n
}

// refsOn is how many references on v the eviction holds (one per instance
// of v it took).
func (ev *eviction) refsOn(v *version) int {
	n := 0
	for _, ei := range ev.instances {
		if ei.v == v {
			n++
		}
	}
	return n
}

// idleRef is where an evict.Idle came from: an instance of v, or v itself.
type idleRef struct {
	fv funcVersion
	in *instance // nil: the function's program
}

// idleOn appends to idle (and from) what could be freed on dev for forV:
// the idle instances there above each function's min_instances, and the
// loaded functions other than forV with constants there (so unloading
// them frees something), no instance, no request in flight and no
// min_instances, and none already picked whole (in whole). The
// references ev holds on versions whose instances it took are not
// requests: a function whose last instances ev took may go as a whole.
func (l *ledger) idleOn(dev device.Device, forV *version, ev *eviction, whole []idleRef, idle []evict.Idle, from []idleRef) ([]evict.Idle, []idleRef) {
	for _, fv := range l.tab.versions(true) {
		v := fv.v
		if !v.loaded.Load() { // policy is written by load
			continue
		}
		p := v.pool.placement(dev)
		var empty bool
		var last time.Time
		keep := v.minInstances()
		idle, from, empty, last = v.pool.idleOn(dev, keep, ev.refsOn(v), fv, idle, from)
		// Not a function min_instances keeps, even with no instance left
		// (one closed broken, its worker lost): reclaimable counts none.
		picked := slices.ContainsFunc(whole, func(r idleRef) bool { return r.fv.v == v })
		if v != forV && empty && p != nil && keep == 0 && !picked {
			if b := p.consts; b > 0 {
				idle = append(idle, evict.Idle{Function: fv.f.name, Bytes: b, LastUsed: last})
				from = append(from, idleRef{fv: fv})
			}
		}
	}
	return idle, from
}

// take1 takes what r names out of its pool or off the node into ev, if it
// is still idle (requests may have taken or ended it since idleOn looked),
// and reports whether it did. An instance goes with a reference on its
// version, released by free once the instance is closed.
func (l *ledger) take1(ev *eviction, r idleRef) bool {
	v := r.fv.v
	if r.in == nil {
		p := v.pool.placement(ev.dev)
		held := ev.refsOn(v)
		if p == nil || !l.tab.detach(r.fv.f, v, func() bool { return v.pool.evictEmpty(held) }) {
			return false
		}
		b := p.consts
		ev.versions = append(ev.versions, evictedVersion{r.fv, b})
		ev.bytes += b
		return true
	}
	if !v.pool.evict(r.in, v.minInstances()) {
		return false
	}
	ev.instances = append(ev.instances, evictedInstance{r.in, v})
	ev.bytes += r.in.bytes
	return true
}
