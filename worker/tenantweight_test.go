package worker

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/internal/testkit"
)

// fakeV1Group is a worker's group in a fake cgroup v1 hierarchy (plain
// files) and a reader of its cpu.shares.
func fakeV1Group(t *testing.T, pid int) (*Group, func() string) {
	t.Helper()
	old := cgroupRoot
	cgroupRoot = t.TempDir()
	t.Cleanup(func() { cgroupRoot = old })
	os.MkdirAll(filepath.Join(cgroupRoot, "cpu"), 0o755)
	os.WriteFile(filepath.Join(cgroupRoot, "cpu", "cpu.shares"), []byte("1024"), 0o644)
	groups := NewCPUGroups(nil)
	if groups == nil {
		t.Fatal("no groups on a writable fake v1 hierarchy")
	}
	cg := groups.Place(pid, 0)
	if cg == nil {
		t.Fatal("the worker was not placed")
	}
	file := filepath.Join(groups.dir, strconv.Itoa(pid), "cpu.shares")
	return cg, func() string { b, _ := os.ReadFile(file); return string(b) }
}

func tenantProc(cg *Group, window time.Duration) *proc {
	return &proc{d: &Device{}, pid: 4321, cgroup: cg, done: make(chan struct{}),
		tenant: &tenancy{progs: map[uint32]*program{}, wake: make(chan struct{}, 1), window: window}}
}

// awaitWeight waits, 15 s at most, until read gives groups' value of w
// default functions' weight.
func awaitWeight(t *testing.T, step string, groups *CPUGroups, read func() string, w float64) {
	t.Helper()
	want := groups.value(w * Weight(&abi.Manifest{Name: "f"}))
	for end := time.Now().Add(15 * time.Second); ; time.Sleep(time.Millisecond) {
		got := strings.TrimSpace(read())
		if got == want {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%s: weight %s, want %s (%g default functions)", step, got, want, w)
		}
	}
}

// weighing runs p's weighLoop until the test ends.
func weighing(t *testing.T, p *proc) {
	stopped := make(chan struct{})
	go func() { p.weighLoop(); close(stopped) }()
	t.Cleanup(func() { close(p.done); <-stopped })
}

func weighedProgram(p *proc, name string, share float64) *program {
	g := &program{p: p, name: name, weight: Weight(&abi.Manifest{Name: name, Share: share})}
	p.addProgram(g)
	return g
}

// A tenant's worker weighs what its busy programs weigh: loads and runs
// make a program busy, a window without either lets it go, and an idle
// worker weighs its heaviest program. Idle functions held warm never add
// to a tenant's weight against another tenant's.
func TestTenantWeightFollowsBusyPrograms(t *testing.T) {
	one := Weight(&abi.Manifest{Name: "f"}) // a default function's
	cg, shares := fakeV1Group(t, 4321)
	p := tenantProc(cg, weighWindow)
	want := func(step string, w float64) {
		t.Helper()
		if got, v := shares(), cg.g.value(w*one); got != v {
			t.Fatalf("%s: cpu.shares %s, want %s (%g default functions)", step, got, v, w)
		}
	}
	a := weighedProgram(p, "a", 0)
	b := weighedProgram(p, "b", 0)
	c := weighedProgram(p, "c", 2)
	later := func(n time.Duration) time.Time { return time.Now().Add(n * p.tenant.window) }

	if busy, _ := p.reweigh(time.Now()); !busy {
		t.Fatal("just loaded, no program was busy")
	}
	want("three loaded for their requests", 4)
	if busy, _ := p.reweigh(later(1)); busy {
		t.Fatal("a window without runs, a program was still busy")
	}
	want("all idle: the heaviest", 2)

	a.runStart()
	p.reweigh(later(3))
	want("a run of a in flight, however long", 1)
	b.runStart()
	b.runEnd()
	p.reweigh(time.Now())
	want("a running, b just ran", 2)
	a.runEnd()
	if busy, _ := p.reweigh(later(1)); busy {
		t.Fatal("a window after the runs ended, a program was still busy")
	}
	want("idle again", 2)

	p.removeProgram(c)
	p.reweigh(time.Now())
	want("the heaviest unloaded", 1)

	d := weighedProgram(p, "d", 3)
	p.reweigh(later(1))
	want("d loaded and idle: the heaviest", 3)
	why := "a test"
	p.killed.Store(&why) // as killFor does (not called: it signals the pid)
	cg.Dying()
	a.runStart()
	d.runStart()
	p.reweigh(time.Now())
	want("killed: the weight Dying gave it stays", 1)
	a.runEnd()
	d.runEnd()
}

// A tenant's worker tells the boost of every program it holds, whatever is
// busy and whether or not its weight changed: the busy set changed from a
// to b at equal weights (the sum unchanged, no write) and the boost went on
// asking of a alone, so b's flood or bytes went unseen.
func TestTenantWorkerNamesEveryProgram(t *testing.T) {
	cg, _ := fakeV1Group(t, 4321)
	p := tenantProc(cg, weighWindow)
	names := func() []string {
		cg.mu.Lock()
		defer cg.mu.Unlock()
		return cg.names
	}
	a := weighedProgram(p, "a", 0)
	later := func(n time.Duration) time.Time { return time.Now().Add(n * p.tenant.window) }
	p.reweigh(time.Now())
	if got := names(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("a loaded: the group names %v, want [a]", got)
	}
	p.reweigh(later(1)) // a idle: the heaviest's weight, unchanged
	b := weighedProgram(p, "b", 0)
	b.runStart()
	if _, wrote := p.reweigh(later(1)); wrote {
		t.Fatal("b busy at a's weight: the weight was written again")
	}
	if got := names(); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("b loaded and busy, the weight unchanged: the group names %v, want [a b]", got)
	}
	b.runEnd()
	p.removeProgram(a)
	p.reweigh(later(3))
	if got := names(); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("a unloaded: the group names %v, want [b]", got)
	}
}

