package worker

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/funclog"
	"github.com/plover-run/plover/internal/testkit"
)

// markCrashSource is testdata/markcrash.cc: partial_segv, crash_at_unload
// and echo.
var markCrashSource = filepath.Join("testdata", "markcrash.cc")

// churnDeaths is how many deaths of tenant's workers count towards its
// back-off on d.
func churnDeaths(d *Device, tenant string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if c := d.churn[tenant]; c != nil {
		return len(c.deaths)
	}
	return 0
}

// A crash in one program's run names that program however it comes: in
// checked mode (whose own SIGSEGV handler takes the fault first), and
// after a line the bundle began on stderr and did not end. The crasher
// loses the worker as its own crash, saying checked mode's report of a
// guard fault; the sibling whose run was in flight loses it as collateral
// (retried), without the crasher's report; the tenant's back-off does not
// count the death, and the handler's line reaches no function's log.
func TestTenantCrashIsNamed(t *testing.T) {
	for _, tc := range []struct {
		name    string
		checked bool
		src     string
		m       *abi.Manifest
		reason  string // in the crasher's error
		report  string // checked mode's, in the crasher's error alone ("": none)
	}{
		{"segv", false, testkit.HostileSource(), crashManifest("hostile.so", "segv", 1), "SIGSEGV", ""},
		{"segv checked", true, testkit.HostileSource(), crashManifest("hostile.so", "segv", 1), "SIGSEGV", ""},
		{"abort checked", true, testkit.HostileSource(), crashManifest("hostile.so", "abort_now", 1), "SIGABRT", ""},
		{"guard fault checked", true, testkit.OverrunSource(), guardFaultManifest(), "SIGSEGV", "entry overrun wrote past the end of out, at byte 4096 (4000 bytes this request)"},
		{"after a partial line", false, markCrashSource, crashManifest("markcrash.so", "partial_segv", 1), "SIGSEGV", ""},
		{"after a partial line checked", true, markCrashSource, crashManifest("markcrash.so", "partial_segv", 1), "SIGSEGV", ""},
		// 5,200 bytes: the line is cut at api.LogLineMax before the mark.
		{"after a long partial line", false, markCrashSource, crashManifest("markcrash.so", "partial_segv", 400), "SIGSEGV", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := NewDevice(Options{Exe: os.Args[0], Base: device.NewHost(0), Landlock: true, StageDir: t.TempDir(),
				Spawner: spawner, TenantScope: true, Checked: tc.checked})
			t.Cleanup(func() { d.Close() })
			s := funclog.New(nil)
			h := loadFor(t, d, "t", tc.src, tc.m, s.Sink("crasher"))
			ms := testkit.Slow("slow", 1)
			slow := loadFor(t, d, "t", "", ms, s.Sink("slow"))
			if pidOf(h) != pidOf(slow) {
				t.Fatal("the tenant's programs are not in one worker")
			}
			slowDone := startSlow(t, slow, ms, 5000)
			err := runOnce(t, h, tc.m, nil, 10*time.Second)
			var pe *ProcessExit
			if lost, shared := collateral(err); !lost || shared || !errors.As(err, &pe) || !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("the crashing run: %v (a loss %v, collateral %v), want its own loss naming %s", err, lost, shared, tc.reason)
			}
			if tc.report != "" && !strings.Contains(err.Error(), tc.report) {
				t.Errorf("the crashing run: %v, want checked mode's report %q", err, tc.report)
			}
			serr := <-slowDone
			if lost, shared := collateral(serr); !lost || !shared {
				t.Errorf("the sibling's run in flight: %v (lost %v, collateral %v), want a collateral loss", serr, lost, shared)
			}
			if dh, ds := h.(*program).Death(), slow.(*program).Death(); dh == nil || dh.Collateral() || ds == nil || !ds.Collateral() {
				t.Errorf("deaths: %v and %v, want the crasher's own and the sibling's collateral", dh, ds)
			}
			for _, e := range []error{serr, slow.(*program).Death()} {
				if tc.report != "" && e != nil && strings.Contains(e.Error(), tc.report) {
					t.Errorf("the sibling's loss tells the crasher's checked-mode report: %v", e)
				}
			}
			if n := churnDeaths(d, "t"); n != 0 {
				t.Errorf("the named crash counted towards the tenant's back-off: %d deaths", n)
			}
			for _, name := range []string{"crasher", "slow"} {
				for _, l := range s.Lines(name, time.Time{}) {
					if strings.Contains(l.Line, "fatal signal") {
						t.Errorf("the handler's line reached %s's output: %+v", name, l)
					}
				}
			}
		})
	}
}

