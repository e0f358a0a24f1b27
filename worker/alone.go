package worker

import (
	"path/filepath"
	"strings"
	"sync"

	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/loader"
)

// A library that defines GNU unique symbols (loader.Info.Unique: g++'s
// C++ inline functions' statics, templates' static members) cannot share
// a process with another program: the dynamic linker binds each such name
// once per process, RTLD_LOCAL or not, so two bundles of a tenant defining
// one (two functions built from one header library, or two versions of
// one function during a redeploy) would run on one object, the second
// with the first's state. In tenant scope such a program runs in a worker
// of its own: a tenant key its function's and bundle's alone.

// uniqueMemo keeps, by library path (under a cache entry named by its
// bundle's sha256: its bytes never change), whether the library defines
// GNU unique symbols, so that a cold start reads its ELF once a process.
type uniqueMemo struct {
	mu sync.Mutex
	m  map[string][]string
}

// uniqueMemoMax bounds the memo: past it, it starts again.
const uniqueMemoMax = 4096

// alone returns spec with a tenant of its own where its library defines
// GNU unique symbols, spec unchanged otherwise, or where the library
// cannot be read (the worker's own check then says why).
func (d *Device) alone(spec device.ProgramSpec) device.ProgramSpec {
	lib := filepath.Join(spec.Dir, spec.Manifest.Library)
	unique, first := d.unique.of(lib)
	if len(unique) == 0 {
		return spec
	}
	if first {
		shown := unique[:min(len(unique), 3)]
		d.opts.Log.Info("the function's bundle defines GNU unique symbols, which one process shares between all its libraries: it runs in a worker of its own, not its tenant's (build it with -fno-gnu-unique to share one)",
			"function", spec.Manifest.Name, "tenant", spec.Tenant, "symbols", strings.Join(shown, " "), "count", len(unique))
	}
	// Parentheses and spaces: no token's name can be this, nor another
	// function's or bundle's key.
	spec.Tenant += " (alone: " + spec.Manifest.Name + " " + filepath.Base(spec.Dir) + ")"
	return spec
}

// of returns lib's GNU unique symbols, and whether this was the first
// time they were looked up.
func (u *uniqueMemo) of(lib string) ([]string, bool) {
	u.mu.Lock()
	unique, ok := u.m[lib]
	u.mu.Unlock()
	if ok {
		return unique, false
	}
	info, err := loader.Inspect(lib) // no lock held: it reads the file
	if err != nil {
		return nil, false
	}
	u.mu.Lock()
	if u.m == nil || len(u.m) >= uniqueMemoMax {
		u.m = map[string][]string{}
	}
	u.m[lib] = info.Unique
	u.mu.Unlock()
	return info.Unique, true
}
