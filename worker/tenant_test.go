package worker

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/funclog"
	"github.com/plover-run/plover/internal/fakecuda"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/worker/wire"
)

// tenantDevice is a host worker device in tenant scope, no standby: each
// process it starts is a tenant's first load's.
func tenantDevice(t testing.TB) *Device {
	t.Helper()
	d := NewDevice(Options{Exe: os.Args[0], Base: device.NewHost(0), Landlock: true, StageDir: t.TempDir(), Spawner: spawner, TenantScope: true})
	t.Cleanup(func() { d.Close() })
	return d
}

// procCount is how many worker processes d holds.
func procCount(d *Device) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.procs)
}

// loadFor loads m, built from src (kernels.cu if ""), for tenant, its
// output to out (may be nil).
func loadFor(t testing.TB, d *Device, tenant, src string, m *abi.Manifest, out device.Output) device.Program {
	t.Helper()
	return loadDir(t, d, tenant, bundleFor(t, src, m), m, out)
}

// bundleFor builds m's bundle (src, the test kernels' when empty) in a
// directory of its own and gives that directory.
func bundleFor(t testing.TB, src string, m *abi.Manifest) string {
	t.Helper()
	if src == "" {
		src = testkit.KernelsSource()
	}
	dir := t.TempDir()
	testkit.BuildLib(t, src, dir, m.Library)
	testkit.WriteManifest(t, dir, m)
	return dir
}

// loadDir loads the bundle bundleFor built in dir for tenant.
func loadDir(t testing.TB, d *Device, tenant, dir string, m *abi.Manifest, out device.Output) device.Program {
	t.Helper()
	p, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m, Tenant: tenant, Output: out})
	if err != nil {
		t.Fatalf("load %s for %q: %v", m.Name, tenant, err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// echoes runs echo on p and checks its answer.
func echoes(t testing.TB, p device.Program, m *abi.Manifest) {
	t.Helper()
	e, err := p.Entry("echo")
	if err != nil {
		t.Fatalf("%s: Entry(echo): %v", m.Name, err)
	}
	in, err := p.NewInstance(device.InstanceConfig{MaxInput: m.MaxInputBytes, Tmp: m.TmpBytes, Out: m.OutBytes})
	if err != nil {
		t.Fatalf("%s: new instance: %v", m.Name, err)
	}
	defer in.Close()
	out := make([]byte, 8)
	if err := in.Run(&device.Run{Input: []byte(m.Name), Output: out, Chain: []device.Step{{Entry: e, Grid: 1, Block: 1}}}); err != nil {
		t.Fatalf("%s: run: %v", m.Name, err)
	}
	if !bytes.HasPrefix(out, []byte(m.Name)[:min(8, len(m.Name))]) {
		t.Fatalf("%s: echoed %q", m.Name, out)
	}
}

func pidOf(p device.Program) int { return p.(*program).PID() }

// A tenant's programs share one worker, a load into it starting no
// process; another tenant's (the empty tenant too) get a worker of their
// own; two bundles of one library name and one file (hard links) run
// apart; unloading one leaves the other running, the last ends the
// process.
func TestTenantWorkerIsShared(t *testing.T) {
	d := tenantDevice(t)
	dir := testkit.BundleDir(t, testkit.Manifest("a"), nil) // one library file for a and b
	load := func(name, tenant string) (device.Program, *abi.Manifest) {
		m := testkit.Manifest(name)
		testkit.WriteManifest(t, dir, m)
		p, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m, Tenant: tenant})
		if err != nil {
			t.Fatalf("load %s: %v", name, err)
		}
		t.Cleanup(func() { p.Close() })
		return p, m
	}
	a, ma := load("a", "t1")
	if n := procCount(d); n != 1 {
		t.Fatalf("%d processes after the first load, want 1", n)
	}
	b, mb := load("bee", "t1")
	c, mc := load("c", "t2")
	e, me := load("e", "")
	for _, tc := range []struct {
		name string
		p, q device.Program
		same bool
	}{{"one tenant", a, b, true}, {"two tenants", a, c, false}, {"the empty tenant", e, a, false}, {"the empty and another", e, c, false}} {
		if got := pidOf(tc.p) == pidOf(tc.q); got != tc.same {
			t.Errorf("%s: pids %d and %d, want same=%v", tc.name, pidOf(tc.p), pidOf(tc.q), tc.same)
		}
	}
	if n := procCount(d); n != 3 {
		t.Errorf("%d processes for 3 tenants, want 3 (the second load of t1 started one?)", n)
	}
	if st := a.(*program).Process(); st.Programs != 2 || st.PID != pidOf(a) {
		t.Errorf("a's process: %+v, want 2 programs", st)
	}
	for _, r := range []struct {
		p device.Program
		m *abi.Manifest
	}{{a, ma}, {b, mb}, {c, mc}, {e, me}} {
		echoes(t, r.p, r.m)
	}
	if err := a.(*program).p.admit("t2"); err == nil {
		t.Error("t1's worker admits a program of t2")
	}
	a.Close()
	echoes(t, b, mb)
	if st := b.(*program).Process(); st.Programs != 1 || !b.(*program).Alive() {
		t.Errorf("after a's unload: %+v, alive %v; want 1 program, alive", st, b.(*program).Alive())
	}
	b.Close()
	select {
	case <-b.(*program).Exited():
	case <-time.After(10 * time.Second):
		t.Fatal("the worker outlived its last program")
	}
	if b.(*program).Death() != nil {
		t.Errorf("a worker ended with its last program reports a death: %v", b.(*program).Death())
	}
	echoes(t, c, mc)
}

