package worker

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

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

// A request whose deadline passes while its program loads into its
// tenant's worker gives up at once (ErrDeadline) and kills nothing: the
// sibling runs on in the same process, and the late program is unloaded
// once its load ends.
func TestTenantLoadPastDeadlineKeepsTheWorker(t *testing.T) {
	d := tenantDevice(t)
	ms := testkit.Manifest("sibling")
	sib := loadFor(t, d, "t", "", ms, nil).(*program)
	dir := t.TempDir()
	m := testkit.Manifest("slow")
	m.Library = "slowload.so"
	testkit.BuildLib(t, filepath.Join("testdata", "slowload.cc"), dir, m.Library, "-DSLOW_MS=700")
	testkit.WriteManifest(t, dir, m)
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
