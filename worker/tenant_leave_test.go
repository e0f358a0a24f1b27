package worker

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/funclog"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/worker/wire"
)

// Tests of programs leaving a tenant's worker: unloaded from it while
// their siblings keep it, or lost with it.

// loggedTenantDevice is tenantDevice logging to h.
func loggedTenantDevice(t *testing.T, h slog.Handler) *Device {
	t.Helper()
	d := NewDevice(Options{Exe: os.Args[0], Base: device.NewHost(0), Landlock: true, StageDir: t.TempDir(), Spawner: spawner, TenantScope: true,
		Log: slog.New(h)})
	t.Cleanup(func() { d.Close() })
	return d
}

// leaveDevice is tenantDevice with a store for its programs' output and
// a log of its own.
func leaveDevice(t *testing.T) (*Device, *funclog.Store, *testkit.LogBuffer) {
	t.Helper()
	var logged testkit.LogBuffer
	return loggedTenantDevice(t, slog.NewTextHandler(&logged, nil)), funclog.New(nil), &logged
}

// loadLeaving loads testdata/leaving.cc, built with args, as function
// name of tenant t on d, its chain's kernel kernel.
func loadLeaving(t *testing.T, d *Device, name, kernel string, out device.Output, args ...string) (*program, *abi.Manifest) {
	t.Helper()
	dir := t.TempDir()
	m := testkit.Manifest(name)
	m.Library = "leaving.so"
	m.Chain = []abi.Launch{{Kernel: kernel, Grid: 50, Block: 1}}
	testkit.BuildLib(t, filepath.Join("testdata", "leaving.cc"), dir, m.Library, append([]string{"-pthread", `-DWHO="` + name + `"`}, args...)...)
	testkit.WriteManifest(t, dir, m)
	p, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m, Tenant: "t", Output: out})
	if err != nil {
		t.Fatalf("load %s: %v", name, err)
	}
	t.Cleanup(func() { p.Close() })
	return p.(*program), m
}

// quiet waits until none of progs has had a run or call within
// outputGrace: a line read from then on is none of theirs.
func quiet(t *testing.T, progs ...*program) {
	t.Helper()
	waitFor(t, "the programs' output grace to pass", func() bool {
		for _, g := range progs {
			if monoSince(max(g.callEnded.Load(), g.runEnded.Load())) <= outputGrace {
				return false
			}
		}
		return true
	})
}

// What a program prints as it leaves a tenant's worker (its
// plover_unload hook as it is unloaded, its plover_instance_fini as an
// idle instance of it is closed) is its own: in its log when no sibling
// runs, in the server's log (kept out of every function's) when one does;
// never in the sibling's log, which another token may read.
func TestTenantLeavingProgramsOutput(t *testing.T) {
	unload := func(g *program, in device.Instance) { // as the engine does: its instances first
		in.Close()
		g.Close()
	}
	for _, tc := range []struct {
		name, line  string
		siblingRuns bool
		leave       func(g *program, in device.Instance)
	}{
		{"unload, sibling idle", "unload: leaver", false, unload},
		{"unload, sibling running", "unload: leaver", true, unload},
		{"instance close, sibling idle", "fini: leaver", false, func(_ *program, in device.Instance) { in.Close() }},
		{"instance close, sibling running", "fini: leaver", true, func(_ *program, in device.Instance) { in.Close() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, s, logged := leaveDevice(t)
			g, mg := loadLeaving(t, d, "leaver", "echo", s.Sink("leaver"))
			ms := testkit.Slow("slow", 1)
			slow := loadFor(t, d, "t", "", ms, s.Sink("slow")).(*program)
			in, err := g.NewInstance(device.InstanceConfig{MaxInput: mg.MaxInputBytes, Tmp: mg.TmpBytes, Out: mg.OutBytes})
			if err != nil {
				t.Fatal(err)
			}
			defer in.Close() // a second close does nothing
			quiet(t, g, slow)
			var slowDone <-chan error
			if tc.siblingRuns {
				slowDone = startSlow(t, slow, ms, 2000)
			}
			tc.leave(g, in)
			if tc.siblingRuns {
				waitFor(t, "the line in the server's log", func() bool { return strings.Contains(logged.String(), tc.line) })
				if err := <-slowDone; err != nil {
					t.Fatal(err)
				}
			} else {
				waitLines(t, s, "leaver", func(ls []api.LogLine) bool { return hasLine(ls, "stdout", tc.line) })
			}
			for _, l := range s.Lines("slow", time.Time{}) {
				if strings.Contains(l.Line, "leaver") {
					t.Errorf("the leaving program's line reached its sibling's log: %+v", l)
				}
			}
		})
	}
}

