package worker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/internal/testkit"
)

// A kill after the process was killed already (or after it exited) blames
// no program: the first kill (a memory limit, a sibling's crash) ended it.
func TestKillForBlamesOnlyTheFirstKill(t *testing.T) {
	d := tenantDevice(t)
	m := testkit.Manifest("a")
	a := loadFor(t, d, "t", "", m, nil).(*program)
	p := a.p
	p.kill("a test's first kill")
	p.killFor(a, "a test's second kill")
	if g := p.killedBy.Load(); g != nil {
		t.Errorf("killedBy %s after a kill that came second", g.name)
	}
	<-p.done
	p.killFor(a, "a test's kill after the exit")
	if g := p.killedBy.Load(); g != nil {
		t.Errorf("killedBy %s after a kill of an exited process", g.name)
	}
	if d := a.Death(); d == nil || d.Collateral() {
		t.Errorf("death %v: want a's own (the first kill blamed no one, so every program)", d)
	}
}

// A tenant's worker the server killed but has not reaped yet takes no new
// program: the tenant gets a fresh worker.
func TestTenantKilledWorkerTakesNoProgram(t *testing.T) {
	d := tenantDevice(t)
	a := loadFor(t, d, "t", "", testkit.Manifest("a"), nil).(*program)
	why := "a test marked it killed"
	a.p.killed.Store(&why) // as kill does before the process is reaped
	b := loadFor(t, d, "t", "", testkit.Manifest("b"), nil).(*program)
	if b.p == a.p {
		t.Fatalf("b placed in the killed worker %d", a.p.pid)
	}
	echoes(t, b, testkit.Manifest("b"))
}

// slowBeside loads a sibling for tenant t on d and builds a bundle whose
// load takes 700 ms, not loaded: the sibling's manifest and program, the
// slow bundle's directory and manifest.
func slowBeside(t *testing.T, d *Device) (*abi.Manifest, *program, string, *abi.Manifest) {
	t.Helper()
	ms := testkit.Manifest("sibling")
	sib := loadFor(t, d, "t", "", ms, nil).(*program)
	dir := t.TempDir()
	m := testkit.Manifest("slow")
	m.Library = "slowload.so"
	testkit.BuildLib(t, filepath.Join("testdata", "slowload.cc"), dir, m.Library, "-DSLOW_MS=700")
	testkit.WriteManifest(t, dir, m)
	return ms, sib, dir, m
}

// A request whose deadline passes while its program loads into its
// tenant's worker gives up at once (ErrDeadline) and kills nothing: the
// sibling runs on in the same process, and the late program, which no
// request takes over, is unloaded a while after its load ends.
func TestTenantLoadPastDeadlineKeepsTheWorker(t *testing.T) {
	d := tenantDevice(t)
	d.lateKeep = 100 * time.Millisecond // then unloaded, no one taking it over
	ms, sib, dir, m := slowBeside(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	p, err := d.Load(ctx, device.ProgramSpec{Dir: dir, Manifest: m, Tenant: "t"})
	if err == nil {
		p.Close()
		t.Fatal("a load past its request's deadline succeeded")
	}
	if !errors.Is(err, device.ErrDeadline) || time.Since(t0) > 600*time.Millisecond {
		t.Fatalf("load: %v after %v, want ErrDeadline at the request's deadline", err, time.Since(t0))
	}
	waitFor(t, "the late program unloaded", func() bool {
		sib.p.mu.Lock()
		defer sib.p.mu.Unlock()
		return len(sib.p.tenant.progs) == 1
	})
	if !sib.Alive() || sib.p.killed.Load() != nil {
		t.Fatalf("the sibling's worker was killed: %v", sib.Death())
	}
	echoes(t, sib, ms)
	if got := d.used.Load(); got != 0 {
		t.Errorf("ledger %d bytes after the late program's unload, want 0", got)
	}
}

// A load whose request gave up at its deadline is taken over by the next
// request's load of the same function, finished or not: the bundle is
// loaded once, and the function warms although each load outlasts a
// request's deadline. Another function's load does not take it.
func TestTenantLateLoadIsTakenOver(t *testing.T) {
	d := tenantDevice(t)
	_, sib, dir, m := slowBeside(t, d)
	spec := device.ProgramSpec{Dir: dir, Manifest: m, Tenant: "t"}
	for i, d0 := range []time.Duration{100 * time.Millisecond, 100 * time.Millisecond} {
		ctx, cancel := context.WithTimeout(context.Background(), d0)
		_, err := d.Load(ctx, spec)
		cancel()
		if !errors.Is(err, device.ErrDeadline) {
			t.Fatalf("load %d: %v, want ErrDeadline", i, err)
		}
	}
	p, err := d.Load(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if got := p.(*program).id; got != 2 {
		t.Errorf("the program has id %d, want 2: the sibling's 1, then one load of the slow bundle", got)
	}
	sib.p.mu.Lock()
	n, next := len(sib.p.tenant.progs), sib.p.tenant.nextID
	sib.p.mu.Unlock()
	if n != 2 || next != 2 {
		t.Errorf("the worker holds %d programs and made %d ids, want 2 and 2: the late load was loaded again", n, next)
	}
	echoes(t, p, m)
	other := *m
	other.Name = "other"
	testkit.WriteManifest(t, dir, &other)
	if q, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: &other, Tenant: "t"}); err != nil {
		t.Fatal(err)
	} else if q.(*program).id == 2 {
		t.Error("another function took over the late load")
	} else {
		q.Close()
	}
}

