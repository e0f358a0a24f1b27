package inside

import (
	"fmt"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/worker/wire"
)

// poolMem is a slot as the worker holds it: its mapping, and whether runs
// on it are in place (the device works on it where it is: the host
// device, or a CUDA device that pinned it). A slot the driver refused to
// pin is staged: its bytes are copied into the instance's pinned buffers
// and back, which the reply counts (Timing.Copied), rather than copied by
// the driver from pageable memory unseen.
type poolMem struct {
	mem     []byte
	inPlace bool
	prog    uint32 // a pool slot's program
	pinned  bool   // registered with the device (RegisterHost)
}

// slots are the worker's pool slots, by id-1: shared memory the server
// lends before a request's body is read, so that the body lands where this
// worker's device reads it. Added by the control channel, read by every
// instance's goroutine; a program's are dropped (their entries emptied, ids
// never reused) once it is unloaded and its last instance gone.
var slots struct {
	mu sync.RWMutex
	s  []poolMem
}

// slotOf is the memory a run message's slot names: the instance's own (0)
// or a pool slot.
func slotOf(id uint32, own poolMem) (poolMem, bool) {
	if id == 0 {
		return own, true
	}
	slots.mu.RLock()
	defer slots.mu.RUnlock()
	if int(id) > len(slots.s) || slots.s[id-1].mem == nil {
		return poolMem{}, false
	}
	return slots.s[id-1], true
}

// addSlot maps a pool slot the server made and registers it with the
// device once (CUDA pins it: every run on it then copies straight between
// it and the GPU). The memfd is sealed at its size by the server, so the
// mapping cannot lose its pages under either side.
func (w *server) addSlot(prog uint32, size int64, memfd int) wire.Reply {
	defer unix.Close(memfd) // the mapping keeps the memory
	var st unix.Stat_t
	if err := unix.Fstat(memfd, &st); err != nil || size <= 0 || st.Size < size {
		return failed(fmt.Sprintf("slot: a memfd of %d bytes for a slot of %d", st.Size, size))
	}
	mem, err := unix.Mmap(memfd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return failed("slot: map: " + err.Error())
	}
	var pin wire.Pin // PinNone
	if r, ok := w.dev.(device.HostRegistrar); ok {
		// Refused (a driver that cannot pin it, a locked-memory limit):
		// runs on it still work, staged through the instance's buffers;
		// the server counts and logs the refusal.
		pin = pinOf(r.RegisterHost(mem))
	}
	slots.mu.Lock()
	slots.s = append(slots.s, poolMem{mem: mem, inPlace: pin.State != wire.PinRefused, prog: prog, pinned: pin.State == wire.PinDone})
	id := uint32(len(slots.s))
	slots.mu.Unlock()
	return wire.Reply{St: wire.StOK, ID: id, Pin: pin}
}

// dropSlots unregisters and unmaps program prog's pool slots.
func (w *server) dropSlots(prog uint32) {
	slots.mu.Lock()
	var drop []poolMem
	for i, m := range slots.s {
		if m.mem != nil && m.prog == prog {
			drop = append(drop, m)
			slots.s[i] = poolMem{}
		}
	}
	slots.mu.Unlock()
	for _, m := range drop {
		w.unmapSlot(m)
	}
}

// dropSlot unregisters and unmaps one pool slot of program prog that the
// server took out of use (its request's run panicked there): the server
// asks only once its last run's reply was read, so no run here uses it.
// Refused when the device cannot undo its pin: the server then keeps
// counting it, pinned, until the program goes.
func (w *server) dropSlot(prog, id uint32) wire.Reply {
	slots.mu.Lock()
	if id == 0 || int(id) > len(slots.s) || slots.s[id-1].mem == nil || slots.s[id-1].prog != prog {
		slots.mu.Unlock()
		return failed(fmt.Sprintf("drop slot: program %d has no slot %d", prog, id))
	}
	m := slots.s[id-1]
	if _, canUnpin := w.dev.(device.HostUnregistrar); m.pinned && !canUnpin {
		slots.mu.Unlock()
		return failed("drop slot: the device cannot unregister it")
	}
	slots.s[id-1] = poolMem{}
	slots.mu.Unlock()
	if !w.unmapSlot(m) {
		// Still mapped and pinned: back in the table, for the program's
		// unload (dropSlots) to try again, as the server keeps counting it.
		slots.mu.Lock()
		slots.s[id-1] = m
		slots.mu.Unlock()
		return failed("drop slot: the device did not unregister it")
	}
	return wire.Reply{St: wire.StOK}
}

// unmapSlot unregisters m from the device if it was registered, and
// unmaps it; false when it stays registered and mapped: unmapping
// registered memory under the driver is not safe, so a device that
// cannot undo a registration (no device.HostUnregistrar), or fails to,
// keeps it.
func (w *server) unmapSlot(m poolMem) bool {
	if m.pinned {
		u, canUnpin := w.dev.(device.HostUnregistrar)
		if !canUnpin || u.UnregisterHost(m.mem) != nil {
			return false
		}
	}
	unix.Munmap(m.mem)
	return true
}