// A tenant's worker's stage holds each loaded program's files side by
// side, under the program's prefix, and no others: a failed load's and an
// unloaded program's are gone. A failed load names the bundle's file as
// its author wrote it, in either scope, not where the stage keeps it.
func TestStageHoldsLoadedProgramsFiles(t *testing.T) {
	for _, tenant := range []bool{false, true} {
		t.Run(map[bool]string{false: "function scope", true: "tenant scope"}[tenant], func(t *testing.T) {
			d := NewDevice(Options{Exe: os.Args[0], Base: device.NewHost(0), Landlock: true, StageDir: t.TempDir(), Spawner: spawner, TenantScope: tenant})
			t.Cleanup(func() { d.Close() })
			m := testkit.Manifest("a")
			m.Constants = "w.bin"
			dir := testkit.BundleDir(t, m, []byte("constants"))
			load := func(name, kernel string) (device.Program, error) {
				m := testkit.Manifest(name)
				m.Constants = "w.bin"
				m.Chain[0].Kernel = kernel
				testkit.WriteManifest(t, dir, m)
				return d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m, Tenant: "t1"})
			}
			staged := func(p device.Program) []string {
				ents, err := os.ReadDir(p.(*program).p.stage)
				if err != nil {
					t.Fatal(err)
				}
				var names []string
				for _, e := range ents {
					names = append(names, e.Name())
				}
				return names
			}
			_, err := load("bad", "no_such_kernel")
			if err == nil {
				t.Fatal("a chain naming a kernel its library lacks loaded")
			}
			if msg := err.Error(); !strings.Contains(msg, "library kernels.so:") || strings.Contains(msg, "/proc/self/fd") || strings.Contains(msg, "p1.") {
				t.Errorf("the failed load says %q; want it to name library kernels.so, not the stage's path", msg)
			}
			if !tenant {
				return // a function's worker, its stage and its process went with the failed load
			}
			a, err := load("a", "echo")
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			b, err := load("b", "echo")
			if err != nil {
				t.Fatal(err)
			}
			_, err = load("bad2", "no_such_kernel")
			if err == nil {
				t.Fatal("a chain naming a kernel its library lacks loaded")
			}
			ga, gb := a.(*program), b.(*program)
			want := []string{ga.prefix + "kernels.so", ga.prefix + "w.bin", gb.prefix + "kernels.so", gb.prefix + "w.bin"}
			slices.Sort(want)
			if got := staged(a); !slices.Equal(got, want) {
				t.Errorf("the stage holds %q, want %q (a's and b's files, no failed load's)", got, want)
			}
			b.Close()
			awaitUnloads(t, d)
			if got, want := staged(a), []string{ga.prefix + "kernels.so", ga.prefix + "w.bin"}; !slices.Equal(got, want) {
				t.Errorf("after b's unload the stage holds %q, want a's files alone", got)
			}
			echoes(t, a, testkit.Manifest("a"))
		})
	}
}

