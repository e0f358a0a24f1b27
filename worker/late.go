package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/plover-run/plover/device"
)

// A late load is a load into a tenant's worker whose request gave up at
// its deadline (loadShared): the load goes on under its own bound. The
// next load of the same function's bundle for the same tenant on the
// device takes it over, finished or not, instead of starting another: a
// function whose load outlasts its callers' deadlines (large constants, a
// slow constructor) would otherwise be loaded and thrown away by every
// request and never warm, each load waiting behind the last on the
// worker's control channel. One left unclaimed for lateKeep after it
// finished is unloaded.
type lateLoad struct {
	key  string
	done chan struct{} // closed once the load ended, g or err set
	g    *program
	err  error
}

// lateKeep is how long a finished late load waits to be taken over.
const lateKeep = 10 * time.Second

// lateKey names a function's bundle for a tenant: the unpacked bundle (one
// per version's bytes) and the function's name (two functions may have
// equal bytes; each program is its function's, its output too).
func lateKey(spec device.ProgramSpec) string {
	return spec.Tenant + "\x00" + spec.Dir + "\x00" + spec.Manifest.Name
}

// putLate records l for the next load of its key to take over.
func (d *Device) putLate(l *lateLoad) {
	d.mu.Lock()
	d.late[l.key] = l
	d.mu.Unlock()
}

// lateEnded is the end of l's load: a failed one is forgotten (the next
// load starts afresh); a finished one is unloaded after lateKeep unless
// it was taken over by then.
func (d *Device) lateEnded(l *lateLoad, g *program, err error) {
	l.g, l.err = g, err
	close(l.done)
	if err != nil {
		d.mu.Lock()
		if d.late[l.key] == l {
			delete(d.late, l.key)
		}
		d.mu.Unlock()
		return
	}
	time.AfterFunc(d.lateKeep, func() {
		d.mu.Lock()
		unclaimed := d.late[l.key] == l
		if unclaimed {
			delete(d.late, l.key)
		}
		d.mu.Unlock()
		if unclaimed {
			g.Close()
		}
	})
}

// takeLate takes over the late load of spec's key, if there is one: its
// program once it finished (ok), or an error wrapping device.ErrDeadline
// if ctx ended first (the load is left for the next). With no late load,
// or one that failed or whose worker died, ok is false: load afresh.
func (d *Device) takeLate(ctx context.Context, spec device.ProgramSpec) (g *program, ok bool, err error) {
	key := lateKey(spec)
	d.mu.Lock()
	l := d.late[key]
	delete(d.late, key)
	d.mu.Unlock()
	if l == nil {
		return nil, false, nil
	}
	select {
	case <-l.done:
	case <-ctx.Done():
		d.putLate(l)
		return nil, true, fmt.Errorf("%w while an earlier request's load of the bundle went on", device.ErrDeadline)
	}
	if l.err != nil {
		return nil, false, nil
	}
	if !l.g.Alive() {
		l.g.Close()
		return nil, false, nil
	}
	return l.g, true, nil
}