// A program's Exited closes when the program is gone: unloaded from a
// tenant's worker its siblings keep (the engine's watcher of it ends then,
// counting nothing: Death is nil), or with the worker's death (Death says
// how, a sibling's collateral).
func TestTenantProgramExits(t *testing.T) {
	closed := func(g *program) bool {
		select {
		case <-g.Exited():
			return true
		default:
			return false
		}
	}
	for _, tc := range []struct {
		name      string
		end       func(t *testing.T, a, b *program, ma *abi.Manifest)
		bGone     bool // b's Exited closed too
		aDeath    bool // a's Death non-nil (its own loss)
		bFromDead bool // b's Death non-nil and collateral
	}{
		{"a unloaded, b keeps the worker", func(t *testing.T, a, _ *program, _ *abi.Manifest) { a.Close() }, false, false, false},
		{"both unloaded", func(t *testing.T, a, b *program, _ *abi.Manifest) { a.Close(); b.Close() }, true, false, false},
		{"a crashes the worker", func(t *testing.T, a, _ *program, ma *abi.Manifest) {
			if err := runOnce(t, a, ma, nil, 10*time.Second); err == nil {
				t.Fatal("segv ran")
			}
		}, true, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := tenantDevice(t)
			ma := testkit.Manifest("a")
			ma.Library = "hostile.so"
			ma.Chain = []abi.Launch{{Kernel: "segv", Grid: 1, Block: 1}}
			a := loadFor(t, d, "t", testkit.HostileSource(), ma, nil).(*program)
			mb := testkit.Manifest("b")
			b := loadFor(t, d, "t", "", mb, nil).(*program)
			tc.end(t, a, b, ma)
			waitFor(t, "a's Exited", func() bool { return closed(a) })
			if tc.bGone {
				waitFor(t, "b's Exited", func() bool { return closed(b) })
			} else if closed(b) || !b.Alive() {
				t.Fatalf("b's Exited closed (worker alive %v): %v", b.Alive(), b.Death())
			}
			if da := a.Death(); (da != nil) != tc.aDeath || (da != nil && da.Collateral()) {
				t.Errorf("a's death %v, want its own loss: %v", da, tc.aDeath)
			}
			if db := b.Death(); tc.bGone && ((db != nil) != tc.bFromDead || (db != nil && !db.Collateral())) {
				t.Errorf("b's death %v, want a collateral loss: %v", db, tc.bFromDead)
			}
			if !tc.bGone {
				echoes(t, b, mb)
			}
		})
	}
}