// The worker's own loop keeps the weight without being called: a load
// raises it at once, and it falls back once the window has passed.
func TestTenantWeightLoop(t *testing.T) {
	cg, shares := fakeV1Group(t, 4321)
	// Each state lasts a window at least: a slow poll still sees it.
	p := tenantProc(cg, 200*time.Millisecond)
	weighing(t, p)
	await := func(step string, w float64) { t.Helper(); awaitWeight(t, step, cg.g, shares, w) }
	weighedProgram(p, "a", 1)
	weighedProgram(p, "b", 3)
	await("two loaded", 4)
	await("both idle: the heaviest", 3)
	weighedProgram(p, "c", 2)
	await("c loaded, the others idle: c alone", 2)
	await("all idle again: the heaviest", 3)
}

// Loads in a row (a burst of first requests) share writes: the weight is
// written at most once each weighSpacing, not once a load.
func TestTenantWeightWritesSpaced(t *testing.T) {
	cg, shares := fakeV1Group(t, 4321)
	// A window past any burst's length, however slow the machine.
	p := tenantProc(cg, time.Hour)
	weighing(t, p)
	await := func(step string, w float64) { t.Helper(); awaitWeight(t, step, cg.g, shares, w) }
	before, began := p.tenant.writes.Load(), time.Now()
	for k := range 20 {
		weighedProgram(p, "burst-"+strconv.Itoa(k), 1)
		for len(p.tenant.wake) > 0 { // each load's wake-up seen on its own
			time.Sleep(100 * time.Microsecond)
		}
	}
	took := time.Since(began)
	await("twenty loaded", 20)
	if n, most := p.tenant.writes.Load()-before, 2+int64(took/weighSpacing); n > most {
		t.Errorf("twenty loads in a row over %v made %d writes of the weight, want at most %d", took, n, most)
	}
}

// On this machine's own cgroups, a real tenant's worker: its loads raise
// its group's weight to its programs' sum, idle it falls back to its
// heaviest program's, and a run makes that program's weight its own.
// Skipped where cgroups cannot be written (not root, a container).
func TestTenantWorkerWeighsItsBusyPrograms(t *testing.T) {
	g := NewCPUGroups(slog.New(slog.DiscardHandler))
	if mech := g.Mechanism(); mech != "cgroup v1" && mech != "cgroup v2" {
		g.Close()
		t.Skipf("CPU weights here are %q, not cgroups", mech)
	}
	t.Cleanup(g.Close) // after the device's Close (cleanups run last first)
	d := NewDevice(Options{Exe: os.Args[0], Base: device.NewHost(0), Landlock: true, StageDir: t.TempDir(), Spawner: spawner, TenantScope: true, CPU: g})
	t.Cleanup(func() { d.Close() })
	withShare := func(name string, share float64) *abi.Manifest {
		m := testkit.Manifest(name)
		m.Share = share
		return m
	}
	ma, mb := withShare("a", 1), withShare("b", 3)
	// Both built before either loads: a's build (a compiler's run) must
	// not stand between the loads, where a loaded machine could stretch
	// it past a's window and b would find a idle. b is busy from its
	// load's start, a a window past its load's end.
	da, db := bundleFor(t, "", ma), bundleFor(t, "", mb)
	a := loadDir(t, d, "t", da, ma, nil)
	loadDir(t, d, "t", db, mb, nil)
	p := a.(*program).p
	p.mu.Lock()
	file := filepath.Join(p.cgroup.dir, g.file)
	p.mu.Unlock()
	read := func() string { b, _ := os.ReadFile(file); return string(b) }
	await := func(step string, w float64) { t.Helper(); awaitWeight(t, step, g, read, w) }
	await("both just loaded", 4)
	await("both idle: the heaviest", 3)
	echoes(t, a, ma)
	await("a ran: a alone busy", 1)
}

// A worker being killed runs at a default function's weight, unboosted,
// whatever is written after: one killed while boosted ran at 8 times it
// until emptied, and a weighing after the kill overwrote the weight Dying
// gave.
func TestDyingIsUnboostedForGood(t *testing.T) {
	cg, shares := fakeV1Group(t, 4321)
	cg.setWeight(2, []string{"f"})
	cg.setBoost(true)
	if got, boosted := strings.TrimSpace(shares()), cg.g.value(2*cg.g.boost*Weight(&abi.Manifest{Name: "f"})); got != boosted {
		t.Fatalf("boosted: weight %s, want %s", got, boosted)
	}
	cg.Dying()
	awaitWeight(t, "killed while boosted", cg.g, shares, 1)
	cg.setWeight(3, []string{"f"})
	awaitWeight(t, "weighed after the kill", cg.g, shares, 1)
}
