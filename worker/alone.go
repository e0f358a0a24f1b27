package worker

import (
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/loader"
)

// In tenant scope some bundles run in a worker of their own, never beside
// another program, not even another of the same bytes (ownKey, placeKey):
//
//   - a library that defines GNU unique symbols of its own code
//     (loader.Info.OwnUnique: g++'s C++ inline functions' statics,
//     templates' static members; not the standard library's): the
//     dynamic linker binds each such name once per process, RTLD_LOCAL or
//     not, so two programs defining one (two functions built from one
//     header library, or two versions of one function, even of the same
//     bytes) would run on one object, the second with the first's state;
//   - a bundle whose load into its tenant's worker ran past loadBound: the
//     kill for it ended every sibling there, and would again at each of
//     its loads, a minute apart at most, too few for any back-off. Alone,
//     a hang of its load ends only its own worker. Marked on this device
//     while the server runs (and while the memo keeps it);
//   - a function's bundle whose chain, or an instance's creation, ran past
//     its request's deadline in a worker it shared with other programs
//     (overran): the kill for it ended them all, and the deadline is the
//     client's to choose (X-Plover-Timeout-Ms, from 1 ms), so any caller
//     could end its siblings' worker at will, a success between two kills
//     clearing the function's back-off each time. Alone, its overruns end
//     only its own worker, as in function scope. Marked by function and
//     bundle, as hungAtLoad's is (a redeploy's bundle starts unmarked);
//   - a bundle whose library dlopen refused in its tenant's worker once
//     that process held other programs (refusedBeside): what they hold
//     can be the cause, which a fresh process would not have, and a
//     refusal is the version's for good on this node (the engine's
//     version.refused). It is loaded again at once in a worker of its own,
//     and marked as hungAtLoad's is; refused there too, the refusal stands.

// ownWorkers keeps, by library path (under a cache entry named by its
// bundle's sha256: its bytes never change), why the bundle needs a worker
// of its own ("": it does not), so that a cold start reads its ELF once a
// process.
type ownWorkers struct {
	mu sync.Mutex
	m  map[string]string
	// overran is the bundles marked by overran, by function: a program
	// knows its function and bundle directory, not its manifest's library.
	overran map[bundleKey]bool
	// shareOverrun (tests) has overran mark nothing: the tenant chaos
	// test's invariant is every tenant's programs in one worker, hung
	// ones included.
	shareOverrun bool
	seq          atomic.Uint64 // the workers of their own placed so far
}

// ownKey returns spec, its tenant made its function's and bundle's alone
// where it needs a worker of its own or force says so (alone: its late
// loads are then taken over by its next load, as any's, under that key; it
// is placed by a key of one load's, placeKey).
func (d *Device) ownKey(spec device.ProgramSpec, force bool) (_ device.ProgramSpec, alone bool) {
	if !force && !d.needsOwn(spec) {
		return spec, false
	}
	spec.Tenant += " (alone: " + spec.Manifest.Name + " " + filepath.Base(spec.Dir) + ")"
	return spec, true
}

// placeKey is the spec to place a program needing a worker of its own by:
// a tenant no other load has, so that it gets a fresh worker each time
// (parentheses, spaces and #: no token's name can be these).
func (o *ownWorkers) placeKey(spec device.ProgramSpec) device.ProgramSpec {
	spec.Tenant += " #" + strconv.FormatUint(o.seq.Add(1), 10)
	return spec
}

// ownWorkersMax bounds the memo: past it, it starts again.
const ownWorkersMax = 4096

// needsOwn reports whether spec's program runs in a worker of its own in
// tenant scope. A library that cannot be read shares (the worker's own
// check then says why it cannot load).
func (d *Device) needsOwn(spec device.ProgramSpec) bool {
	lib := filepath.Join(spec.Dir, spec.Manifest.Library)
	d.own.mu.Lock()
	overran := d.own.overran[bundleKey{spec.Manifest.Name, spec.Dir}]
	why, ok := d.own.m[lib]
	d.own.mu.Unlock()
	if overran {
		return true
	}
	if ok {
		return why != ""
	}
	info, err := loader.Inspect(lib) // no lock held: it reads the file
	if err != nil {
		return false
	}
	if own := info.OwnUnique(); len(own) > 0 {
		shown := own[:min(len(own), 3)]
		why = "its library defines GNU unique symbols (" + strings.Join(shown, " ") + "), which one process shares between all its libraries"
	}
	return d.setOwn(spec, lib, why)
}

// hungAtLoad has spec's bundle load in a worker of its own from now on:
// its load into its tenant's worker ran past loadBound.
func (d *Device) hungAtLoad(spec device.ProgramSpec) {
	d.setOwn(spec, filepath.Join(spec.Dir, spec.Manifest.Library), "its load into its tenant's worker ran past its bound, and the kill for it ended the worker with any other functions in it")
}