// A worker death pinned on a program the worker no longer holds (a mark
// naming an unloaded program, forged by a sibling or written by the
// handler as an unload hook crashed) is no function's crash: the siblings
// lose the worker as collateral, and the tenant's back-off counts the
// death; else a bundle could crash its tenant's worker at every request
// and never be held. A death pinned on a program held is that function's
// to count (the control): not the tenant's.
func TestTenantDeathNamingAnUnloadedProgram(t *testing.T) {
	for _, tc := range []struct {
		name    string
		kill    func(t *testing.T, d *Device)
		counted int // deaths in the tenant's churn
	}{
		{"a forged mark", func(t *testing.T, d *Device) {
			hole := loadFor(t, d, "t", "", testkit.Manifest("hole"), nil).(*program)
			h, mh := loadLeaving(t, d, "forger", "forge", nil)
			hole.Close()
			mark := fmt.Sprintf("%s%d in program %d", wire.FatalMark, 11, hole.id)
			mh.Chain[0].Block = wire.FatalFD // the bundle itself writes on the mark's pipe
			if err := runOnce(t, h, mh, []byte(mark), 10*time.Second); err != nil {
				t.Fatalf("forge: %v", err)
			}
		}, 1},
		{"an unload hook's crash", func(t *testing.T, d *Device) {
			c, _ := loadLeaving(t, d, "crasher", "echo", nil, "-DCRASH_UNLOAD")
			c.Close()
		}, 1},
		{"a marked crash of a program held", func(t *testing.T, d *Device) {
			mh := testkit.Manifest("hostile")
			mh.Library = "hostile.so"
			mh.Chain = []abi.Launch{{Kernel: "segv", Grid: 1, Block: 1}}
			h := loadFor(t, d, "t", testkit.HostileSource(), mh, nil)
			if err := runOnce(t, h, mh, nil, 10*time.Second); err == nil {
				t.Fatal("segv ran")
			}
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := tenantDevice(t)
			ms := testkit.Slow("slow", 1)
			slow := loadFor(t, d, "t", "", ms, nil).(*program)
			slowDone := startSlow(t, slow, ms, 5000)
			tc.kill(t, d)
			if lost, shared := collateral(<-slowDone); !lost || !shared {
				t.Errorf("the sibling's run in flight: lost %v, collateral %v; want a collateral loss", lost, shared)
			}
			<-slow.Exited() // the death counted (tenantDied) before
			d.mu.Lock()
			n := 0
			if c := d.churn["t"]; c != nil {
				n = len(c.deaths)
			}
			d.mu.Unlock()
			if n != tc.counted {
				t.Errorf("the tenant's back-off counts %d deaths, want %d", n, tc.counted)
			}
		})
	}
}

// A mark is believed only from the mark's own pipe. A bundle that echoes
// its client's bytes to stderr cannot let a client name a sibling: the
// client's mark is plain output, and the crash that follows on a thread of
// the bundle's own is unmarked, every program's (none retried). Written on
// the pipe by the bundle itself (a tenant naming its own sibling), it
// names the sibling, which alone loses the worker by its own fault.
func TestTenantClientTextIsNoMark(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		fd                   int
		forgerShared, shared bool // collateral: the forger's death, the sibling's
	}{
		{"echoed on stderr", 2, false, false},
		{"written on the mark's pipe", wire.FatalFD, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := tenantDevice(t)
			ms := testkit.Slow("slow", 1)
			slow := loadFor(t, d, "t", "", ms, nil).(*program)
			h, mh := loadLeaving(t, d, "forger", "forge", nil)
			slowDone := startSlow(t, slow, ms, 5000)
			mh.Chain[0].Block = tc.fd
			mark := fmt.Sprintf("%s%d in program %d", wire.FatalMark, 11, slow.id)
			if err := runOnce(t, h, mh, []byte(mark), 10*time.Second); err != nil {
				t.Fatalf("forge: %v", err)
			}
			serr := <-slowDone
			<-h.Exited()
			if lost, shared := collateral(serr); !lost || shared != tc.shared {
				t.Errorf("the sibling's run in flight: %v (lost %v, collateral %v); want a loss, collateral %v", serr, lost, shared, tc.shared)
			}
			if dh := h.Death(); dh == nil || dh.Collateral() != tc.forgerShared {
				t.Errorf("the forger's death: %v; want collateral %v", dh, tc.forgerShared)
			}
		})
	}
}

