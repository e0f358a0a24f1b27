package worker

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/funclog"
	"github.com/plover-run/plover/internal/testkit"
)

// idleFn is a function loaded in a worker of a device whose idle bound a
// test set: its program, manifest, and a run of body on a lent slot that
// returns the output's first len(body) bytes.
type idleFn struct {
	d   *Device
	g   *program
	m   *abi.Manifest
	run func(t *testing.T, s device.Slot, body []byte) []byte
}

func (f idleFn) lend(t *testing.T) device.Slot {
	t.Helper()
	s, ok := f.g.Lend(f.m.MaxInputBytes, f.m.OutBytes)
	if !ok {
		t.Fatal("no slot lent")
	}
	return s
}

// idleHost is echo, 1 MiB in and out, on the host device.
func idleHost(t *testing.T, idle time.Duration) idleFn {
	d := NewDevice(Options{Exe: os.Args[0], Base: device.NewHost(0), Landlock: true, StageDir: t.TempDir(), Spawner: spawner, slotIdle: idle})
	t.Cleanup(func() { d.Close() })
	m := testkit.Manifest("echo")
	m.MaxInputBytes, m.OutBytes = 1<<20, 1<<20
	p := load(t, d, m)
	in := newInst(t, p, m)
	echo, err := p.Entry("echo")
	if err != nil {
		t.Fatal(err)
	}
	run := func(t *testing.T, s device.Slot, body []byte) []byte {
		t.Helper()
		n := copy(s.Input(), body)
		r := &device.Run{Input: s.Input()[:n], Output: s.Output(), Slot: s, TmpLen: m.TmpBytes, Chain: []device.Step{{Entry: echo, Grid: 1, Block: 64}}}
		if err := in.Run(r); err != nil {
			t.Fatal(err)
		}
		return bytes.Clone(r.Output[:len(body)])
	}
	return idleFn{d, p.(*program), m, run}
}

// idleCUDA is pl_copy, 1 MiB in and out, on the fake CUDA driver (env:
// its settings): its worker pins every slot it maps.
func idleCUDA(t *testing.T, idle time.Duration, env ...string) idleFn {
	good, dir := fakeCUDA(t)
	d := NewDevice(Options{Exe: os.Args[0], Base: fakeGPU{}, Driver: good.opts.Driver, Landlock: true, StageDir: t.TempDir(), Spawner: spawner,
		slotIdle: idle, env: env})
	t.Cleanup(func() { d.Close() })
	m := fakeManifest(abi.Launch{Kernel: "pl_copy", Grid: 1, Block: 64})
	m.MaxInputBytes, m.OutBytes = 1<<20, 1<<20
	p, in := loadCopy(t, d, dir, m)
	run := func(t *testing.T, s device.Slot, body []byte) []byte {
		t.Helper()
		out, _ := copyRun(t, p, in, s, body)
		return out
	}
	return idleFn{d, p.(*program), m, run}
}

// Pool slots left free past the idle bound are given back: their worker
// unmaps (and on CUDA unpins) them, the server unmaps them (its shared
// memory falls), and the pool counts them no more, so that the next
// request makes a slot again and is answered as before. A slot lent
// across the bound is left alone. Before, a burst's slots stayed for the
// worker's life: on the host the pages their bodies touched stayed
// resident, on a GPU pinned, up to maxPoolSlots per program.
func TestIdlePoolSlotsAreGivenBack(t *testing.T) {
	const n, idle = 4, 200 * time.Millisecond
	for _, tc := range []struct {
		name string
		open func(*testing.T, time.Duration) idleFn
	}{{"host", idleHost}, {"cuda", func(t *testing.T, idle time.Duration) idleFn { return idleCUDA(t, idle) }}} {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.open(t, idle)
			pid := f.g.p.pid
			maps0, pin0, shm0 := slotMaps(t, pid), f.d.Pinning().Bytes, serverShmem(t)
			held := f.lend(t) // lent across the bound: never touched
			if out := f.run(t, held, []byte("held")); !bytes.Equal(out, []byte("held")) {
				t.Fatalf("on the held slot: %q", out)
			}
			var burst []device.Slot
			for i := range n {
				s := f.lend(t)
				burst = append(burst, s)
				fill(s.Input(), byte(i+1)) // resident in the server, as a body of its size
				fill(s.Output(), byte(i+1))
				body := fmt.Appendf(nil, "request %d", i)
				if out := f.run(t, s, body); !bytes.Equal(out, body) {
					t.Fatalf("request %d: %q", i, out)
				}
			}
			size := held.(*poolSlot).size()
			if c := poolCount(f.g); c != n+1 {
				t.Fatalf("the pool counts %d slots after a burst of %d and one held", c, n)
			}
			shm1 := serverShmem(t)
			if shm1-shm0 < n*size {
				t.Fatalf("the burst's slots raised the server's shared memory by %d bytes, want %d at least", shm1-shm0, n*size)
			}
			for _, s := range burst {
				s.Release()
			}

			waitFor(t, "the pool to count only the held slot", func() bool { return poolCount(f.g) == 1 })
			waitFor(t, "the worker to unmap the idle slots", func() bool { return slotMaps(t, pid) == maps0+1 })
			waitFor(t, "the idle slots' pins to come back", func() bool { return f.d.Pinning().Bytes == pin0+f.d.pinCharge(size) })
			for i, s := range burst {
				if serverMaps(t, s.(*poolSlot)) {
					t.Fatalf("idle slot %d is still mapped in the server", i)
				}
			}
			if shm2 := serverShmem(t); shm1-shm2 < n*size {
				t.Fatalf("the server's shared memory fell by %d bytes once the idle slots went, want %d at least", shm1-shm2, n*size)
			}

			if !held.(*poolSlot).lent.Load() || !serverMaps(t, held.(*poolSlot)) {
				t.Fatal("the held slot was taken from its request")
			}
			if out := f.run(t, held, []byte("still held")); !bytes.Equal(out, []byte("still held")) {
				t.Fatalf("on the held slot past the bound: %q", out)
			}
			held.Release()
			waitFor(t, "the held slot to go once idle", func() bool { return poolCount(f.g) == 0 && slotMaps(t, pid) == maps0 })

			again := f.lend(t) // made anew
			if c := poolCount(f.g); c != 1 {
				t.Fatalf("the pool counts %d slots after one lent, want 1", c)
			}
			body := []byte("answered in a slot made again")
			if out := f.run(t, again, body); !bytes.Equal(out, body) {
				t.Fatalf("in the slot made again: %q", out)
			}
			again.Release()
		})
	}
}