// stage names every path it made or tried to make, so that its caller's
// cleanup leaves nothing: here the constants, a directory, are copied
// (no link to a directory) and the copy fails reading it.
func TestStageNamesWhatItTried(t *testing.T) {
	src, st := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(src, "k.so"), []byte("x"), 0o644)
	os.Mkdir(filepath.Join(src, "w.bin"), 0o755)
	made, err := stage(device.ProgramSpec{Dir: src, Manifest: &abi.Manifest{Library: "k.so", Constants: "w.bin"}}, st, "p1.")
	if err == nil {
		t.Fatal("a directory staged as the constants")
	}
	for _, f := range made {
		os.Remove(f)
	}
	if ents, _ := os.ReadDir(st); len(ents) != 0 {
		t.Fatalf("after removing what stage named, the stage holds %s (%v)", ents[0].Name(), err)
	}
}

// Concurrent first loads of one tenant start one process.
func TestTenantConcurrentLoadsStartOneWorker(t *testing.T) {
	d := tenantDevice(t)
	dir := testkit.BundleDir(t, testkit.Manifest("x"), nil)
	var wg sync.WaitGroup
	pids := make([]int, 4)
	for i := range pids {
		wg.Go(func() {
			m := testkit.Manifest("x")
			p, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m, Tenant: "t"})
			if err != nil {
				t.Error(err)
				return
			}
			t.Cleanup(func() { p.Close() })
			pids[i] = pidOf(p)
		})
	}
	wg.Wait()
	for _, pid := range pids[1:] {
		if pid != pids[0] {
			t.Fatalf("pids %v: want one worker", pids)
		}
	}
	if n := procCount(d); n != 1 {
		t.Errorf("%d processes, want 1", n)
	}
}

// startSlow starts a run of sleep_ms (ms) on p, and returns its error
// once it ends; it returns once the run is in flight on the server's side.
func startSlow(t *testing.T, p device.Program, m *abi.Manifest, ms int32) <-chan error {
	t.Helper()
	sleep, err := p.Entry("sleep_ms")
	if err != nil {
		t.Fatal(err)
	}
	in := newInst(t, p, m)
	done := make(chan error, 1)
	go func() {
		done <- in.Run(&device.Run{Output: make([]byte, 8), Chain: []device.Step{{Entry: sleep, Grid: ms, Block: 1}}, Deadline: time.Now().Add(time.Minute)})
	}()
	waitFor(t, "the slow run in flight", func() bool { return p.(*program).runs.Load() > 0 })
	return done
}

// collateral reports what err says of a loss: a ProcessExit, and whether
// it was collateral.
func collateral(err error) (lost, shared bool) {
	var l device.Loss
	if !errors.As(err, &l) {
		return false, false
	}
	return true, l.Collateral()
}

