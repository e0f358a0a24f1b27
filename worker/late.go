package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/loader"
)

// A late load is a load into a tenant's worker whose request gave up at
// its deadline (loadShared): the load goes on under its own bound. The
// next load of the same function's bundle for the same tenant on the
// device, in the same life of its name (the same ProgramSpec.Output), takes it over, finished or not, instead of starting another: a
// function whose load outlasts its callers' deadlines (large constants, a
// slow constructor) would otherwise be loaded and thrown away by every
// request and never warm, each load waiting behind the last on the
// worker's control channel. One left unclaimed for lateKeep after it
// finished is unloaded.
//
// A late load that fails by the function's own fault (lateLoss), or whose
// program's worker is lost by it before the load is taken over, is told
// to the next load of its key, once, as that load's own failure: the
// engine counts it as a crash or a failed hook, and backs the function
// off. Told no one, a load that crashed its tenant's worker after every
// request's deadline would take the siblings' worker down at every
// request, never counted (blame names it, so the tenant's churn does not
// count it either).
//
// Whoever holds a late load unloads its program if no one takes it: the
// keep timer while it is listed in Device.late, the takeLate that took it
// off the list, or, once dropped (a key lists one late load; a second is
// dropped), the load's own end.
type lateLoad struct {
	key  string
	out  device.Output // its ProgramSpec.Output: its function's, in one life of the name
	done chan struct{} // closed under Device.mu once the load ended, g or err set
	g    *program      // the program loaded, nil if none
	err  error         // the failure to tell the next load, nil if none (lateLoss)
	// dropped (under Device.mu): no one takes it over; its program is
	// unloaded as its load ends. Only a load not yet ended is dropped.
	dropped bool
}

// lateKeep is how long a finished late load waits to be taken over.
const lateKeep = 10 * time.Second

// lateFailKeep is how long a late load's failure waits to be told: the
// engine's crash window (engine.crashWindow), within which a crash counts
// towards the function's back-off.
const lateFailKeep = time.Minute

// lateKey names a function's bundle for a tenant: the unpacked bundle (one
// per version's bytes) and the function's name (two functions may have
// equal bytes; each program is its function's, its output too).
func lateKey(spec device.ProgramSpec) string {
	return spec.Tenant + "\x00" + spec.Dir + "\x00" + spec.Manifest.Name
}

// lateLoss reports a late load's failure that is told to the next load:
// the function's own, which the engine counts (a crash or a kill of its
// worker not collateral, a failed plover_load) or refuses the version for
// (a refused library). Not told, the next load starting afresh: a loss by
// another program's fault (collateral), the load's own bound passed (an
// ErrDeadline, not counted for a request's own load either), the device's
// memory short.
func lateLoss(err error) bool {
	if l, ok := device.AsLoss(err); ok {
		return !l.Collateral()
	}
	var ke *device.KernelError
	var le *loader.Error
	return errors.As(err, &ke) || errors.As(err, &le)
}

// putLate lists l for the next load of its key to take over, unless its
// load ended (false: its holder settles it, as no one else would). With
// another listed, l is dropped instead, unloaded as its load ends: the one
// listed is never displaced, which would leave no one to unload it.
func (d *Device) putLate(l *lateLoad) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	select {
	case <-l.done:
		return false
	default:
	}
	if d.late[l.key] != nil {
		l.dropped = true
	} else {
		d.late[l.key] = l
	}
	return true
}

// lateEnded is the end of l's load, g loaded or err its failure. A failure
// not told (lateLoss) is forgotten: the next load starts afresh. A listed
// program is unloaded after lateKeep, a failure forgotten after
// lateFailKeep, unless taken by then; a dropped program is unloaded now.
func (d *Device) lateEnded(l *lateLoad, g *program, err error) {
	if err != nil && !lateLoss(err) {
		err = nil
	}
	d.mu.Lock()
	l.g, l.err = g, err
	close(l.done)
	dropped := l.dropped
	if g == nil && err == nil && d.late[l.key] == l {
		delete(d.late, l.key)
	}
	d.mu.Unlock()
	switch {
	case dropped:
		if g != nil {
			g.Close()
		}
	case g != nil:
		time.AfterFunc(d.lateKeep, func() { d.unlist(l) })
	case err != nil:
		time.AfterFunc(lateFailKeep, func() { d.unlist(l) })
	}
}

// unlist ends l's wait to be taken over: unlisted, its program unloaded.
// One taken off the list already is its taker's.
func (d *Device) unlist(l *lateLoad) {
	d.mu.Lock()
	listed := d.late[l.key] == l
	if listed {
		delete(d.late, l.key)
	}
	d.mu.Unlock()
	if listed && l.g != nil {
		l.g.Close()
	}
}

// claimLate takes the late load of spec's key off the list: l, if it is
// of the same life of the name as spec, else the other life's program to
// unload (stale) if its load ended. Under d.mu, released by a defer: a
// load runs in its request's goroutine, whose panic the transport
// recovers, and a lock it left held would hang the device (tenantTurn).
func (d *Device) claimLate(spec device.ProgramSpec) (l *lateLoad, stale *program) {
	key := lateKey(spec)
	d.mu.Lock()
	defer d.mu.Unlock()
	l = d.late[key]
	delete(d.late, key)
	// Outputs are compared as tenantOutput does: == panics on values that
	// do not compare. Neither having one (a spec without) is one life.
	if l == nil || l.out == nil && spec.Output == nil || sameOutput(l.out, spec.Output) {
		return l, nil
	}
	// Another life of the name (the function deleted and deployed again
	// with the same bytes): its program prints to the deleted function's
	// output, its failure is not this one's. Unloaded here, or as its load
	// ends; this one loads afresh.
	select {
	case <-l.done:
		stale = l.g
	default:
		l.dropped = true
	}
	return nil, stale
}

// takeLate takes over the late load of spec's key, if there is one: its
// program once it finished (ok), or an error wrapping device.ErrDeadline
// if ctx ended first (the load put back for the next: putLate), or its
// failure or the loss of its program's worker, not collateral (ok, err
// set: told once). With no late load, or one whose failure or loss is not
// the function's (lateLoss, Collateral), ok is false: load afresh.
func (d *Device) takeLate(ctx context.Context, spec device.ProgramSpec) (g *program, ok bool, err error) {
	l, stale := d.claimLate(spec)
	if stale != nil {
		stale.Close()
	}
	if l == nil {
		return nil, false, nil
	}
	select {
	case <-l.done:
	case <-ctx.Done():
		if d.putLate(l) {
			return nil, true, fmt.Errorf("%w while an earlier request's load of the bundle went on", device.ErrDeadline)
		}
	}
	// l ended and is this call's alone: its program is returned or closed.
	if l.err != nil {
		return nil, true, fmt.Errorf("an earlier request's load of the bundle, which went on past that request's deadline: %w", l.err)
	}
	if l.g == nil {
		return nil, false, nil
	}
	if !l.g.Alive() { // reaped: its Death is known
		death := l.g.Death()
		l.g.Close()
		if death != nil && !death.Collateral() {
			return nil, true, fmt.Errorf("the worker of an earlier request's load of the bundle, which went on past that request's deadline, was lost: %w", death)
		}
		return nil, false, nil
	}
	return l.g, true, nil
}
