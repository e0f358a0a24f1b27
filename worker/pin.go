package worker

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/worker/wire"
)

// Slots and pinned memory. A CUDA worker pins every slot it is given (an
// instance's own and the pool's) with cuMemHostRegister, which page-locks
// the whole range: its pages are resident and locked for the slot's life,
// however little of them a request touches, where a slot on the host
// device holds only the pages its bodies touched. So on a device that pins,
// the pool slots a node keeps are bounded by bytes (Options.PinLimit), and
// a worker's slots are left out of its resident-memory limit: they are the
// server's layout, not what its bundle keeps (max_host_memory_mb).
//
// A pin the driver refuses (a locked-memory limit, a mapping it cannot
// register) is counted and logged: runs on that slot are staged through
// the instance's own pinned buffers, their copies counted in
// Timing.Copied, instead of copied by the driver from pageable memory
// unseen.
//
// Whether a slot was pinned is the worker's word, which bundle code can
// forge (it can write the control channel, and pin or unpin the slot
// itself). So the count does not read it: on a device that pins, every
// slot a worker maps counts at its size from before it is handed over
// (a pool slot's reservation, checked against the limit) until it is let
// go of or its worker is gone, a refused one too; the refusals are
// counted and logged from the worker's word, for what they are.

// pinning is a device's pinned slot memory, over its workers.
type pinning struct {
	bytes   atomic.Int64 // slots pinned now
	refused atomic.Int64 // pins the driver refused, ever
}

// slotMem is what a worker holds of the server's slots: the bytes mapped
// (left out of its resident-memory limit) and of them those pinned, until
// it is gone; and the slots the server let go of within leaveMost, which
// the worker may still map.
type slotMem struct {
	mu             sync.Mutex
	mapped, pinned int64
	left           []leftSlot // oldest first
	gone, logged   bool       // logged: a refusal was logged for this worker
}

// leftSlot is a slot the server let go of: its size, and when.
type leftSlot struct {
	size int64
	at   time.Time
}

// A slot the server let go of stays in its worker's mapping a while: the
// worker unmaps an instance's own slot when it reads the instance's end,
// after the bundle's plover_instance_fini (on CUDA, after the instance's
// device memory is freed too), and a program's pool slots once its last
// instance has gone that way after an unload. Until then its pages are
// resident in the worker (on CUDA, pinned whole), where a watch would take
// them for the bundle's memory: on a loaded machine one took a closed
// instance's 128 MiB slot for it and killed its worker. Whether it is
// unmapped yet cannot be read from the worker's figures (on the host
// device a slot is resident only where requests touched it), so a let-go
// slot stays out of the limit for leaveMost after its drop, each on its
// own clock; a bundle's own shared memory can hide behind those bytes that
// long, and no longer.
const leaveMost = 10 * time.Second

// letGo takes size bytes out of the slots mapped at now, into those let
// go of unless the worker holds none of them (unmapped). Called with s.mu
// held, so that the list stays in the order of its times.
func (s *slotMem) letGo(size int64, unmapped bool, now time.Time) {
	s.mapped -= size
	s.leaving(now) // pruned, so that the list holds leaveMost's drops at most
	if !unmapped {
		s.left = append(s.left, leftSlot{size, now})
	}
}

// leaving is the bytes of the slots let go of within leaveMost of now.
// Called with s.mu held.
func (s *slotMem) leaving(now time.Time) int64 {
	i := 0
	for i < len(s.left) && now.Sub(s.left[i].at) >= leaveMost {
		i++
	}
	s.left = s.left[i:]
	var n int64
	for _, l := range s.left {
		n += l.size
	}
	return n
}

// Pinning reports the pinned memory of the device's slots: none on a
// device that pins nothing.
func (d *Device) Pinning() device.Pinning {
	if !device.PinsHost(d.Target()) {
		return device.Pinning{}
	}
	return device.Pinning{Bytes: d.pin.bytes.Load(), Limit: d.opts.PinLimit, Refused: d.pin.refused.Load()}
}

// pinCharge is what a slot of size bytes counts of the device's pinned
// memory for its life: all of it on a device that pins, whatever its
// worker says of the pin; nothing on one that pins nothing.
func (d *Device) pinCharge(size int64) int64 {
	if device.PinsHost(d.Target()) {
		return size
	}
	return 0
}