// setOwn records why (or "") for lib, logging a reason the first time it
// is given; it reports whether the bundle needs a worker of its own.
func (d *Device) setOwn(spec device.ProgramSpec, lib, why string) bool {
	d.own.mu.Lock()
	if d.own.m == nil || len(d.own.m) >= ownWorkersMax {
		d.own.m = map[string]string{}
	}
	was := d.own.m[lib]
	if was == "" {
		d.own.m[lib] = why
	}
	d.own.mu.Unlock()
	if was == "" && why != "" {
		d.opts.Log.Info("the function's bundle runs in a worker of its own, not its tenant's: "+why,
			"function", spec.Manifest.Name, "tenant", spec.Tenant, "bundle", filepath.Base(spec.Dir))
	}
	return why != "" || was != ""
}

// overran has g's function's bundle run in a worker of its own from now
// on, where the server is about to kill, or has killed, g's worker for g's
// chain or instance creation past its request's deadline (during says
// which) and the worker held other programs (shared; the caller looks, as
// only it knows when the kill was made). Its current program needs no
// move: it dies with the worker, and its next load is placed afresh
// (ownKey).
func (d *Device) overran(g *program, during string, shared bool) {
	if !shared {
		return // its own worker already, or no one beside it to end
	}
	k := g.bundleKey()
	d.own.mu.Lock()
	if d.own.shareOverrun {
		d.own.mu.Unlock()
		return
	}
	if d.own.overran == nil || len(d.own.overran) >= ownWorkersMax {
		d.own.overran = map[bundleKey]bool{}
	}
	was := d.own.overran[k]
	d.own.overran[k] = true
	d.own.mu.Unlock()
	if was {
		return
	}
	d.mu.Lock()
	tenant := g.p.tenant.name
	d.mu.Unlock()
	d.opts.Log.Info("the function's bundle runs in a worker of its own, not its tenant's: its request's deadline (its client's choice) passed while "+during+
		", and the kill for it ended the worker with the other functions in it",
		"function", g.name, "tenant", tenant, "bundle", filepath.Base(g.dir))
}

// holdsBeside reports whether p, a tenant's worker, holds a program other
// than g: a kill for g would end that one too.
func (p *proc) holdsBeside(g *program) bool {
	if p.tenant == nil {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, o := range p.tenant.progs {
		if o != g {
			return true
		}
	}
	return false
}

// refusedBeside is a library's refusal by dlopen (loader.OpenFailed) in
// its tenant's worker once that process held other programs, err: what
// they hold may be the cause (glibc's static TLS reserve, which each
// library with initial-exec TLS takes part of; the process's mappings; a
// dependency of the same soname loaded for another), and a fresh process
// may load it. loadShared loads it again in a worker of its own. It is no
// *loader.Error: the engine takes one for a refusal that will not change
// and refuses the version for good, and a late load's is told to no one
// (lateLoss), its next load going alone.
type refusedBeside struct{ err error }

func (e *refusedBeside) Error() string {
	return e.err.Error() + " (beside its tenant's other functions: it is loaded again in a worker of its own)"
}

// besideRefusal is err, the failure of g's load, as a refusedBeside where
// it is one (g not alone), the bundle marked to run in a worker of its own
// from now on (setOwn, which logs it once) unless the refusal is one of
// the moment; else err as it is.
func (d *Device) besideRefusal(spec device.ProgramSpec, g *program, alone bool, err error) error {
	reason, ok := loader.OpenFailed(err)
	if alone || !ok || !g.p.heldOthers() {
		return err
	}
	if !momentary(reason) {
		d.setOwn(spec, filepath.Join(spec.Dir, spec.Manifest.Library),
			"its library could not be loaded beside its tenant's other functions, which may hold what it needs ("+reason+"); it is loaded again alone")
	}
	return &refusedBeside{err}
}

// momentary reports whether reason, dlopen's, is a shortage of the
// moment (memory to map the library, descriptors) rather than what the
// siblings hold for good (their static TLS, a dependency of one soname):
// this load goes alone all the same, but the bundle is not marked, as one
// such refusal marked it for the server's life, a process (on a GPU, a
// CUDA context) more at each of its loads (the 60th's LOW).
func momentary(reason string) bool {
	if strings.Contains(reason, "static TLS") {
		return false
	}
	for _, m := range []string{"failed to map segment", "Cannot allocate memory", "Too many open files", "Resource temporarily unavailable"} {
		if strings.Contains(reason, m) {
			return true
		}
	}
	return false
}

// heldOthers reports whether p, a tenant's worker, has held a program
// other than the one loading now, at any time: ids are never reused, and
// a program unloaded may leave its libraries mapped, its static TLS
// taken.
func (p *proc) heldOthers() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.tenant != nil && p.tenant.nextID > 1
}