// A lent slot is never taken by the sweep, nor a free one that a run may
// still be on, however long either has been out of use; a free one past
// the bound is, and one within it is not.
func TestTrimSlotsTakesOnlyIdleFreeSlots(t *testing.T) {
	f := idleHost(t, time.Hour) // the sweep's bound never met: trimSlots alone takes them
	lent, inRun, fresh, old := f.lend(t), f.lend(t), f.lend(t), f.lend(t)
	inRun.(*poolSlot).running()
	for _, s := range []device.Slot{inRun, fresh, old} {
		s.Release()
	}
	now := time.Now()
	f.g.slots.mu.Lock()
	for _, s := range []device.Slot{inRun, old} {
		s.(*poolSlot).freeAt = now.Add(-time.Minute)
	}
	f.g.slots.mu.Unlock()
	if !f.g.trimSlots(now.Add(-time.Second)) {
		t.Fatal("a live pool was called dead")
	}
	f.g.slots.mu.Lock() // taken out of free at once, dropped in the background
	free := f.g.slots.free
	f.g.slots.mu.Unlock()
	hasInRun, hasFresh := slices.Contains(free, inRun.(*poolSlot)), slices.Contains(free, fresh.(*poolSlot))
	if len(free) != 2 || !hasInRun || !hasFresh {
		t.Fatalf("free after the trim: %d slots, the one in a run among them: %v, the fresh one: %v", len(free), hasInRun, hasFresh)
	}
	waitFor(t, "the idle slot to go", func() bool { return poolCount(f.g) == 3 })
	if !lent.(*poolSlot).lent.Load() || !serverMaps(t, lent.(*poolSlot)) || serverMaps(t, old.(*poolSlot)) {
		t.Fatal("the trim took the lent slot, or left the idle one mapped")
	}
	inRun.(*poolSlot).replied()
	lent.Release()
}

// A pinned idle slot is not dropped while its worker runs anything: the
// unpin may wait for the context's kernels, and a drop past its bound
// kills the worker. Once the worker runs nothing, it goes.
func TestAPinnedIdleSlotWaitsForAQuietWorker(t *testing.T) {
	f := idleCUDA(t, time.Hour) // trimSlots alone takes them
	s := f.lend(t)
	if s.(*poolSlot).pinned == 0 {
		t.Skip("the fake driver pinned nothing")
	}
	s.Release()
	now := time.Now()
	f.g.slots.mu.Lock()
	s.(*poolSlot).freeAt = now.Add(-time.Minute)
	f.g.slots.mu.Unlock()
	free := func() int {
		f.g.slots.mu.Lock()
		defer f.g.slots.mu.Unlock()
		return len(f.g.slots.free)
	}
	f.g.p.runs.Add(1) // as a run of any function of the worker
	f.g.trimSlots(now.Add(-time.Second))
	if n := free(); n != 1 {
		t.Fatalf("a pinned idle slot was taken while its worker ran: %d free", n)
	}
	f.g.p.runs.Add(-1)
	f.g.trimSlots(now.Add(-time.Second))
	waitFor(t, "the pinned idle slot to go once the worker ran nothing", func() bool { return poolCount(f.g) == 0 })
}