// reservePin reserves a pool slot's pinning (pinCharge) before the slot
// is made (pinSlot keeps it, unpinned releases it): always on a device
// that pins nothing, else while the device's pinned slots stay within
// Options.PinLimit.
func (d *Device) reservePin(size int64) bool {
	charge := d.pinCharge(size)
	if charge == 0 {
		return true
	}
	for {
		b := d.pin.bytes.Load()
		if d.opts.PinLimit > 0 && b+charge > d.opts.PinLimit {
			return false
		}
		if d.pin.bytes.CompareAndSwap(b, b+charge) {
			return true
		}
	}
}

// unpinned releases a reservation of a slot of size bytes not made.
func (d *Device) unpinned(size int64) { d.pin.bytes.Add(-d.pinCharge(size)) }

// maxPinWhy bounds a refusal's reason as logged: the worker's word.
const maxPinWhy = 256

// mapSlot accounts a slot of size bytes about to be handed to p's worker:
// from here, before the worker pins (touches) it, its bytes are not the
// bundle's (limitedRSS). dropSlot ends it.
func (p *proc) mapSlot(size int64) {
	p.slots.mu.Lock()
	p.slots.mapped += size
	p.slots.mu.Unlock()
	p.syncMemGroup() // raised before the worker can touch it
}

// pinSlot accounts a slot of size bytes p's worker mapped (what names it
// for the log), whose pin it reported as pin, and returns the bytes it
// counts as pinned until dropSlot (pinCharge; 0 once the worker is gone,
// whose end undid every pin). reserved: reservePin counted them already.
// The reply's pin is only logged and counted as a refusal: the count
// holds whatever the worker says.
func (p *proc) pinSlot(g *program, pin wire.Pin, size int64, what string, reserved bool) int64 {
	charge := p.d.pinCharge(size)
	s := &p.slots
	var pinned int64
	s.mu.Lock()
	first := pin.State == wire.PinRefused && !s.logged
	s.logged = s.logged || first
	switch {
	case !s.gone:
		s.pinned, pinned = s.pinned+charge, charge
		if !reserved {
			p.d.pin.bytes.Add(charge)
		}
	case reserved:
		p.d.pin.bytes.Add(-charge)
	}
	s.mu.Unlock()
	if pin.State == wire.PinRefused {
		p.d.pin.refused.Add(1)
	}
	if first { // logged outside the lock, which the watch takes
		why := pin.Why
		if len(why) > maxPinWhy {
			why = why[:maxPinWhy] + "..."
		}
		p.d.opts.Log.Warn("the device refused to pin a slot: its requests' copies are staged through the instance's buffers",
			"function", g.name, "pid", p.pid, "slot", what, "bytes", size, "reason", strings.ToValidUTF8(why, "?"))
	}
	return pinned
}

// dropSlot undoes mapSlot and pinSlot for a slot the server let go of (an
// instance's, closed, or one its worker never took): size bytes mapped,
// pinned of them pinned. unmapped: the worker's reply says it holds none of
// it (it refused the slot, or dropped it before answering); otherwise the
// slot stays out of the limit for leaveMost.
func (p *proc) dropSlot(size, pinned int64, unmapped bool) {
	s := &p.slots
	s.mu.Lock()
	s.letGo(size, unmapped, time.Now())
	if !s.gone {
		s.pinned -= pinned
		p.d.pin.bytes.Add(-pinned)
	}
	s.mu.Unlock()
	p.syncMemGroup() // lowered, no further than the group holds (memGroupLower): the worker may unmap it later
}

// unpin gives back what the worker pinned, once it is gone: the process's
// end undoes every registration.
func (p *proc) unpin() {
	s := &p.slots
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gone = true
	p.d.pin.bytes.Add(-s.pinned)
	s.pinned = 0
}

// limitedRSS is the resident memory a worker's limit counts, from a
// sample read at read: rss less the server's slots it maps and those let
// go of within leaveMost, as far as its shared memory (where they are)
// holds them; a bundle's own shared memory past that still counts.
func (p *proc) limitedRSS(rss, shmem int64, read time.Time) int64 {
	s := &p.slots
	s.mu.Lock()
	slots := s.mapped + s.leaving(read)
	s.mu.Unlock()
	return rss - min(max(shmem, 0), slots)
}

// mappedSlots is the bytes of the server's slots p's worker maps.
func (p *proc) mappedSlots() int64 {
	s := &p.slots
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mapped
}