// A tenant's worker that a bundle ends from a thread of its own, outside
// its runs (exit(), or a signal with no fatal-signal mark), is every
// program's loss, none collateral: the one at fault is not known, and the
// sibling whose run happened to be in flight is not it.
func TestTenantUnmarkedDeathBlamesEveryProgram(t *testing.T) {
	for _, kernel := range []string{"exit_later", "segv_later"} {
		t.Run(kernel, func(t *testing.T) {
			d := tenantDevice(t)
			dir := t.TempDir()
			mh := testkit.Manifest("late")
			mh.Library = "latecrash.so"
			mh.Chain = []abi.Launch{{Kernel: kernel, Grid: 200, Block: 1}}
			testkit.BuildLib(t, filepath.Join("testdata", "latecrash.cc"), dir, mh.Library, "-pthread")
			testkit.WriteManifest(t, dir, mh)
			h, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: mh, Tenant: "t"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { h.Close() })
			ms := testkit.Slow("slow", 1)
			slow := loadFor(t, d, "t", "", ms, nil)
			slowDone := startSlow(t, slow, ms, 5000)
			if err := runOnce(t, h, mh, nil, 10*time.Second); err != nil {
				t.Fatalf("the entry that starts the thread: %v", err)
			}
			if lost, shared := collateral(<-slowDone); !lost || shared {
				t.Errorf("the sibling's run in flight: lost %v, collateral %v; want its own loss", lost, shared)
			}
			if dh, ds := h.(*program).Death(), slow.(*program).Death(); dh == nil || dh.Collateral() || ds == nil || ds.Collateral() {
				t.Errorf("deaths: %v and %v, want neither collateral", dh, ds)
			}
		})
	}
}

// A tenant whose worker keeps dying with no one program to blame (an
// exit) gets no new worker for a while: its loads fail at once; another
// tenant's are untouched. Deaths blamed on the one program whose run took
// a signal are that function's for the engine to back off: they do not
// hold the tenant. The hold is logged with the device's lock let go.
func TestTenantChurnHold(t *testing.T) {
	for _, tc := range []struct {
		kernel string
		held   bool
	}{{"exit_zero", true}, {"segv", false}} {
		t.Run(tc.kernel, func(t *testing.T) {
			d, probe := probedTenantDevice(t, "keep dying")
			dir := t.TempDir()
			mh := testkit.Manifest("hostile")
			mh.Library = "hostile.so"
			mh.Chain = []abi.Launch{{Kernel: tc.kernel, Grid: 1, Block: 1}}
			testkit.BuildLib(t, testkit.HostileSource(), dir, mh.Library)
			testkit.WriteManifest(t, dir, mh)
			for i := range churnLimit {
				h, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: mh, Tenant: "t"})
				if err != nil {
					t.Fatalf("load %d: %v", i, err)
				}
				if err := runOnce(t, h, mh, nil, 10*time.Second); err == nil {
					t.Fatalf("%s ran", tc.kernel)
				}
				<-h.(*program).Exited()
				h.Close()
			}
			h, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: mh, Tenant: "t"})
			if held := err != nil && strings.Contains(err.Error(), "no new worker"); held != tc.held {
				t.Fatalf("load after %d deaths: %v; held %v, want %v", churnLimit, err, held, tc.held)
			}
			if h != nil {
				h.Close()
			}
			if logged := probe.records(); tc.held && !slices.Equal(logged, []bool{true}) {
				t.Errorf("the hold's log lines, each with the device's lock free: %v, want [true]", logged)
			}
			echoes(t, loadFor(t, d, "u", "", testkit.Manifest("other"), nil), testkit.Manifest("other"))
		})
	}
}

