package worker

import (
	"fmt"
	"time"
)

// A tenant's back-off. Whatever blame decides, a tenant whose workers keep
// dying makes the server start process after process for it (a standby
// taken, staged, the bundles loaded again): past churnLimit deaths of its
// worker on a device within churnWindow, no new worker is started for it
// there for churnHold, and its loads fail at once (an error the engine
// answers with 503). A live worker of the tenant is not affected: loading
// into it starts no process. Only deaths with no one program named count
// (tenantDied): those blamed on every program, which the engine cannot
// pin on one function, and those pinned on a program no longer held (an
// unloaded one's mark: blame), which no function counts.
const (
	churnLimit  = 10
	churnWindow = 30 * time.Second
	churnHold   = 10 * time.Second
)

// tenantChurn is a tenant's recent worker deaths on a device, oldest
// first, and until when it is held.
type tenantChurn struct {
	deaths []time.Time
	until  time.Time
}

// tenantDied counts the death of p, a tenant's worker, unless it ended by
// design (with its last program: none left in it; the server stopping) or
// blame named the one program at fault: that one's crashes are the
// engine's to count, and to back it off alone (a function crashing now
// and then, its successes between, would otherwise hold its siblings).
// The hold it starts is logged once the device's lock is let go.
func (d *Device) tenantDied(p *proc) {
	if p.tenant == nil {
		return
	}
	p.mu.Lock()
	n, given, named, name := len(p.tenant.progs), p.tenant.given, p.tenant.named, p.tenant.name
	p.mu.Unlock()
	if n == 0 || !given || named || !d.countDeath(name, time.Now()) {
		return
	}
	d.opts.Log.Warn("a tenant's workers keep dying: none is started for it for a while", "tenant", name,
		"deaths", churnLimit, "within", churnWindow, "hold", churnHold, "last_pid", p.pid, "reason", p.reason)
}

// countDeath counts a death of tenant's worker at now, and says whether
// it starts a hold.
func (d *Device) countDeath(tenant string, now time.Time) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return false
	}
	for t, c := range d.churn { // forget the tenants that calmed down
		if len(c.deaths) > 0 && now.Sub(c.deaths[len(c.deaths)-1]) > churnWindow && now.After(c.until) {
			delete(d.churn, t)
		}
	}
	c := d.churn[tenant]
	if c == nil {
		c = &tenantChurn{}
		d.churn[tenant] = c
	}
	for len(c.deaths) > 0 && now.Sub(c.deaths[0]) > churnWindow {
		c.deaths = c.deaths[1:]
	}
	c.deaths = append(c.deaths, now)
	if len(c.deaths) < churnLimit {
		return false
	}
	c.until, c.deaths = now.Add(churnHold), nil
	return true
}

// churnHeld is the error of a load for tenant while it is held (under
// d.mu), nil if it is not.
func (d *Device) churnHeld(tenant string) error {
	c := d.churn[tenant]
	if c == nil || !time.Now().Before(c.until) {
		return nil
	}
	return fmt.Errorf("%s: tenant %q: its worker died %d times within %v: no new worker is started for it until %s",
		d.Name(), tenant, churnLimit, churnWindow, c.until.UTC().Format(time.RFC3339))
}
