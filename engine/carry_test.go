package engine

import (
	"testing"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/funclog"
	"github.com/plover-run/plover/registry"
)

// A crash counted on a version after an eviction or the reaper handed its
// record to the copy that took over (a worker dying between the detach
// and the teardown) is the copy's: it used to be counted on the old pool,
// which nobody reads any more. Chained copies pass it on.
func TestACrashAfterTheCarryIsTheSuccessors(t *testing.T) {
	tab := newTable(registry.Registry{}, funclog.New(nil), 0, 0)
	f := &function{name: "f"}
	rv := api.Version{ID: "v1"}
	old := tab.newVersion(f, rv)
	now := time.Now()
	old.pool.crashed(now)
	mid := old.pool.carryTo(tab.newVersion(f, rv))
	last := mid.pool.carryTo(tab.newVersion(f, rv))
	for i := 1; i < crashLimit; i++ {
		if old.pool.crashed(now) != (i == crashLimit-1) {
			t.Fatalf("crash %d on the first pool: back-off %v", i+1, i != crashLimit-1)
		}
	}
	if err := last.pool.backingOff(now); err == nil {
		t.Fatalf("%d crashes, all but one after the carries, and the last copy does not back off", crashLimit)
	}
	if o, m := old.pool.crashCount.Load(), mid.pool.crashCount.Load(); o != 1 || m != 1 {
		t.Fatalf("crashes on the carried pools: %d and %d, want the one each had when it was carried", o, m)
	}
	if !last.pool.failing(now) || tab.newVersion(f, rv).pool.failing(now) {
		t.Fatal("failing: a backing-off pool not failing, or a fresh one failing")
	}
}
