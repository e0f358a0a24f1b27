package worker

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/loader"
)

// uniqueSource is testkit.UniqueSource with the worker tests' one tag:
// each of their loads is in a process of its own, or meant to be.
func uniqueSource(t *testing.T, value int) string { return testkit.UniqueSource(t, "w", value) }

// TestTenantWorkerKeepsGNUUniqueBundlesApart: in tenant scope, a bundle
// defining GNU unique symbols runs in a worker of its own, so that two of
// one tenant's (two functions, two versions of one under one name, or two
// versions of the very same bytes) each answer from their own object
// (value*100 + its own count of runs); bundles without them still share
// the tenant's worker.
func TestTenantWorkerKeepsGNUUniqueBundlesApart(t *testing.T) {
	d := tenantDevice(t)
	answer := func(p device.Program, name string) int32 {
		t.Helper()
		m := testkit.Manifest(name)
		out := make([]byte, m.OutBytes)
		r := &device.Run{Output: out, Chain: []device.Step{{Entry: 0, Grid: 1, Block: 1}}, Deadline: time.Now().Add(10 * time.Second)}
		if err := newInst(t, p, m).Run(r); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return int32(binary.LittleEndian.Uint32(out))
	}
	plain := loadFor(t, d, "t", "", testkit.Manifest("plain"), nil)
	other := loadFor(t, d, "t", "", testkit.Manifest("other"), nil)
	progs := map[string]device.Program{}
	var same device.ProgramSpec
	for i, v := range []struct {
		name  string
		value int
	}{{"one", 1}, {"two", 2}, {"two", 3}, {"two", 3}} { // a new version of "two", then one of the same bytes
		var p device.Program
		if i < 3 {
			p = loadFor(t, d, "t", uniqueSource(t, v.value), testkit.Manifest(v.name), nil)
			same = device.ProgramSpec{Dir: t.TempDir(), Manifest: testkit.Manifest(v.name), Tenant: "t"}
		} else {
			prev := progs["two3"].(*program)
			var err error
			if p, err = d.Load(context.Background(), device.ProgramSpec{Dir: prev.dir, Manifest: same.Manifest, Tenant: "t"}); err != nil {
				t.Fatal(err)
			}
			defer p.Close()
		}
		if got := answer(p, v.name); got != int32(v.value*100+1) {
			t.Errorf("%s built with %d answers %d to its first run: it runs on another program's object", v.name, v.value, got)
		}
		progs[v.name+strconv.Itoa(v.value)+strings.Repeat("'", i/3)] = p
	}
	pid := func(p device.Program) int { return p.(*program).PID() }
	if pid(plain) != pid(other) {
		t.Errorf("the tenant's plain functions run in two processes (%d, %d), not its one worker", pid(plain), pid(other))
	}
	seen := map[int]string{pid(plain): "the tenant's worker"}
	for k, p := range progs {
		if was, ok := seen[pid(p)]; ok {
			t.Errorf("%s shares process %d with %s", k, pid(p), was)
		}
		seen[pid(p)] = k
	}
}

// TestTenantFailedStartsLeaveNoSlots: a worker start that fails (here: no
// worker binary) leaves no tenant slot behind, so the keys of
// workers of their own, each used once, do not pile up.
func TestTenantFailedStartsLeaveNoSlots(t *testing.T) {
	d := tenantDevice(t)
	dir := t.TempDir()
	m := testkit.Manifest("u")
	testkit.BuildLib(t, uniqueSource(t, 1), dir, m.Library)
	testkit.WriteManifest(t, dir, m)
	d.opts.Exe = "/nonexistent/plover-worker"
	for i := range 5 { // tenantDevice keeps no standby: each load starts a worker
		if p, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m, Tenant: "t"}); err == nil {
			p.Close()
			t.Fatalf("load %d: a worker started without its binary", i)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.tenants) != 0 {
		t.Errorf("%d tenant slots left after 5 failed starts", len(d.tenants))
	}
}