// When a tenant's worker dies, the program whose run killed it loses it as
// its own crash, the others as collateral (a run in flight, its Death);
// without the handler's word (exit() from a bundle) every program with a
// run in flight is a suspect. Another tenant's worker is untouched.
func TestTenantCrashBlame(t *testing.T) {
	for _, tc := range []struct {
		kernel, reason string
		siblingShared  bool
	}{
		{"segv", "SIGSEGV", true},
		{"abort_now", "SIGABRT", true},
		{"exit_zero", "exited with status 0", false},
	} {
		t.Run(tc.kernel, func(t *testing.T) {
			d, s := tenantOutputDevice(t)
			mh := testkit.Manifest("hostile")
			mh.Library = "hostile.so"
			mh.Chain = []abi.Launch{{Kernel: tc.kernel, Grid: 1, Block: 1}}
			h := loadFor(t, d, "t", testkit.HostileSource(), mh, s.Sink("hostile"))
			ms := testkit.Slow("slow", 1)
			slow := loadFor(t, d, "t", "", ms, s.Sink("slow"))
			mo := testkit.Manifest("other")
			other := loadFor(t, d, "u", "", mo, nil)
			if pidOf(h) != pidOf(slow) || pidOf(h) == pidOf(other) {
				t.Fatal("the tenants' programs are not placed as they should be")
			}
			slowDone := startSlow(t, slow, ms, 5000)
			err := runOnce(t, h, mh, nil, 10*time.Second)
			var pe *ProcessExit
			if lost, shared := collateral(err); !lost || shared || !errors.As(err, &pe) || !strings.Contains(pe.Reason, tc.reason) {
				t.Fatalf("the crashing run: %v (a loss %v, collateral %v), want its own loss naming %s", err, lost, shared, tc.reason)
			}
			if lost, shared := collateral(<-slowDone); !lost || shared != tc.siblingShared {
				t.Errorf("the sibling's run in flight: lost %v, collateral %v; want collateral %v", lost, shared, tc.siblingShared)
			}
			if dh, ds := h.(*program).Death(), slow.(*program).Death(); dh == nil || dh.Collateral() || ds == nil || ds.Collateral() != tc.siblingShared {
				t.Errorf("deaths: %v and %v, want the crasher's own and the sibling's collateral=%v", dh, ds, tc.siblingShared)
			}
			for _, l := range s.Lines("slow", time.Time{}) {
				if strings.Contains(l.Line, "fatal signal") {
					t.Errorf("the handler's line reached a function's output: %+v", l)
				}
			}
			echoes(t, other, mo)
		})
	}
}

// A run the server kills past its deadline and grace is its program's own
// loss (ByServer), its idle sibling's collateral.
func TestTenantDeadlineKillBlamesTheHungProgram(t *testing.T) {
	d := tenantDevice(t)
	ms := testkit.Slow("slow", 1)
	hung := loadFor(t, d, "t", "", ms, nil)
	mi := testkit.Manifest("idle")
	idle := loadFor(t, d, "t", "", mi, nil)
	sleep, _ := hung.Entry("sleep_ms")
	in := newInst(t, hung, ms)
	err := in.Run(&device.Run{Output: make([]byte, 8), Chain: []device.Step{{Entry: sleep, Grid: 5000, Block: 1}}, Deadline: time.Now().Add(50 * time.Millisecond)})
	if !errors.Is(err, device.ErrDeadline) {
		t.Fatalf("run past its deadline: %v", err)
	}
	select {
	case <-idle.(*program).Exited():
	case <-time.After(10 * time.Second):
		t.Fatal("the worker was not killed past the grace")
	}
	if dh, di := hung.(*program).Death(), idle.(*program).Death(); dh == nil || !dh.ByServer() || dh.Collateral() || di == nil || !di.Collateral() {
		t.Errorf("deaths: hung %v, idle %v; want hung's own (by the server), idle's collateral", dh, di)
	}
}

// tenantOutputDevice is tenantDevice with a store for its programs' output.
func tenantOutputDevice(t *testing.T) (*Device, *funclog.Store) {
	t.Helper()
	return tenantDevice(t), funclog.New(nil)
}