// slotMaps counts the server's slots mapped in process pid (memfds named
// plover-slot).
func slotMaps(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "memfd:plover-slot")
}

// cycleSlots loads m from dir into tenant t's worker beside keep, lends
// it two pool slots, gives them back and unloads it, rounds times: the
// worker's slot counters, the device's pinned bytes and the worker's
// mappings come back to their level each time.
func cycleSlots(t *testing.T, d *Device, dir string, m *abi.Manifest, keep *program) {
	t.Helper()
	p := keep.p
	p.slots.mu.Lock()
	mapped0, pinned0 := p.slots.mapped, p.slots.pinned
	p.slots.mu.Unlock()
	pin0, maps0 := d.pin.bytes.Load(), slotMaps(t, p.pid)
	for round := range 3 {
		g, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m, Tenant: "t"})
		if err != nil {
			t.Fatal(err)
		}
		if g.(*program).p != p {
			t.Fatal("the program was not loaded into the kept program's worker")
		}
		var lent []device.Slot
		for range 2 {
			s, ok := g.(device.Lender).Lend(m.MaxInputBytes, m.OutBytes)
			if !ok {
				t.Fatalf("round %d: no slot lent", round)
			}
			lent = append(lent, s)
		}
		p.slots.mu.Lock()
		pinnedLent := p.slots.pinned
		p.slots.mu.Unlock()
		if device.PinsHost(d.Target()) && pinnedLent == pinned0 {
			t.Fatalf("round %d: a device that pins did not pin the slots", round)
		}
		if n := slotMaps(t, p.pid); n != maps0+2 {
			t.Fatalf("round %d: the worker maps %d slots, want %d", round, n, maps0+2)
		}
		for _, s := range lent {
			s.Release()
		}
		g.Close()
		awaitUnloads(t, d)
		p.slots.mu.Lock()
		mapped, pinned := p.slots.mapped, p.slots.pinned
		p.slots.mu.Unlock()
		if mapped != mapped0 || pinned != pinned0 || d.pin.bytes.Load() != pin0 {
			t.Fatalf("round %d: %d bytes mapped, %d pinned (device %d) after the unload, want %d, %d (%d)",
				round, mapped, pinned, d.pin.bytes.Load(), mapped0, pinned0, pin0)
		}
		waitFor(t, "the worker to unmap the unloaded program's slots", func() bool { return slotMaps(t, p.pid) == maps0 })
	}
	if !keep.Alive() {
		t.Fatalf("the kept program's worker died: %v", keep.Death())
	}
}

// A tenant's worker lets go of an unloaded program's pool slots: redeploys
// into a long-lived worker do not pile up its mappings and counters.
func TestTenantUnloadReleasesPoolSlots(t *testing.T) {
	d := tenantDevice(t)
	keep := loadFor(t, d, "t", "", testkit.Manifest("keep"), nil).(*program)
	m := testkit.Manifest("x")
	cycleSlots(t, d, testkit.BundleDir(t, m, nil), m, keep)
	echoes(t, keep, testkit.Manifest("keep"))
}

// On a device that pins its slots (the fake CUDA driver), the unloaded
// program's pins are undone too: the device's pinned bytes come back.
func TestCUDATenantUnloadUnpinsPoolSlots(t *testing.T) {
	d, dir := fakeTenantDevice(t)
	m := fakeManifest(abi.Launch{Kernel: "pl_copy", Grid: 1, Block: 64})
	m.MaxInputBytes, m.OutBytes = 1<<20, 1<<20
	keep := loadAs(t, d, dir, m, "keep")
	t.Cleanup(func() { keep.Close() })
	cycleSlots(t, d, dir, m, keep)
	if got := d.Pinning().Bytes; got != 0 {
		t.Errorf("%d bytes pinned after the unloads, want 0", got)
	}
}