// guardFaultManifest writes 5000 bytes past the end of out (4000 bytes):
// onto the guard page after it, in checked mode.
func guardFaultManifest() *abi.Manifest {
	m := testkit.OverrunManifest("crasher", 5000, 4000, 0)
	m.Chain = m.Chain[1:]
	return m
}

// crashManifest is a one-entry manifest of library lib.
func crashManifest(lib, kernel string, grid int) *abi.Manifest {
	m := testkit.Manifest("crasher")
	m.Library = lib
	m.Chain = []abi.Launch{{Kernel: kernel, Grid: grid, Block: 1}}
	return m
}

// A crash in plover_unload names the program unloaded, whichever of the
// worker's threads drops its last reference: the instance's goroutine (the
// unload reached the worker before the instance's end) or the control
// loop (the instance ended first). The program is gone, so no one left is
// at fault: the sibling whose run was in flight loses the worker as
// collateral (retried), and the death counts towards the tenant's
// back-off, the one bound left on a program that cannot be backed off.
func TestTenantUnloadHookCrashIsNamed(t *testing.T) {
	for _, unloadFirst := range []bool{true, false} {
		t.Run(map[bool]string{true: "unload first", false: "instance first"}[unloadFirst], func(t *testing.T) {
			d := tenantDevice(t)
			mc := crashManifest("markcrash.so", "crash_at_unload", 1)
			c := loadFor(t, d, "t", markCrashSource, mc, nil).(*program)
			in, err := c.NewInstance(device.InstanceConfig{MaxInput: mc.MaxInputBytes, Tmp: mc.TmpBytes, Out: mc.OutBytes})
			if err != nil {
				t.Fatal(err)
			}
			if err := in.Run(&device.Run{Output: make([]byte, 8), Chain: []device.Step{{Entry: 0, Grid: 1, Block: 1}},
				Deadline: time.Now().Add(10 * time.Second)}); err != nil {
				t.Fatalf("arming the unload hook: %v", err)
			}
			ms := testkit.Slow("slow", 1)
			slow := loadFor(t, d, "t", "", ms, nil).(*program)
			slowDone := startSlow(t, slow, ms, 5000)
			if unloadFirst {
				c.Close()
				in.Close()
			} else {
				maps := slotMaps(t, c.p.pid)
				in.Close()
				// The worker unmaps the instance's slot as its goroutine
				// ends, just before it drops its reference.
				waitFor(t, "the worker to end the instance", func() bool { return slotMaps(t, c.p.pid) < maps })
				c.Close()
			}
			select {
			case <-slow.Exited():
			case <-time.After(10 * time.Second):
				t.Fatal("the unload hook's crash did not end the worker")
			}
			if lost, shared := collateral(<-slowDone); !lost || !shared {
				t.Errorf("the sibling's run in flight: lost %v, collateral %v; want a collateral loss (%s)", lost, shared, c.p.reason)
			}
			// Named, but by a program no longer loaded, which nothing can
			// back off alone: the death counts towards the tenant's
			// back-off (as a forged mark naming such a program does).
			if n := churnDeaths(d, "t"); n != 1 {
				t.Errorf("a crash named by the unloaded program counted %d deaths towards the tenant's back-off, want 1", n)
			}
		})
	}
}
