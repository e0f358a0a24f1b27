package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/loader"
	"github.com/plover-run/plover/sched"
)

// version is one deployed bundle of a function on this node: its load
// (load.go: written once) and its run pool (pool.go: its program on each
// device it runs on, its instances, the requests on it and its crashes).
type version struct {
	fn  *function
	rec api.Version // as it was made with: read-only
	lg  *slog.Logger

	// maxIn and out are the record's copies of the manifest's
	// max_input_bytes and out_bytes, for Pin before the version is loaded:
	// a record written before the copies has zeros, which a later deploy of
	// the same bundle fills in (registry.fillCopies) and a refresh brings
	// here (fill), so rec's are not read for them.
	maxIn, out atomic.Int64

	// side: a version pipeline steps pinned that is not the function's
	// current one (Engine.PinVersion); cleared if it becomes current.
	side atomic.Bool
	// warming: a warm to min_instances is under way, a top-up's or
	// another's (warmCurrent), and no other is to begin beside it.
	warming atomic.Bool
	// warmFailed: the last warm of v failed (warmTaken), so that the
	// reaper tries again one that failed before v was loaded (topUp).
	warmFailed atomic.Bool
	// warmRefused: why a warm of v failed in a way no later try mends on
	// this node (notWarmed), so that the reaper does not try it again
	// every back-off, warning each time, for good; nil: none known. A
	// new version is a new *version, and starts without one.
	warmRefused atomic.Pointer[warmRefusal]
	toppedAt    atomic.Int64 // Unix ns of the last top-up's start
	topFails    atomic.Int32 // top-ups failed in a row

	loadState
	pool pool
}

// placement is v's program on one device.
type placement struct {
	dev  device.Device
	name string // dev's name, read once: requests carry it (Request.Device)
	prog device.Program
	// consts is prog's constants' bytes on dev, read once at its load:
	// the ledger reads it without the pool's lock, while a teardown may
	// be closing prog (which forgets them: a data race, review G LOW 9).
	consts int64
	flow   *sched.Flow // the function's queue in dev's scheduler; nil: unscheduled
	// dead: the program's process is gone; its instances are discarded as
	// they come back and the next instance loads a new program.
	dead atomic.Bool
	// cold is how the program came to be, until the request whose cold
	// start it was logs it (with that request's whole load time).
	cold atomic.Pointer[coldLoad]
}

// coldLoad is a program load's breakdown, in milliseconds.
type coldLoad struct {
	fetched            bool
	fetchMs, programMs float64
}

type instance struct {
	inst     device.Instance
	dev      *placement
	bytes    int64
	made     time.Duration // how long NewInstance took (buffers, plover_instance_init)
	lastUsed time.Time
	run      device.Run // reused for every request on this instance
}

// override checks a per-request chain and sizes against v's manifest. The
// chain's kernels are resolved later, by the program that runs it.
func (v *version) override(o *call.Override) (int64, int64, error) {
	m := v.manifest
	if o.Chain != nil {
		if err := abi.ValidateChain("chain", o.Chain); err != nil {
			if fe, ok := abi.AsFieldError(err); ok {
				return 0, 0, errorf(errdefs.KindInvalid, err, "%s: %s", o.Field(fe.Field), fe.Reason)
			}
			return 0, 0, errorf(errdefs.KindInvalid, err, "%s", err.Error())
		}
	}
	out, tmp := m.OutBytes, m.TmpBytes
	if o.OutBytes >= 0 {
		if o.OutBytes > m.OutBytes {
			return 0, 0, errorf(errdefs.KindInvalid, nil, "%s: %d is over the manifest's out_bytes, %d", o.Field("out_bytes"), o.OutBytes, m.OutBytes)
		}
		out = o.OutBytes
	}
	if o.TmpBytes >= 0 {
		if o.TmpBytes > m.TmpBytes {
			return 0, 0, errorf(errdefs.KindInvalid, nil, "%s: %d is over the manifest's tmp_bytes, %d", o.Field("tmp_bytes"), o.TmpBytes, m.TmpBytes)
		}
		tmp = o.TmpBytes
	}
	return out, tmp, nil
}

// entryWaiter is a program whose entry lookups wait their turn (on a
// tenant's worker's control channel, behind another function's load):
// the wait ends with ctx.
type entryWaiter interface {
	EntryContext(ctx context.Context, kernel string) (int32, error)
}

// resolveChain is an override chain's steps on p's program, for a request
// of ctx due by deadline (zero: none), which bounds the lookups' waits.
func (v *version) resolveChain(ctx context.Context, p *placement, o *call.Override, deadline time.Time) ([]device.Step, error) {
	chain := o.Chain
	if !deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	steps := make([]device.Step, len(chain))
	for i, l := range chain {
		var e int32
		var err error
		if w, ok := p.prog.(entryWaiter); ok {
			e, err = w.EntryContext(ctx, l.Kernel)
		} else {
			e, err = p.prog.Entry(l.Kernel)
		}
		if errors.Is(err, device.ErrNotStarted) { // the program is intact, and nothing ran
			if errors.Is(ctx.Err(), context.Canceled) { // the client went, not the deadline
				return nil, errorf(errdefs.KindGone, err, "function %s: the client went away before %s could be looked up", v.fn.name, o.Field(fmt.Sprintf("chain[%d].kernel", i)))
			}
			return nil, errorf(errdefs.KindTimeout, err, "function %s: the request's deadline passed before %s could be looked up", v.fn.name, o.Field(fmt.Sprintf("chain[%d].kernel", i)))
		}
		if err != nil {
			if _, lost := device.AsLoss(err); lost || errors.Is(err, device.ErrDeadline) {
				return nil, err // the worker's trouble, not the chain's
			}
			return nil, errorf(errdefs.KindInvalid, err, "%s: function %s %s", o.Field(fmt.Sprintf("chain[%d].kernel", i)), v.fn.name, reason(err))
		}
		steps[i] = device.Step{Entry: e, Grid: int32(l.Grid), Block: int32(l.Block)}
	}
	return steps, nil
}

