package worker

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/fileutil"
	"github.com/plover-run/plover/internal/testkit"
)

// churnBundles builds the test kernels once and gives n bundle
// directories of them, each a function of its own (c0, c1, ...) with its
// own copy of the library, as n deploys give: a tenant's worker tells
// bundles apart by their directory. Their manifests limit them to mb MiB.
func churnBundles(t *testing.T, n int, mb int64) ([]string, []*abi.Manifest) {
	t.Helper()
	m := testkit.Manifest("c0")
	built := bundleFor(t, "", m)
	dirs, ms := make([]string, n), make([]*abi.Manifest, n)
	for i := range n {
		mi := testkit.Manifest(fmt.Sprintf("c%d", i))
		mi.MaxHostMemoryMB = mb
		dirs[i], ms[i] = t.TempDir(), mi
		if err := fileutil.Copy(filepath.Join(built, m.Library), filepath.Join(dirs[i], m.Library)); err != nil {
			t.Fatal(err)
		}
		testkit.WriteManifest(t, dirs[i], mi)
	}
	return dirs, ms
}

// A tenant that keeps one function loaded never lets its worker end, and
// each bundle unloaded beside it stayed counted in the worker's memory
// limit (an unloaded bundle's heap may stay): functions deployed, invoked
// and deleted beside it raised the limit by theirs at each cycle, for
// good (64 MiB functions: 96 MiB, then 6521 MiB after 100 cycles, the
// worker's resident memory ~12 MB throughout). Now the worker takes no
// new load once what it carries for bundles it no longer holds passes
// four times the most its held ones were allowed at once: its limit stays
// within about five times that, the tenant's next load starts a worker
// whose limit starts afresh, and the held function goes on being served
// where it is, a run of it in flight as the worker is retired included. A
// bundle unloaded and loaded again (scale to zero and back) counts once
// and retires nothing, however large beside its sibling, and so does a
// set of them in turn (three functions: retired at the third's unload as
// first mended, every later cold start then a process of its own).
func TestTenantChurnKeepsTheMemoryLimitBounded(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mb      int64 // each cycling function's limit, MiB
		set     int   // how many bundles the cycles load in turn (cycles: each a new one, a deploy)
		cycles  int
		most    int64 // MiB: the most a worker of the tenant may be given meanwhile
		retired bool  // the cycling loads leave the held function's worker
	}{
		// Held 64 beside 64 at once (peak 128): retired when the ninth
		// bundle gone brings what it carries to 576 (over 512), its
		// limit 640.
		{"deploys and deletes beside a held function", 64, 12, 12, 640, true},
		{"a function scaling to zero and back beside it", 64, 1, 6, 128, false},
		{"three scaling to zero in turn beside it", 64, 3, 12, 256, false},
		{"a larger one scaling to zero and back", 1024, 1, 4, 1088, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := tenantDevice(t)
			km := testkit.Manifest("keep")
			km.MaxHostMemoryMB = 64
			keep := loadFor(t, d, "t", "", km, nil)
			w := keep.(*program).p
			dirs, ms := churnBundles(t, tc.set, tc.mb)
			left := false
			for i := range tc.cycles {
				j := i % tc.set
				g, err := d.Load(context.Background(), device.ProgramSpec{Dir: dirs[j], Manifest: ms[j], Tenant: "t"})
				if err != nil {
					t.Fatalf("cycle %d: %v", i, err)
				}
				if got := g.(*program).p.memLimit.Load(); got > tc.most<<20 {
					t.Fatalf("cycle %d: %s's worker is given %d MiB, want %d at most", i, ms[j].Name, got>>20, tc.most)
				}
				if in := g.(*program).p == w; !in {
					left = true
				} else if left {
					t.Fatalf("cycle %d: loaded into the held function's worker again after it was retired", i)
				}
				echoes(t, g, ms[j])
				slow := startSlow(t, keep, km, 100)
				g.Close()
				if err := <-slow; err != nil {
					t.Fatalf("cycle %d: keep's run in flight as %s was unloaded: %v", i, ms[j].Name, err)
				}
				echoes(t, keep, km)
				if got := w.memLimit.Load(); got > tc.most<<20 {
					t.Fatalf("after cycle %d: the held function's worker is given %d MiB, want %d at most", i, got>>20, tc.most)
				}
			}
			if left != tc.retired {
				t.Errorf("the cycling loads left the held function's worker: %v, want %v", left, tc.retired)
			}
			if !w.alive() {
				t.Error("the held function's worker ended while it held it")
			}
		})
	}
}

// A function without a limit once loaded left its tenant's worker with
// none for the worker's life, which a sibling held loaded made endless:
// every function the tenant loaded later ran unbounded. Now the worker
// takes no new load once the last function without a limit it held is
// unloaded: the next load starts a worker with a limit of its own, while
// the held function is served where it is.
func TestTenantUnlimitedFunctionGoneRetiresItsWorker(t *testing.T) {
	d := tenantDevice(t)
	keep := loadLimited(t, d, "keep", 64)
	w := keep.(*program).p
	free := loadLimited(t, d, "free", 0)
	if pidOf(free) != w.pid || w.memLimit.Load() != 0 {
		t.Fatalf("the function without a limit: worker %d (keep's %d), its limit %d MiB, want keep's with none", pidOf(free), w.pid, w.memLimit.Load()>>20)
	}
	free.Close()
	next := loadLimited(t, d, "next", 64)
	if got := next.(*program).p.memLimit.Load(); got != 64<<20 {
		t.Errorf("a function loaded after the one without a limit left is given %d MiB (0: none), want 64", got>>20)
	}
	if next.(*program).p == w {
		t.Error("it was loaded into the worker that held the function without a limit")
	}
	echoes(t, keep, testkit.Manifest("keep"))
}