// A tenant's worker's lines go to the program whose run is in flight
// alone; with two in flight, or none, to neither function's log but to
// the server's, saying the worker's pid and tenant.
func TestTenantOutputAttribution(t *testing.T) {
	var logged testkit.LogBuffer
	d := NewDevice(Options{Exe: os.Args[0], Base: device.NewHost(0), Landlock: true, StageDir: t.TempDir(), Spawner: spawner, TenantScope: true,
		Log: slog.New(slog.NewTextHandler(&logged, nil))})
	t.Cleanup(func() { d.Close() })
	s := funclog.New(nil)
	mt := testkit.OutputManifest("talker", "say", 1, 1)
	talker := loadFor(t, d, "t", testkit.OutputSource(), mt, s.Sink("talker"))
	ms := testkit.Slow("slow", 1)
	slow := loadFor(t, d, "t", "", ms, s.Sink("slow"))
	// Until outputGrace after slow's load, a line may be its constructors'.
	waitFor(t, "slow's load's grace to pass", func() bool {
		return monoSince(slow.(*program).callEnded.Load()) > outputGrace
	})
	if err := runOnce(t, talker, mt, []byte("alone"), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	waitLines(t, s, "talker", func(ls []api.LogLine) bool { return hasLine(ls, "stdout", "say: alone") })
	slowDone := startSlow(t, slow, ms, 2000)
	if err := runOnce(t, talker, mt, []byte("together"), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the shared moment's line in the server log", func() bool { return strings.Contains(logged.String(), "say: together") })
	if err := <-slowDone; err != nil {
		t.Fatal(err)
	}
	// A line read with no program active (a thread of a bundle's own):
	// dated past every run's grace.
	p := talker.(*program).p
	p.output(api.LogLine{Time: time.Now().Add(time.Second), Stream: "stdout", PID: p.pid, Line: "nobody's"})
	for _, name := range []string{"talker", "slow"} {
		for _, l := range s.Lines(name, time.Time{}) {
			if strings.Contains(l.Line, "together") || strings.Contains(l.Line, "nobody's") || (name == "slow" && strings.Contains(l.Line, "alone")) {
				t.Errorf("a line that is not only %s's reached its log: %+v", name, l)
			}
		}
	}
	log := logged.String()
	if !strings.Contains(log, "nobody's") || !strings.Contains(log, "tenant=t") || !strings.Contains(log, fmt.Sprintf("pid=%d", p.pid)) {
		t.Errorf("server log lacks the unattributed lines with pid and tenant:\n%s", log)
	}
}

// loadLimited loads a function of tenant t on d whose manifest limits its
// host memory to mb MiB (0: none).
func loadLimited(t *testing.T, d *Device, name string, mb int64) device.Program {
	t.Helper()
	m := testkit.Manifest(name)
	m.MaxHostMemoryMB = mb
	return loadFor(t, d, "t", "", m, nil)
}

// A tenant's worker's memory limit is the sum of its programs', none if
// one has none; an unload never lowers it (the unloaded program's heap
// stays resident: the watch loop would kill the siblings for it).
func TestTenantMemoryLimitIsTheSum(t *testing.T) {
	d := tenantDevice(t)
	limited := func(name string, mb int64) device.Program { return loadLimited(t, d, name, mb) }
	a := limited("a", 100)
	p := a.(*program).p
	limited("b", 50)
	if got := p.memLimit.Load(); got != 150<<20 {
		t.Fatalf("limit %d MiB, want 150", got>>20)
	}
	c := limited("c", 0)
	if got := p.memLimit.Load(); got != 0 {
		t.Fatalf("limit %d MiB with an unlimited program, want none", got>>20)
	}
	c.Close()
	if got := p.memLimit.Load(); got != 0 {
		t.Fatalf("limit %d MiB after the unlimited one left, want none still", got>>20)
	}
}

// An unload leaves a tenant's worker's limit where it was, and what comes
// after counts on top: the unloaded program's heap may stay resident, as
// after a redeploy, where the programs' sum alone would be the old limit
// again.
func TestTenantMemoryLimitNotLoweredOnUnload(t *testing.T) {
	d := tenantDevice(t)
	limited := func(name string, mb int64) device.Program { return loadLimited(t, d, name, mb) }
	tests := []struct {
		do   func(p *program)
		want int64 // MiB
	}{
		{func(*program) {}, 150},                    // a 100 + b 50
		{func(b *program) { b.Close() }, 150},       // b gone: its 50 stay counted
		{func(*program) { limited("b2", 50) }, 200}, // b redeployed: 100 + 50 gone + 50
		{func(*program) { limited("c", 20) }, 220},  // and a load on top
	}
	a := limited("a", 100)
	p := a.(*program).p
	b := limited("b", 50).(*program)
	for i, tc := range tests {
		tc.do(b)
		if got := p.memLimit.Load(); got != tc.want<<20 {
			t.Fatalf("step %d: limit %d MiB, want %d", i, got>>20, tc.want)
		}
	}
}

// A bundle unloaded and loaded again (scale to zero and back), however
// often, counts once in its tenant's worker's limit; a redeploy's new
// bundle of the function counts apart, the old one's heap may stay.
func TestTenantMemoryLimitCountsABundleOnce(t *testing.T) {
	d := tenantDevice(t)
	loadLimited(t, d, "a", 100)
	m := testkit.Manifest("f")
	m.MaxHostMemoryMB = 50
	dir := t.TempDir()
	testkit.BuildLib(t, testkit.KernelsSource(), dir, m.Library)
	testkit.WriteManifest(t, dir, m)
	load := func(dir string) *program {
		g, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m, Tenant: "t"})
		if err != nil {
			t.Fatal(err)
		}
		return g.(*program)
	}
	for cycle := range 5 {
		g := load(dir)
		if got := g.p.memLimit.Load(); got != 150<<20 {
			t.Fatalf("cycle %d: limit %d MiB with f loaded again, want 150", cycle, got>>20)
		}
		g.Close()
	}
	redeployed := t.TempDir()
	testkit.BuildLib(t, testkit.KernelsSource(), redeployed, m.Library)
	testkit.WriteManifest(t, redeployed, m)
	g := load(redeployed)
	defer g.Close()
	if got := g.p.memLimit.Load(); got != 200<<20 {
		t.Fatalf("limit %d MiB with f's new bundle, want 200 (a 100, f's old 50 and new 50)", got>>20)
	}
}

