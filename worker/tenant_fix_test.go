package worker

import (
	"testing"

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