// A discarded slot its worker failed to unregister stays in the worker's
// table: its program's unload unregisters and unmaps it with the rest.
// Before, the failed drop had taken it out of the table first, and it
// stayed mapped and pinned in the worker for the worker's life.
func TestCUDASlotThatFailedToUnregisterGoesWithItsProgram(t *testing.T) {
	d, dir := fakeTenantDevice(t, "FAKECUDA_UNREGISTER_ERROR=1")
	m := fakeManifest(abi.Launch{Kernel: "pl_copy", Grid: 1, Block: 64})
	keep := loadAs(t, d, dir, m, "keep")
	t.Cleanup(func() { keep.Close() })
	maps := slotMaps(t, keep.p.pid)
	x := loadAs(t, d, dir, m, "x")
	s, ok := x.Lend(m.MaxInputBytes, m.OutBytes)
	if !ok {
		t.Fatal("no slot lent")
	}
	s.Discard() // its drop fails: the driver's first unregister does
	waitFor(t, "the slot kept after its failed drop", func() bool {
		x.slots.mu.Lock()
		defer x.slots.mu.Unlock()
		return len(x.slots.discarded) == 1
	})
	x.Close()
	awaitUnloads(t, d)
	waitFor(t, "the unload to unmap the slot", func() bool { return slotMaps(t, keep.p.pid) == maps })
	if got := d.Pinning().Bytes; got != 0 {
		t.Errorf("%d bytes pinned after the unload, want 0", got)
	}
}

// fakeTenantDevice is a device in tenant scope on the fake CUDA driver,
// its workers given env, and the fake bundle's directory.
func fakeTenantDevice(t *testing.T, env ...string) (*Device, string) {
	t.Helper()
	good, dir := fakeCUDA(t)
	d := NewDevice(Options{Exe: os.Args[0], Base: fakeGPU{}, Driver: good.opts.Driver, Landlock: true,
		StageDir: t.TempDir(), Spawner: spawner, TenantScope: true, env: env})
	t.Cleanup(func() { d.Close() })
	return d, dir
}

// loadAs loads the fake bundle of m, named name, for tenant t.
func loadAs(t *testing.T, d *Device, dir string, m *abi.Manifest, name string) *program {
	t.Helper()
	mm := *m
	mm.Name = name
	p, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: &mm, Tenant: "t"})
	if err != nil {
		t.Fatal(err)
	}
	return p.(*program)
}

// The blame rule, case by case, on a tenant's worker holding programs 1
// and 2 that held 3 (unloaded): who is at fault, and whether one program
// was named (the tenant's hold counts only deaths where none was).
func TestBlameRule(t *testing.T) {
	tests := []struct {
		name     string
		fatal    uint32
		sig      syscall.Signal
		killedBy uint32
		blamed   []uint32
		named    bool
		letGo    bool // killedBy let go of after the kill, before the reap (a hung load's failure)
	}{
		{"a marked fault", 1, syscall.SIGSEGV, 0, []uint32{1}, true, false},
		{"a marked fault of an unloaded program", 3, syscall.SIGSEGV, 0, nil, false, false},
		{"a mark naming no program", 9, syscall.SIGSEGV, 0, []uint32{1, 2}, false, false},
		{"the server's kill", 0, syscall.SIGKILL, 2, []uint32{2}, true, false},
		{"the server's kill for an unloaded program's call", 0, syscall.SIGKILL, 3, nil, false, false},
		{"a mark, then the server's kill", 1, syscall.SIGKILL, 2, []uint32{2}, true, false},
		{"a crash before the server's kill", 0, syscall.SIGSEGV, 2, []uint32{1, 2}, false, false},
		{"an exit", 0, 0, 0, []uint32{1, 2}, false, false},
		{"the server's kill for a load, let go of before the reap", 0, syscall.SIGKILL, 2, []uint32{2}, true, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := &proc{tenant: &tenancy{progs: map[uint32]*program{}, nextID: 3}} // 3 unloaded
			held := map[uint32]*program{}
			for _, id := range []uint32{1, 2} {
				p.tenant.progs[id] = &program{id: id, p: p}
				held[id] = p.tenant.progs[id]
			}
			p.fatal.Store(tc.fatal)
			if tc.killedBy != 0 {
				g := p.tenant.progs[tc.killedBy]
				if g == nil { // unloaded
					g = &program{id: tc.killedBy, p: p}
				}
				p.killedBy.Store(g)
				p.killedHeld = p.tenant.progs[g.id] == g // as killFor records it
				if tc.letGo {
					delete(p.tenant.progs, g.id)
				}
			}
			p.blame(tc.sig)
			var blamed []uint32
			for _, id := range []uint32{1, 2} {
				if held[id].blamed.Load() {
					blamed = append(blamed, id)
				}
			}
			if !slices.Equal(blamed, tc.blamed) || p.tenant.named != tc.named {
				t.Errorf("blamed %v (named %v), want %v (named %v)", blamed, p.tenant.named, tc.blamed, tc.named)
			}
		})
	}
}