// TestCUDATenantProgramsShareAContext: on the fake driver, a tenant's
// programs load into one worker and its one primary context (retained
// once, by the worker's device); a program's constants are device memory
// of that context, freed when the program is unloaded while its sibling
// runs on.
func TestCUDATenantProgramsShareAContext(t *testing.T) {
	fakeDir, err := fakecuda.Shared()
	if err != nil {
		t.Skipf("cannot build the fake CUDA driver: %v", err)
	}
	liveDir := t.TempDir()
	out, err := exec.Command("gcc", "-shared", "-fPIC", "-O2", "-Wall", "-I"+filepath.Join(testkit.Root(), "abi"),
		"-o", filepath.Join(liveDir, "fakelive.so"), filepath.Join("testdata", "fakelive.c"),
		"-L"+fakeDir, "-lfakecuda", "-Wl,-rpath,"+fakeDir).CombinedOutput()
	if err != nil {
		t.Skipf("cannot build the test bundle: %v\n%s", err, out)
	}
	constDir := t.TempDir()
	b, err := os.ReadFile(filepath.Join(fakeDir, "fakebundle.so"))
	if err == nil {
		err = os.WriteFile(filepath.Join(constDir, "fakebundle.so"), b, 0o644)
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(constDir, "consts.bin"), bytes.Repeat([]byte{1}, 4096), 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
	d := NewDevice(Options{Exe: os.Args[0], Base: fakeGPU{}, Driver: filepath.Join(fakeDir, "libfakecuda.so"),
		Landlock: true, StageDir: t.TempDir(), Spawner: spawner, TenantScope: true})
	t.Cleanup(func() { d.Close() })
	load := func(dir string, m *abi.Manifest) device.Program {
		p, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m, Tenant: "t"})
		if err != nil {
			t.Fatalf("load %s: %v", m.Name, err)
		}
		t.Cleanup(func() { p.Close() })
		return p
	}
	liveM := func(name string) *abi.Manifest {
		m := fakeManifest(abi.Launch{Kernel: "live", Grid: 1, Block: 1})
		m.Name, m.Library = name, "fakelive.so"
		return m
	}
	l1 := load(liveDir, liveM("live1"))
	in1 := newInst(t, l1, liveM("live1"))
	live := func(in device.Instance) [4]int64 {
		t.Helper()
		out := make([]byte, 64)
		if err := in.Run(&device.Run{Output: out, TmpLen: 64, Chain: []device.Step{{Entry: 0, Grid: 1, Block: 1}}}); err != nil {
			t.Fatalf("live: %v", err)
		}
		var v [4]int64
		for i := range v {
			v[i] = int64(binary.LittleEndian.Uint64(out[8*i:]))
		}
		return v
	}
	before := live(in1)
	if before[0] == 0 || before[1] != 1 {
		t.Fatalf("the worker's context: %#x retained %d times, want one retain", before[0], before[1])
	}
	cm := fakeManifest(abi.Launch{Kernel: "pl_add_const", Grid: 1, Block: 64})
	cm.Name, cm.Constants = "consts", "consts.bin"
	withConsts := load(constDir, cm)
	l2 := load(liveDir, liveM("live2"))
	if pidOf(withConsts) != pidOf(l1) || pidOf(l2) != pidOf(l1) {
		t.Fatalf("pids %d, %d, %d: want one worker", pidOf(l1), pidOf(withConsts), pidOf(l2))
	}
	loaded := live(in1)
	in2 := newInst(t, l2, liveM("live2"))
	fromL2 := live(in2)
	if loaded[0] != before[0] || fromL2[0] != before[0] || fromL2[1] != 1 {
		t.Errorf("contexts %#x (then %#x, from the second program %#x retained %d times): want one", before[0], loaded[0], fromL2[0], fromL2[1])
	}
	if loaded[2]-before[2] != 1 || loaded[3]-before[3] != 4096 {
		t.Errorf("device allocations %d (%d bytes) -> %d (%d bytes) with 4096 bytes of constants loaded, want one more of 4096",
			before[2], before[3], loaded[2], loaded[3])
	}
	in2.Close()
	l2.Close()
	withConsts.Close()
	// The worker frees a closed instance as it reads its channel's end,
	// in the background: wait for it.
	var after [4]int64
	waitFor(t, "the unloaded programs' device memory freed", func() bool {
		after = live(in1)
		return after[2] == before[2] && after[3] == before[3]
	})
	if after[0] != before[0] {
		t.Errorf("context %#x after the unloads, %#x before", after[0], before[0])
	}
}

