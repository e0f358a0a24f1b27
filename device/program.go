package device

// #include <stdlib.h>
import "C"

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/loader"
)

// Entries is a loaded library's entry table: what Step.Entry indexes, plus
// the bundle's plover_last_error. It grows when a request's chain override
// names a kernel the manifest does not; runs read it without a lock.
type Entries struct {
	lib       *loader.Library
	lastError unsafe.Pointer
	// program is what plover_load left in s->program; set before any
	// instance exists, then only read.
	program unsafe.Pointer

	mu    sync.Mutex
	index map[string]int32
	tab   atomic.Pointer[entryTable] // copied on growth
}

// entryTable is what Step.Entry indexes: each entry's function and its
// name as a C string (checked mode's reports name it from C).
type entryTable struct {
	fns   []unsafe.Pointer
	names []*C.char
}

// NewEntries is lib's entry table, empty until Resolve.
func NewEntries(lib *loader.Library) *Entries {
	e := &Entries{lib: lib, lastError: lib.LastError, index: map[string]int32{}}
	e.tab.Store(&entryTable{})
	return e
}

// Resolve returns kernel's index, resolving it (only functions the library
// itself defines: see loader.Info.CheckEntry) the first time.
func (e *Entries) Resolve(kernel string) (int32, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if i, ok := e.index[kernel]; ok {
		return i, nil
	}
	p, err := e.lib.Entry(kernel)
	if err != nil {
		return 0, err
	}
	old := e.tab.Load()
	i := int32(len(old.fns))
	e.index[kernel] = i
	e.tab.Store(&entryTable{fns: append(old.fns[:i:i], p), names: append(old.names[:i:i], C.CString(kernel))})
	return i, nil
}

// free releases the names; no run may follow.
func (e *Entries) free() {
	if e == nil {
		return
	}
	for _, n := range e.tab.Load().names {
		C.free(unsafe.Pointer(n))
	}
	e.tab.Store(&entryTable{})
}

// table is the current entry table, for one run.
func (e *Entries) table() *entryTable {
	if e == nil {
		return &entryTable{}
	}
	return e.tab.Load()
}

// name is entry i's name (nil outside the table).
func (t *entryTable) name(i int32) *C.char {
	if i < 0 || int(i) >= len(t.names) {
		return nil
	}
	return t.names[i]
}

func (e *Entries) abi1() bool { return e != nil && e.lib != nil && e.lib.ABI1 }

func (e *Entries) programPtr() unsafe.Pointer {
	if e == nil {
		return nil
	}
	return e.program
}

func (e *Entries) lastErrorFn() unsafe.Pointer {
	if e == nil {
		return nil
	}
	return e.lastError
}

// entryFn is step k's function, or an error for an index outside the table.
func entryFn(table *entryTable, s Step) (unsafe.Pointer, error) {
	if s.Entry < 0 || int(s.Entry) >= len(table.fns) {
		return nil, fmt.Errorf("chain step names entry %d; the program has %d", s.Entry, len(table.fns))
	}
	return table.fns[s.Entry], nil
}

// rawDevice is what an in-process program needs of its device.
type rawDevice interface {
	Name() string
	Target() string
	LoadConstants(r io.Reader, size int64) (Constants, error)
	// programHook runs the bundle's plover_load or plover_unload (if it
	// has it) on the program's constants with s->program set to program,
	// and returns the s->program the hook left.
	programHook(e *Entries, k hookKind, c Constants, program unsafe.Pointer) (unsafe.Pointer, error)
	NewInstance(cfg InstanceConfig) (Instance, error)
}

// program is a bundle loaded into this process.
type program struct {
	dev      rawDevice
	lib      *loader.Library
	ents     *Entries
	consts   Constants // nil: no constants
	priority string    // the manifest's class, for its instances
}

// loadProgram dlopens spec's library, resolves the manifest chain's kernels
// in abi.Kernels order (so they are entries 0..k-1) and uploads the constants.
func loadProgram(ctx context.Context, dev rawDevice, spec ProgramSpec) (Program, error) {
	m := spec.Manifest
	kernels := abi.Kernels(m.Chain)
	lib, err := loader.OpenBundle(spec.Dir, m, dev.Target())
	if err != nil {
		return nil, err
	}
	p := &program{dev: dev, lib: lib, ents: NewEntries(lib), priority: m.Priority}
	// A failed load frees what it made: the library, the entry names, the
	// constants (and calls no plover_unload after a failed plover_load).
	loaded := false
	defer func() {
		if !loaded {
			p.free()
		}
	}()
	for _, k := range kernels {
		if _, err := p.ents.Resolve(k); err != nil {
			return nil, err
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if m.Constants != "" {
		f, err := os.Open(filepath.Join(spec.Dir, m.Constants))
		if err != nil {
			return nil, fmt.Errorf("constants %s: %w", m.Constants, err)
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return nil, fmt.Errorf("constants %s: %w", m.Constants, err)
		}
		c, err := dev.LoadConstants(f, fi.Size())
		if err != nil {
			return nil, fmt.Errorf("cannot load %d bytes of constants on %s: %w", fi.Size(), dev.Name(), err)
		}
		p.consts = c
	}
	if p.ents.program, err = dev.programHook(p.ents, hookLoad, p.consts, nil); err != nil {
		return nil, err
	}
	loaded = true
	return p, nil
}

func (p *program) Entry(kernel string) (int32, error) { return p.ents.Resolve(kernel) }

func (p *program) ConstantsBytes() int64 {
	if p.consts == nil {
		return 0
	}
	return p.consts.Size()
}

func (p *program) NewInstance(cfg InstanceConfig) (Instance, error) {
	cfg.Constants, cfg.Entries, cfg.Priority = p.consts, p.ents, p.priority // Host passes through
	return p.dev.NewInstance(cfg)
}

// Close runs the bundle's plover_unload, then frees the constants and
// closes the library. The hook's failure is ignored, as fini's, unless it
// faulted the device once it ran (OwnFault): a process that shares the
// device with other programs must know whose fault that was.
func (p *program) Close() error {
	var unload error
	if p.lib != nil && p.lib.Unload != nil {
		_, unload = p.dev.programHook(p.ents, hookUnload, p.consts, p.ents.program)
	}
	err := p.free()
	if OwnFault(unload) {
		return errors.Join(unload, err)
	}
	return err
}

func (p *program) free() error {
	if p.consts != nil {
		p.consts.Free()
		p.consts = nil
	}
	p.ents.free()
	return p.lib.Close()
}

// The ABI 2 lifecycle hooks.
type hookKind int

const (
	hookLoad hookKind = iota
	hookInstanceInit
	hookInstanceFini
	hookUnload
)

func (e *Entries) hookFn(k hookKind) (unsafe.Pointer, string) {
	if e == nil || e.lib == nil {
		return nil, ""
	}
	switch k {
	case hookLoad:
		return e.lib.Load, abi.SymLoad
	case hookInstanceInit:
		return e.lib.InstanceInit, abi.SymInstanceInit
	case hookUnload:
		return e.lib.Unload, abi.SymUnload
	}
	return e.lib.InstanceFini, abi.SymInstanceFini
}