// A load that hangs past its bound (loadBound, shortened here) kills its
// tenant's worker for that program alone: the load fails with a deadline
// error though its request's deadline is far, the sibling's loss is
// collateral (the engine retries its requests in flight and counts no
// crash against it), and the tenant's next load gets a fresh worker; the
// bundle that hung loads in a worker of its own from then on.
func TestTenantHangingLoadIsBlamedAlone(t *testing.T) {
	d := tenantDevice(t)
	ms, sib, dir, m := slowBeside(t, d)
	d.loadBound = 200 * time.Millisecond // the bundle's load takes 700 ms
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if p, err := d.Load(ctx, device.ProgramSpec{Dir: dir, Manifest: m, Tenant: "t"}); err == nil {
		p.Close()
		t.Fatal("a load past its bound succeeded")
	} else if !errors.Is(err, device.ErrDeadline) {
		t.Fatalf("load past its bound: %v, want ErrDeadline", err)
	}
	select {
	case <-sib.Exited():
	case <-time.After(10 * time.Second):
		t.Fatal("the worker of a hanging load was not killed")
	}
	if ds := sib.Death(); ds == nil || !ds.Collateral() {
		t.Fatalf("the sibling's death %v, want collateral: the hanging load is to blame", ds)
	}
	d.loadBound = loadBound
	again := loadFor(t, d, "t", "", ms, nil).(*program)
	if again.p == sib.p {
		t.Fatalf("the sibling loaded again into the killed worker %d", sib.p.pid)
	}
	echoes(t, again, ms)
	// From now on the bundle loads in a worker of its own, as in function
	// scope: a hang there would end no sibling.
	p, err := d.Load(ctx, device.ProgramSpec{Dir: dir, Manifest: m, Tenant: "t"})
	if err != nil {
		t.Fatalf("the hanging bundle's next load: %v", err)
	}
	defer p.Close()
	if own := p.(*program).p; own == again.p || !strings.Contains(own.tenant.name, "(alone: ") {
		t.Fatalf("the bundle whose load hung loaded into its tenant's worker %d again", again.p.pid)
	}
	echoes(t, again, ms)
}

// A crash marked with an unloaded program's id names its function however
// long after its unload it comes (its fini or unload hook on its last
// instance's thread): leaving forgot it outputGrace after, and the log
// then named no one.
func TestACrashOfAnUnloadedProgramNamesIt(t *testing.T) {
	p := &proc{exited: true, tenant: &tenancy{progs: map[uint32]*program{}}} // exited: enroll raises no pids bound
	for _, name := range []string{"kept", "unloaded"} {
		p.enroll(&program{name: name, p: p})
	}
	delete(p.tenant.progs, 2) // unloaded, and forgotten by leaving
	p.fatal.Store(2)
	p.blame(syscall.SIGSEGV)
	if p.tenant.by != "unloaded" || p.tenant.named {
		t.Fatalf("by %q (named %v), want \"unloaded\", not named", p.tenant.by, p.tenant.named)
	}
}