// TestTenantHungBundleLoadsAloneForWaitingRequests: a request that waited
// on a late load which then hung past its bound (killing the tenant's
// worker) loads the bundle in a worker of its own, not in the tenant's
// next one: its place is decided after the wait.
func TestTenantHungBundleLoadsAloneForWaitingRequests(t *testing.T) {
	d := tenantDevice(t)
	_, sib, dir, m := slowBeside(t, d) // its load takes 700 ms
	d.loadBound = 200 * time.Millisecond
	spec := device.ProgramSpec{Dir: dir, Manifest: m, Tenant: "t"}
	first, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if p, err := d.Load(first, spec); err == nil {
		p.Close()
		t.Fatal("a load of 700 ms within 50 ms")
	}
	late := func() bool { d.mu.Lock(); defer d.mu.Unlock(); return d.late[lateKey(spec)] != nil }
	if !late() {
		t.Fatal("the first load left no late load listed")
	}
	done := make(chan struct{})
	go func() { // waits on the late load, which hangs past its bound
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if p, err := d.Load(ctx, spec); err == nil {
			p.Close()
		}
	}()
	waitFor(t, "the second request to take the late load over", func() bool { return !late() })
	if !sib.Alive() {
		t.Skip("the second request reached the late load only after its hang: nothing here to test on a machine this slow")
	}
	awaitClosed(t, sib.Exited(), "the hang's kill of the tenant's worker")
	for {
		d.mu.Lock()
		for p := range d.procs {
			if p.tenant == nil {
				continue
			}
			p.mu.Lock()
			for _, g := range p.tenant.progs {
				if g.name == m.Name && !strings.Contains(p.tenant.name, "(alone: ") {
					t.Errorf("the bundle that hung loaded into worker %d of tenant %q", p.pid, p.tenant.name)
				}
			}
			p.mu.Unlock()
		}
		d.mu.Unlock()
		select {
		case <-done:
			return
		case <-time.After(time.Millisecond): // its load holds a worker for 200 ms at least
		}
	}
}

// TestTenantLibraryRefusedBesideSiblingsLoadsAlone: a library whose dlopen
// fails beside its tenant's other programs, for what they hold (here
// glibc's static TLS reserve, which each library with initial-exec TLS
// takes part of), is loaded again in a worker of its own, where it loads,
// and runs there from then on (logged once, naming the function and why);
// its siblings stay in the tenant's worker. One that fails alone too is
// refused with the loader's message, as in function scope.
func TestTenantLibraryRefusedBesideSiblingsLoadsAlone(t *testing.T) {
	var logged testkit.LogBuffer
	d := NewDevice(Options{Exe: os.Args[0], Base: device.NewHost(0), Landlock: true, StageDir: t.TempDir(), Spawner: spawner, TenantScope: true,
		Log: slog.New(slog.NewTextHandler(&logged, nil))})
	t.Cleanup(func() { d.Close() })
	ma, mb := testkit.Manifest("first"), testkit.Manifest("second")
	a := loadDir(t, d, "t", testkit.StaticTLSBundleDir(t, ma, 300), ma, nil)
	plain := loadFor(t, d, "t", "", testkit.Manifest("plain"), nil)
	if pidOf(a) != pidOf(plain) {
		t.Fatal("the tenant's first two functions run in two workers")
	}
	dirB := testkit.StaticTLSBundleDir(t, mb, 300)
	b := loadDir(t, d, "t", dirB, mb, nil)
	echoes(t, b, mb)
	echoes(t, a, ma)
	if pidOf(b) == pidOf(a) || !strings.Contains(b.(*program).p.tenant.name, "(alone: ") {
		t.Errorf("second runs in worker %d of %q, want one of its own beside first's %d", pidOf(b), b.(*program).p.tenant.name, pidOf(a))
	}
	if s := logged.String(); !strings.Contains(s, "worker of its own") || !strings.Contains(s, "function=second") || !strings.Contains(s, "static TLS") {
		t.Errorf("the move to a worker of its own is not logged with the function and why:\n%s", s)
	}
	again := loadDir(t, d, "t", dirB, mb, nil) // its next load goes alone at once
	if pidOf(again) == pidOf(a) || pidOf(again) == pidOf(b) {
		t.Errorf("second's next load runs in worker %d (the tenant's %d, its first's %d), want a fresh one of its own", pidOf(again), pidOf(a), pidOf(b))
	}

	mc := testkit.Manifest("huge")
	_, err := d.Load(context.Background(), device.ProgramSpec{Dir: testkit.StaticTLSBundleDir(t, mc, 64<<10), Manifest: mc, Tenant: "t"})
	var le *loader.Error
	if !errors.As(err, &le) || !strings.Contains(err.Error(), "static TLS") {
		t.Fatalf("a library that cannot load alone either: %v, want the loader's refusal", err)
	}
	echoes(t, a, ma)
	echoes(t, plain, testkit.Manifest("plain"))
}