// manifestSteps is m's chain as entries of a program that resolved
// abi.Kernels(m.Chain) in order (see device.Program.Entry).
func manifestSteps(m *abi.Manifest) []device.Step {
	index := map[string]int32{}
	for i, k := range abi.Kernels(m.Chain) {
		index[k] = int32(i)
	}
	steps := make([]device.Step, len(m.Chain))
	for i, l := range m.Chain {
		steps[i] = device.Step{Entry: index[l.Kernel], Grid: int32(l.Grid), Block: int32(l.Block)}
	}
	return steps
}

func reason(err error) string {
	if le, ok := err.(*loader.Error); ok {
		return le.Reason
	}
	return fmt.Sprint(err)
}

// tenantOf is whose program v's is, for a device that keeps tenants
// apart: the deploying token's name it was recorded with. Without one,
// and an auth file naming tenants, nothing says who deployed it (a
// version recorded before tenants were, or published straight to the
// store): it is its function's alone, never lumped with another token's;
// a model repository's versions are the operator's, one tenant. The
// names made here cannot be a token's (parentheses and spaces).
func (e *Engine) tenantOf(v *version) string {
	switch {
	case v.rec.Tenant != "" || !e.cfg.NamedTenants:
		return v.rec.Tenant
	case v.rec.Label != "":
		return "(model repository)"
	}
	return "(function " + v.fn.name + ")"
}

// match is f's version that ref names, current first, or nil; under
// table.mu. An id or prefix comes first; else a label (a model
// repository's version folder) names the version the record names by it,
// its latest (Record.Find: a folder deployed again makes a newer), if
// that one is current or pinned here: a label the current version has
// names a later version deployed beside it with the same label (a folder
// rewritten while a higher one could not be made current), which the
// caller then pins (PinVersion), never the current one that carried it
// first. Before any record is applied, the current version if it has the
// label, else the latest pinned one with it.
func (f *function) match(ref string) *version {
	if f.cur != nil && f.cur.rec.Matches(ref) {
		return f.cur
	}
	for _, v := range f.pinned {
		if v.rec.Matches(ref) {
			return v
		}
	}
	if f.labels != nil {
		id, ok := f.labels[ref]
		switch {
		case !ok:
			return nil // no version has it now (unlabelled): the record says so
		case f.cur != nil && f.cur.rec.ID == id:
			return f.cur
		}
		return f.pinned[id]
	}
	if f.cur != nil && f.cur.rec.Names(ref) {
		return f.cur
	}
	var found *version
	for _, v := range f.pinned {
		if v.rec.Names(ref) && (found == nil || v.rec.Created.After(found.rec.Created)) {
			found = v
		}
	}
	return found
}

// learn takes from rec (nil: none read) what a later read may say of the
// versions f knows: their record copies (fill) and f's labels. Labels are
// not taken from a record read before one f applied (PinVersion's, beside
// a refresh, applied after it), which must not name an older version again.
// Under table.mu.
func (f *function) learn(rec *api.Record) {
	if rec == nil {
		return
	}
	for i := range rec.Versions {
		if v := f.known(rec.Versions[i].ID); v != nil {
			v.fill(&rec.Versions[i])
		}
	}
	if f.labels != nil && len(rec.Versions) < f.labelsFrom {
		return
	}
	labels := make(map[string]string)
	for _, v := range rec.Versions { // in deploy order: the latest last
		if v.Label != "" {
			labels[v.Label] = v.ID
		}
	}
	f.labels, f.labelsFrom = labels, len(rec.Versions)
}

// fill takes rv's copies where it has them (a record that has them, of
// the same bundle: they cannot differ from any v has). A copy past what a
// manifest may say (a record written by hand) is taken for none: a
// pipeline's reckoning adds them up, and a huge one would wrap it.
func (v *version) fill(rv *api.Version) {
	if rv.MaxInputBytes > 0 && rv.MaxInputBytes <= abi.MaxBufferBytes {
		v.maxIn.Store(rv.MaxInputBytes)
	}
	if rv.OutBytes > 0 && rv.OutBytes <= abi.MaxBufferBytes {
		v.out.Store(rv.OutBytes)
	}
}

// known is f's version whose id is id, current or pinned; nil if none.
// Under table.mu.
func (f *function) known(id string) *version {
	if f.cur != nil && f.cur.rec.ID == id {
		return f.cur
	}
	return f.pinned[id]
}