// Checked mode's report of a guard fault is believed only from a worker in
// checked mode, and only from its fault handler's own pipe (wire.FatalFD),
// never from its stderr: a bundle that echoes its client's bytes cannot
// have a crash told with a report the client wrote, not even as the last
// line before a crash that wrote none of its own (here on a thread of the
// bundle's own, a SIGSEGV as a guard fault's would be). The bundle itself
// can write on the pipe (the control: told), as it can the fatal mark.
func TestForgedFaultReportIsNotTold(t *testing.T) {
	report := device.FaultMark + "entry forge wrote past the end of out, at byte 1 (forged)"
	for _, scope := range []bool{false, true} {
		for _, tc := range []struct {
			name    string
			checked bool
			fd      int    // where the bundle writes
			echoed  string // what it writes there
			told    bool
		}{
			{"not in checked mode", false, 2, report, false},
			{"in checked mode, a line after it", true, 2, report + "\nworking on", false},
			{"in checked mode, the last line", true, 2, report, false},
			{"in checked mode, on the handler's pipe", true, wire.FatalFD, report, true},
		} {
			t.Run(fmt.Sprintf("tenant scope %v/%s", scope, tc.name), func(t *testing.T) {
				d := NewDevice(Options{Exe: os.Args[0], Base: device.NewHost(0), Landlock: true, StageDir: t.TempDir(),
					Spawner: spawner, TenantScope: scope, Checked: tc.checked})
				t.Cleanup(func() { d.Close() })
				h, mh := loadLeaving(t, d, "forger", "forge", nil)
				mh.Chain[0].Block = tc.fd
				if err := runOnce(t, h, mh, []byte(tc.echoed), 10*time.Second); err != nil {
					t.Fatalf("forge: %v", err)
				}
				<-h.Exited()
				dh := h.Death()
				if dh == nil || strings.Contains(dh.Error(), "(forged)") != tc.told {
					t.Fatalf("the death: %v; want the report told %v", dh, tc.told)
				}
			})
		}
	}
}

// In a tenant's worker in checked mode, a line one program wrote on
// stderr (here its client's bytes, shaped as checked mode's report) is
// never told as the report of another program's crash: that program's
// clients would read the sibling's output, which is not theirs to read
// (tenantOutput keeps it from them in the logs).
func TestSiblingLineIsNoFaultReport(t *testing.T) {
	d := NewDevice(Options{Exe: os.Args[0], Base: device.NewHost(0), Landlock: true, StageDir: t.TempDir(),
		Spawner: spawner, TenantScope: true, Checked: true})
	t.Cleanup(func() { d.Close() })
	s := funclog.New(nil)
	talker, mt := loadLeaving(t, d, "talker", "forge", s.Sink("talker"))
	mt.Chain[0].Grid, mt.Chain[0].Block = -1, 2 // the line alone, on stderr
	mc := crashManifest("hostile.so", "segv", 1)
	crasher := loadFor(t, d, "t", testkit.HostileSource(), mc, nil)
	if pidOf(talker) != pidOf(crasher) {
		t.Fatal("the tenant's programs are not in one worker")
	}
	line := device.FaultMark + "entry secret wrote past the end of out, at byte 7 (the talker's client's bytes)"
	quiet(t, crasher.(*program)) // the talker's line is then its own
	if err := runOnce(t, talker, mt, []byte(line), 10*time.Second); err != nil {
		t.Fatalf("talker: %v", err)
	}
	waitLines(t, s, "talker", func(l []api.LogLine) bool { return hasLine(l, "stderr", line) })
	err := runOnce(t, crasher, mc, nil, 10*time.Second)
	if lost, shared := collateral(err); !lost || shared {
		t.Fatalf("the crashing run: %v (lost %v, collateral %v); want its own loss", err, lost, shared)
	}
	if strings.Contains(err.Error(), "talker's client") {
		t.Errorf("the crasher's error tells its sibling's line as checked mode's report: %v", err)
	}
	<-crasher.(*program).Exited()
	if dc := crasher.(*program).Death(); dc == nil || strings.Contains(dc.Error(), "talker's client") {
		t.Errorf("the crasher's death: %v; want one without its sibling's line", dc)
	}
}