// BenchmarkRoundTripTenant is BenchmarkRoundTrip in a tenant's worker:
// its runs are on threads they are locked to, and tell the fatal-signal
// handler their program (two cgo calls).
func BenchmarkRoundTripTenant(b *testing.B) {
	d := tenantDevice(b)
	m := testkit.Manifest("echo")
	benchRoundTrip(b, loadFor(b, d, "t", "", m, nil), m)
}

// A tenant's worker refuses a load under an id in use, and an unload or
// an entry of an id it does not hold; the program it holds is unharmed.
func TestTenantWorkerRefusesUnknownIDs(t *testing.T) {
	d := tenantDevice(t)
	m := testkit.Manifest("held")
	p := loadFor(t, d, "t", "", m, nil)
	g := p.(*program)
	mj := []byte(`{"name":"x","abi":2,"target":"host","library":"kernels.so","max_input_bytes":1,"out_bytes":1,"chain":[{"kernel":"echo","grid":1,"block":1}]}`)
	for _, tc := range []struct {
		name string
		c    wire.Control
		want string
	}{
		{"a load under an id in use", wire.Control{Op: wire.OpLoad, Prog: g.id, Prefix: g.prefix, Manifest: mj}, "is loaded already"},
		{"an unload of an unknown id", wire.Control{Op: wire.OpUnload, Prog: 99}, "no program 99"},
		{"an entry of an unknown id", wire.Control{Op: wire.OpEntry, Prog: 99, Kernel: "echo"}, "no program 99"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw, err := g.p.call(context.Background(), g, tc.c, nil, "testing")
			if err != nil {
				t.Fatal(err)
			}
			rep, err := wire.DecodeControlReply(tc.c.Op, raw)
			if err != nil || rep.St == wire.StOK || !strings.Contains(rep.Text, tc.want) {
				t.Fatalf("reply %+v (%v), want a refusal saying %q", rep, err, tc.want)
			}
		})
	}
	echoes(t, p, m)
}

