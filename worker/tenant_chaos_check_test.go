package worker

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"
)

// The checks of TestTenantChaos: the device against what its goroutines
// hold, between rounds and at the end.

// patience is how long a check waits for the state it wants: 10 s, but
// not once the test failed (a wait per check would draw it out).
func (c *chaos) patience() time.Duration {
	if c.t.Failed() {
		return time.Second
	}
	return 10 * time.Second
}

// settle polls, for 10 s at most, until the device is as the programs
// held say (mismatch), and fails with the last difference otherwise.
func (c *chaos) settle(when string) {
	var diff string
	for end := time.Now().Add(c.patience()); ; time.Sleep(5 * time.Millisecond) {
		if diff = c.mismatch(); diff == "" {
			return
		}
		if time.Now().After(end) {
			break
		}
	}
	c.failf(nil, "%s, the device is not as the programs held say: %s", when, diff)
}

// mismatch says how the device differs from what the goroutines hold
// ("": it does not), all of them stopped.
func (c *chaos) mismatch() string {
	live := map[string][]*chaosProg{} // by tenant
	var used int64
	for _, w := range c.workers {
		for _, cp := range w.held {
			if cp.in != nil {
				used += cp.in.DeviceBytes()
			}
			if cp.g.Alive() {
				live[w.tenant] = append(live[w.tenant], cp)
				continue
			}
			// Lost with a worker a sibling crashed or hung, not yet noticed.
			if why := c.why(cp.g.PID()); why == "" {
				return fmt.Sprintf("%s of tenant %s lost its worker, which the test did not end", cp, w.tenant)
			}
			if dg := cp.g.Death(); dg == nil || !dg.Collateral() {
				return fmt.Sprintf("%s lost its worker by another's crash; its death %v is not collateral", cp, dg)
			}
		}
	}
	if got := c.d.used.Load(); got != used {
		return fmt.Sprintf("the device counts %d bytes used, the instances held %d", got, used)
	}
	if n := c.d.running.Load(); n != 0 {
		return fmt.Sprintf("%d runs in flight with every goroutine stopped", n)
	}
	c.d.mu.Lock()
	late, procs := len(c.d.late), len(c.d.procs)
	c.d.mu.Unlock()
	if late != 0 {
		return fmt.Sprintf("%d late loads left listed", late)
	}
	if procs != len(live) {
		return fmt.Sprintf("%d worker processes for %d tenants with live programs", procs, len(live))
	}
	for _, tenant := range []string{"t1", "t2"} {
		if diff := c.tenantMismatch(tenant, live[tenant]); diff != "" {
			return "tenant " + tenant + ": " + diff
		}
	}
	return c.stagesMismatch()
}

// tenantMismatch says how tenant's worker differs from its live programs
// held.
func (c *chaos) tenantMismatch(tenant string, live []*chaosProg) string {
	c.d.mu.Lock()
	slot := c.d.tenants[tenant]
	var sp *proc
	var refs int
	if slot != nil {
		sp, refs = slot.p, slot.refs
	}
	c.d.mu.Unlock()
	if len(live) == 0 {
		if slot != nil && sp != nil && sp.alive() {
			return fmt.Sprintf("no live program held, but its slot holds live worker %d (refs %d)", sp.pid, refs)
		}
		return ""
	}
	p := live[0].g.p
	var want []uint32
	var mapped int64
	wantFiles := map[string]bool{}
	for _, cp := range live {
		if cp.g.p != p {
			return fmt.Sprintf("its live programs are in workers %d and %d", p.pid, cp.g.p.pid)
		}
		want = append(want, cp.g.id)
		for _, f := range cp.g.staged {
			wantFiles[filepath.Base(f)] = true
		}
		if cp.in != nil {
			mapped += int64(len(cp.in.(*instance).slot))
		}
		cp.g.slots.mu.Lock()
		for _, s := range cp.g.slots.all {
			mapped += s.maxIn + s.out
		}
		cp.g.slots.mu.Unlock()
	}
	if sp != p || refs != len(live) {
		spid := 0
		if sp != nil {
			spid = sp.pid
		}
		return fmt.Sprintf("its slot holds worker %d with %d refs, want worker %d with %d", spid, refs, p.pid, len(live))
	}
	p.mu.Lock()
	var got []uint32
	for id := range p.tenant.progs {
		got = append(got, id)
	}
	p.mu.Unlock()
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		return fmt.Sprintf("worker %d holds programs %v, the goroutines %v", p.pid, got, want)
	}
	if got := dirNames(p.stage); !maps.Equal(got, wantFiles) {
		return fmt.Sprintf("worker %d's stage holds %v, its programs' files are %v", p.pid, slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(wantFiles)))
	}
	p.slots.mu.Lock()
	gotMapped := p.slots.mapped
	p.slots.mu.Unlock()
	if gotMapped != mapped {
		return fmt.Sprintf("worker %d counts %d bytes of slots mapped, its programs' instances and pool slots %d", p.pid, gotMapped, mapped)
	}
	return ""
}

// stagesMismatch: the stage directory holds one stage per worker process.
func (c *chaos) stagesMismatch() string {
	want := map[string]bool{}
	c.d.mu.Lock()
	for p := range c.d.procs {
		want[filepath.Base(p.stage)] = true
	}
	c.d.mu.Unlock()
	if got := dirNames(c.d.opts.StageDir); !maps.Equal(got, want) {
		var extra []string
		for name := range got {
			if !want[name] {
				extra = append(extra, fmt.Sprintf("%s holding %v", name, slices.Sorted(maps.Keys(dirNames(filepath.Join(c.d.opts.StageDir, name))))))
			}
		}
		return fmt.Sprintf("the stage directory holds %v, the workers' stages are %v; no worker's: %v",
			slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)), extra)
	}
	return ""
}

// checkEmpty checks, everything unloaded, that no tenant slot, no death
// counted towards a back-off, and no goroutine or descriptor of the
// play is left (polled for: the workers' readers end as they are reaped).
func (c *chaos) checkEmpty() {
	c.d.mu.Lock()
	tenants, churn := len(c.d.tenants), 0
	for _, ch := range c.d.churn {
		churn += len(ch.deaths)
	}
	c.d.mu.Unlock()
	if tenants != 0 {
		c.failf(nil, "%d tenant slots left with every program unloaded", tenants)
	}
	if churn != 0 {
		c.failf(nil, "%d deaths counted towards tenants' back-off; every death the test caused was named", churn)
	}
	var g, fds int
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if g, fds = runtime.NumGoroutine(), openFDs(c.t); g <= c.goroutines+1 && fds <= c.fds {
			return
		}
	}
	c.failf(nil, "%d goroutines and %d descriptors left, %d and %d at the start", g, fds, c.goroutines, c.fds)
}

// openFDs is how many descriptors the test process has open.
func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents) - 1 // ReadDir's own
}

func dirNames(dir string) map[string]bool {
	ents, _ := os.ReadDir(dir)
	names := map[string]bool{}
	for _, e := range ents {
		names[e.Name()] = true
	}
	return names
}