// TestTenantLateLoadRefusedBesideSiblingsLoadsAlone: a load whose request
// gave up at its deadline (it waited behind a sibling's slow load) and
// that dlopen then refused beside the tenant's other programs is not told
// to the function's next load as its refusal, which the engine would keep
// for good: the next load goes to a worker of its own, and loads.
func TestTenantLateLoadRefusedBesideSiblingsLoadsAlone(t *testing.T) {
	d := tenantDevice(t)
	ma, mb := testkit.Manifest("first"), testkit.Manifest("second")
	a := loadDir(t, d, "t", testkit.StaticTLSBundleDir(t, ma, 300), ma, nil)
	spec := device.ProgramSpec{Dir: testkit.StaticTLSBundleDir(t, mb, 300), Manifest: mb, Tenant: "t"}
	slow := slowSpec(t, "slowsib", "-DSLOW_MS=700")
	slowDone := make(chan struct{})
	go func() {
		defer close(slowDone)
		if p, err := d.Load(context.Background(), slow); err == nil {
			p.Close()
		}
	}()
	waitFor(t, "the slow sibling's load on the tenant's worker's channel", func() bool {
		a.(*program).p.mu.Lock()
		defer a.(*program).p.mu.Unlock()
		for _, g := range a.(*program).p.tenant.progs {
			if g.name == "slowsib" && g.loadAsked.Load() {
				return true
			}
		}
		return false
	})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if p, err := d.Load(ctx, spec); !errors.Is(err, device.ErrDeadline) {
		if p != nil {
			p.Close()
		}
		t.Fatalf("second's load behind a load of 700 ms, within 100 ms: %v, want ErrDeadline", err)
	}
	awaitClosed(t, slowDone, "the slow sibling's load")
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := d.Load(ctx, spec)
	if err != nil {
		t.Fatalf("second's next load: %v, want it loaded in a worker of its own", err)
	}
	defer b.Close()
	echoes(t, b, mb)
	if pidOf(b) == pidOf(a) {
		t.Errorf("second loaded beside first, in worker %d", pidOf(a))
	}
}

// A library refused beside its tenant's other functions for a shortage
// of the moment (memory to map it, descriptors) is loaded alone that
// once, not marked to be for the server's life; one refused for what the
// siblings hold (static TLS, a symbol) is marked.
func TestAMomentaryRefusalBesideSiblingsMarksNothing(t *testing.T) {
	for _, c := range []struct {
		reason string
		marked bool
	}{
		{"libx.so: cannot allocate memory in static TLS block", true},
		{"libdep.so.1: undefined symbol: model_v2", true},
		{"libx.so: failed to map segment from shared object", false},
		{"libx.so: cannot open shared object file: Cannot allocate memory", false},
		{"libx.so: cannot open shared object file: Too many open files", false},
	} {
		d := &Device{opts: Options{Log: slog.New(slog.DiscardHandler)}}
		g := &program{p: &proc{tenant: &tenancy{nextID: 2}}}
		spec := device.ProgramSpec{Dir: t.TempDir(), Manifest: testkit.Manifest("f"), Tenant: "t"}
		err := d.besideRefusal(spec, g, false, &loader.Error{Path: "libx.so", Reason: "dlopen failed: " + c.reason})
		var rb *refusedBeside
		if !errors.As(err, &rb) {
			t.Fatalf("%s: %v, want a refusal beside siblings (loaded again alone)", c.reason, err)
		}
		if got := d.own.m[filepath.Join(spec.Dir, spec.Manifest.Library)] != ""; got != c.marked {
			t.Errorf("%s: marked to run alone %v, want %v", c.reason, got, c.marked)
		}
	}
}