// A library the worker keeps mapped after its program's unload (CUDA's,
// never closed; here a host one linked -z nodelete) is loaded afresh when
// the same bundle is loaded again into that worker, its statics as a first
// load finds them: dlopen would hand back the mapped one, matched by its
// file's device and inode, were the staged file a link to the same file.
func TestTenantReloadGetsAFreshLibrary(t *testing.T) {
	d := tenantDevice(t)
	keep := loadFor(t, d, "t", "", testkit.Manifest("keep"), nil) // holds the worker
	dir := t.TempDir()
	m := testkit.Manifest("again")
	m.Library = "leaving.so"
	m.OutBytes = 8
	m.Chain = []abi.Launch{{Kernel: "runs", Grid: 1, Block: 1}}
	testkit.BuildLib(t, filepath.Join("testdata", "leaving.cc"), dir, m.Library, "-pthread", "-Wl,-z,nodelete")
	testkit.WriteManifest(t, dir, m)
	for load := range 3 {
		p, err := d.Load(context.Background(), device.ProgramSpec{Dir: dir, Manifest: m, Tenant: "t"})
		if err != nil {
			t.Fatalf("load %d: %v", load, err)
		}
		if pidOf(p) != pidOf(keep) {
			t.Fatalf("load %d went to worker %d, not the tenant's %d", load, pidOf(p), pidOf(keep))
		}
		in, err := p.NewInstance(device.InstanceConfig{MaxInput: m.MaxInputBytes, Out: m.OutBytes})
		if err != nil {
			t.Fatal(err)
		}
		for want := uint64(1); want <= 2; want++ {
			out := make([]byte, 8)
			if err := in.Run(&device.Run{Output: out, Chain: []device.Step{{Entry: 0, Grid: 1, Block: 1}}, Deadline: time.Now().Add(10 * time.Second)}); err != nil {
				t.Fatal(err)
			}
			if got := binary.LittleEndian.Uint64(out); got != want {
				t.Fatalf("load %d, run %d: the library's static says %d runs: the load got a library an earlier load had used", load, want, got)
			}
		}
		in.Close()
		p.Close()
	}
}

// lockProbe is a log handler that notes whether its device's lock was
// free while a record whose message holds watch was logged: polled for a
// while, as another goroutine may hold it a moment, but one held by the
// logging caller is never free.
type lockProbe struct {
	d     atomic.Pointer[Device]
	watch string

	mu   sync.Mutex
	seen []bool // per record watched: the lock was free
}

func (h *lockProbe) Enabled(context.Context, slog.Level) bool { return true }
func (h *lockProbe) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *lockProbe) WithGroup(string) slog.Handler            { return h }

func (h *lockProbe) Handle(_ context.Context, r slog.Record) error {
	d := h.d.Load()
	if d == nil || !strings.Contains(r.Message, h.watch) {
		return nil
	}
	free := false
	for end := time.Now().Add(time.Second); !free && time.Now().Before(end); time.Sleep(time.Millisecond) {
		if free = d.mu.TryLock(); free {
			d.mu.Unlock()
		}
	}
	h.mu.Lock()
	h.seen = append(h.seen, free)
	h.mu.Unlock()
	return nil
}

// records is what the probe saw.
func (h *lockProbe) records() []bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]bool(nil), h.seen...)
}

// probedTenantDevice is tenantDevice with its log probed for lines whose
// message holds watch.
func probedTenantDevice(t *testing.T, watch string) (*Device, *lockProbe) {
	t.Helper()
	h := &lockProbe{watch: watch}
	d := loggedTenantDevice(t, h)
	h.d.Store(d)
	return d, h
}

// A plover_unload that never returns holds up nobody who closed its
// program (an eviction for another tenant, the reaper, shutdown): Close
// returns after unloadWaited, and the unload's own bound ends the worker,
// the hook's program at fault, its sibling lost as collateral.
func TestTenantUnloadHookThatHangs(t *testing.T) {
	defer func(b, w time.Duration) { unloadBound, unloadWaited = b, w }(unloadBound, unloadWaited)
	unloadBound, unloadWaited = time.Second, 100*time.Millisecond
	d := tenantDevice(t)
	sib := loadFor(t, d, "t", "", testkit.Manifest("sibling"), nil).(*program)
	h, _ := loadLeaving(t, d, "hanger", "echo", nil, "-DHANG_UNLOAD")
	closed := make(chan struct{})
	go func() { h.Close(); close(closed) }()
	select {
	case <-closed:
		if h.p.killed.Load() != nil {
			t.Fatal("Close waited on a plover_unload that never returns until the unload's bound killed the worker")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close waited on a plover_unload that never returns for 10 s")
	}
	awaitClosed(t, sib.Exited(), "the worker's end at the unload's bound")
	var pe *ProcessExit
	if err := sib.Death(); !errors.As(err, &pe) || !pe.Shared || !strings.Contains(pe.Reason, "unloading a program") {
		t.Fatalf("the sibling's loss: %v; want a collateral one, the worker stopped while unloading a program", err)
	}
	awaitUnloads(t, d)
}