// An idle slot whose drop its worker refused (its device did not unpin
// it: the fake driver's first unregister fails) goes back to the pool
// whole, lent again and run on as before, and is given back after a later
// bound, once the device unpins it. A slot put where discarded ones go
// would have been lost to the pool (never lent again, counted and pinned
// until the program's end).
func TestIdleSlotItsWorkerDidNotDropStaysAndGoesLater(t *testing.T) {
	f := idleCUDA(t, 500*time.Millisecond, "FAKECUDA_UNREGISTER_ERROR=1")
	pid := f.g.p.pid
	maps0, pin0 := slotMaps(t, pid), f.d.Pinning().Bytes
	s := f.lend(t)
	size := s.(*poolSlot).size()
	f.run(t, s, []byte("first"))
	s.Release()
	waitFor(t, "the worker's refusal, the slot back in the pool", func() bool {
		f.g.slots.mu.Lock()
		defer f.g.slots.mu.Unlock()
		return f.g.slots.refusedIdle && len(f.g.slots.free) == 1
	})
	if c, maps, pin := poolCount(f.g), slotMaps(t, pid), f.d.Pinning().Bytes; c != 1 || maps != maps0+1 || pin != pin0+size || !serverMaps(t, s.(*poolSlot)) {
		t.Fatalf("after the refusal: the pool counts %d slots, the worker maps %d (want %d), %d bytes pinned (want %d)", c, maps, maps0+1, pin, pin0+size)
	}
	again := f.lend(t)
	if again != s {
		t.Fatal("the slot its worker kept was not lent again")
	}
	body := []byte("on the slot kept")
	if out := f.run(t, again, body); !bytes.Equal(out, body) {
		t.Fatalf("on the slot kept: %q", out)
	}
	again.Release()
	waitFor(t, "the slot to go at a later bound", func() bool {
		return poolCount(f.g) == 0 && slotMaps(t, pid) == maps0 && f.d.Pinning().Bytes == pin0
	})
}

// fill sets every byte of b to v, so that each of its pages is resident.
func fill(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}

// serverShmem is this process's (the server's) resident shared memory.
func serverShmem(t *testing.T) int64 {
	t.Helper()
	_, shmem, _, ok := procStatus(os.Getpid())
	if !ok {
		t.Fatal("cannot read /proc/self/status")
	}
	return shmem
}

// serverMaps reports whether s's memory is still mapped in this process.
func serverMaps(t *testing.T, s *poolSlot) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	start := fmt.Sprintf("%x-", uintptr(unsafe.Pointer(unsafe.SliceData(s.mem))))
	for line := range strings.Lines(string(b)) {
		if strings.HasPrefix(line, start) && strings.Contains(line, "memfd:plover-slot") {
			return true
		}
	}
	return false
}

// In a tenant's worker, an idle slot's drop (and a slot's making) runs no
// bundle code, so it is no sign that its function printed: a sibling's
// line printed as it ends is the sibling's. Counted as a call of its
// function, each drop made two functions active for outputGrace, and the
// sibling's lines then went to no function's log (a review's probe: 25
// of 300 lines lost beside a function whose burst slots came and went).
func TestAnIdleSlotsDropLeavesASiblingsLinesItsOwn(t *testing.T) {
	d := NewDevice(Options{Exe: os.Args[0], Base: device.NewHost(0), Landlock: true, StageDir: t.TempDir(), Spawner: spawner,
		TenantScope: true, slotIdle: 100 * time.Millisecond})
	t.Cleanup(func() { d.Close() })
	logs := funclog.New(nil)
	mt := testkit.OutputManifest("talker", "say", 1, 1)
	talker := loadFor(t, d, "t", testkit.OutputSource(), mt, logs.Sink("talker"))
	mq := testkit.Manifest("quiet")
	qg := loadFor(t, d, "t", "", mq, logs.Sink("quiet")).(*program)
	for i := range 5 {
		s, ok := qg.Lend(mq.MaxInputBytes, mq.OutBytes)
		if !ok {
			t.Fatal("no slot lent")
		}
		s.Release()
		waitFor(t, "quiet's idle slot given back", func() bool { return poolCount(qg) == 0 })
		// Printed as the drop ended: within outputGrace of it.
		msg := fmt.Sprintf("m%d", i)
		if err := runOnce(t, talker, mt, []byte(msg), 10*time.Second); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "talker's line "+msg+" in its log", func() bool {
			return slices.ContainsFunc(logs.Lines("talker", time.Time{}), func(l api.LogLine) bool { return l.Line == "say: "+msg })
		})
	}
}