// BenchmarkTenantFirstRun is a function's first request in its tenant's
// running worker, as the engine makes it: load the program, make an
// instance, run the chain once; then unload (outside the timing).
func BenchmarkTenantFirstRun(b *testing.B) {
	d := tenantDevice(b)
	m := testkit.Manifest("keep")
	loadFor(b, d, "t", "", m, nil) // the worker, kept running
	dir := b.TempDir()
	fm := testkit.Manifest("first")
	testkit.BuildLib(b, testkit.KernelsSource(), dir, fm.Library)
	testkit.WriteManifest(b, dir, fm)
	out := make([]byte, fm.OutBytes)
	var load, inst time.Duration
	for b.Loop() {
		t0 := time.Now()
		p, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: fm, Tenant: "t"})
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		in, err := p.NewInstance(device.InstanceConfig{MaxInput: fm.MaxInputBytes, Tmp: fm.TmpBytes, Out: fm.OutBytes})
		if err != nil {
			b.Fatal(err)
		}
		load, inst = load+t1.Sub(t0), inst+time.Since(t1)
		if err := in.Run(&device.Run{Input: []byte("x"), Output: out, Chain: []device.Step{{Entry: 0, Grid: 1, Block: 1}}}); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		in.Close()
		p.Close()
		b.StartTimer()
	}
	b.ReportMetric(float64(load.Nanoseconds())/float64(b.N), "load-ns/op")
	b.ReportMetric(float64(inst.Nanoseconds())/float64(b.N), "instance-ns/op")
}

// An unload's time starts at its turn on the control channel: behind a
// sibling's call longer than its bound (a large load, up to loadBound) it
// waits, then unloads, where its one deadline for both made it go out
// with too little time (timing out killed every sibling) or not at all,
// leaving the program loaded in the worker for good. Close does not wait
// for it: it is called where nobody may wait on this tenant's worker (an
// eviction for another tenant's cold start, the reaper's round), and
// waited up to a minute there.
func TestTenantUnloadWaitsForItsTurn(t *testing.T) {
	defer func(b time.Duration) { unloadBound = b }(unloadBound)
	unloadBound = time.Second
	d := tenantDevice(t)
	ma, mb := testkit.Manifest("stays"), testkit.Manifest("goes")
	a := loadFor(t, d, "t", "", ma, nil).(*program)
	b := loadFor(t, d, "t", "", mb, nil).(*program)
	a.p.ctlTok <- struct{}{} // a sibling's long call holds the channel
	closed := make(chan struct{})
	go func() { b.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close waited on the tenant's worker's control channel")
	}
	time.Sleep(unloadBound + unloadBound/2) // longer than the unload's own bound
	<-a.p.ctlTok
	awaitUnloads(t, d)
	raw, err := a.p.call(context.Background(), a, wire.Control{Op: wire.OpEntry, Prog: b.id, Kernel: "echo"}, nil, "testing")
	if err != nil {
		t.Fatal(err)
	}
	if rep, err := wire.DecodeControlReply(wire.OpEntry, raw); err != nil || rep.St == wire.StOK {
		t.Fatalf("the worker still holds the unloaded program (entry reply %+v, %v)", rep, err)
	}
	if !a.Alive() {
		t.Fatalf("the sibling's worker died: %v", a.Death())
	}
	echoes(t, a, ma)
}

// awaitUnloads waits up to 30 s for d's programs closed so far to be
// unloaded by their workers (Close leaves that to the background).
func awaitUnloads(t testing.TB, d *Device) {
	t.Helper()
	if !d.unloads.wait(time.After(30 * time.Second)) {
		t.Fatal("programs' unloads still under way after 30 s")
	}
}
