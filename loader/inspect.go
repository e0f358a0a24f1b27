// Package loader opens bundle libraries: it checks a file is a shared object
// for this machine that exports the Plover ABI symbols, dlopens it and
// resolves entry points. cgo for dlopen lives here and in package device only.
package loader

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/plover-run/plover/abi"
)

// Error says why a library was refused. Reason is meant for the user.
type Error struct {
	Path   string
	Reason string
	Err    error
}

func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("library %s: %s: %v", e.Path, e.Reason, e.Err)
	}
	return fmt.Sprintf("library %s: %s", e.Path, e.Reason)
}

func (e *Error) Unwrap() error { return e.Err }

// dlopenFailed leads the Reason of an Error for a library that passed the
// static checks and that dlopen then refused (open).
const dlopenFailed = "dlopen failed: "

// OpenFailed returns dlopen's reason where err is a library's refusal by
// dlopen itself, after the static checks passed: one that can depend on
// what the process holds already (its static TLS reserve, which every
// library with initial-exec TLS takes part of; its mappings; a library
// of the same soname that another loaded), not on the file alone.
func OpenFailed(err error) (reason string, ok bool) {
	var le *Error
	if errors.As(err, &le) && strings.HasPrefix(le.Reason, dlopenFailed) {
		return le.Reason, true
	}
	return "", false
}

// Info is what a static read of a bundle library finds, without running any
// of its code.
type Info struct {
	ABI     abi.ABIVersion // plover_abi_version, decoded
	Target  string
	Exports map[string]bool // defined, global dynamic symbols
	Funcs   map[string]bool // the subset that are functions
	// Declared lists the entries an ABI 2 bundle declared with PLOVER_ENTRY
	// (its plover_entries section), sorted; nil for ABI 1.
	Declared []string
	// MaxItems is what PLOVER_BATCHED declared (ABI 2.1): the most requests
	// the chain handles in one run; 0 for a bundle that does not batch.
	MaxItems uint32
	// Unique lists the library's GNU unique symbols (STB_GNU_UNIQUE: g++
	// makes C++ inline functions' statics and templates' static members
	// so, unless built with -fno-gnu-unique): the dynamic linker binds
	// each name once per process whatever RTLD_LOCAL says, so two
	// libraries defining one share its object (and neither unloads).
	Unique []string
}

// stbGNUUnique is STB_GNU_UNIQUE, the GNU binding in STB_LOOS's place.
const stbGNUUnique = elf.STB_LOOS

// Declares reports whether an ABI 2 bundle declared name as an entry.
func (info *Info) Declares(name string) bool {
	for _, d := range info.Declared {
		if d == name {
			return true
		}
	}
	return false
}

var machines = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// Inspect reads the ELF headers and dynamic symbols of path and the values of
// plover_abi_version and plover_target. It refuses anything that is not a
// 64-bit little-endian shared object for this CPU.
func Inspect(path string) (info *Info, err error) {
	// debug/elf trusts more of a file than a tenant's library deserves
	// (a section header marked compressed left it a nil reader, read
	// through): whatever it panics on is this library's refusal, never
	// the server's or the client's crash.
	defer func() {
		if p := recover(); p != nil {
			info, err = nil, &Error{Path: path, Reason: fmt.Sprintf("malformed ELF file (reading it failed: %v)", p)}
		}
	}()
	f, err := os.Open(path)
	if err != nil {
		return nil, &Error{Path: path, Reason: "cannot open", Err: err}
	}
	defer f.Close()
	var magic [4]byte
	if _, err := io.ReadFull(f, magic[:]); err != nil || !bytes.Equal(magic[:], []byte(elf.ELFMAG)) {
		return nil, &Error{Path: path, Reason: "not an ELF shared library (bad magic)"}
	}
	ef, err := elf.NewFile(f)
	if err != nil {
		return nil, &Error{Path: path, Reason: "corrupt ELF file", Err: err}
	}
	defer ef.Close()
	if ef.Class != elf.ELFCLASS64 || ef.Data != elf.ELFDATA2LSB {
		return nil, &Error{Path: path, Reason: fmt.Sprintf("ELF is %v %v, want 64-bit little-endian", ef.Class, ef.Data)}
	}
	if want, ok := machines[runtime.GOARCH]; ok && ef.Machine != want {
		return nil, &Error{Path: path, Reason: fmt.Sprintf("built for %v, this machine is %v", ef.Machine, want)}
	}
	if ef.Type != elf.ET_DYN {
		return nil, &Error{Path: path, Reason: fmt.Sprintf("ELF type is %v, want a shared object (ET_DYN)", ef.Type)}
	}
	if err := boundSymbols(ef); err != nil {
		return nil, &Error{Path: path, Reason: err.Error()}
	}
	syms, err := ef.DynamicSymbols()
	if err != nil {
		return nil, &Error{Path: path, Reason: "no dynamic symbol table", Err: err}
	}
	info = &Info{Exports: make(map[string]bool, len(syms)), Funcs: map[string]bool{}}
	var verSym, targetSym, itemsSym *elf.Symbol
	for i := range syms {
		s := &syms[i]
		if s.Section == elf.SHN_UNDEF || elf.ST_BIND(s.Info) == elf.STB_LOCAL {
			continue
		}
		info.Exports[s.Name] = true
		if elf.ST_BIND(s.Info) == stbGNUUnique {
			info.Unique = append(info.Unique, s.Name)
		}
		if t := elf.ST_TYPE(s.Info); t == elf.STT_FUNC || t == elf.STT_GNU_IFUNC {
			info.Funcs[s.Name] = true
		}
		switch s.Name {
		case abi.SymABIVersion:
			verSym = s
		case abi.SymTarget:
			targetSym = s
		case abi.SymMaxItems:
			itemsSym = s
		}
	}
	for _, name := range []string{abi.SymABIVersion, abi.SymTarget, abi.SymLastError} {
		if !info.Exports[name] {
			return nil, &Error{Path: path, Reason: fmt.Sprintf("does not export %s: build it with PLOVER_BUNDLE(\"host\"|\"cuda\") from plover.h", name)}
		}
	}
	// The runtime calls plover_last_error after every chain and hook: as
	// data, its address would be called (hooks get this check in Open).
	if !info.Funcs[abi.SymLastError] {
		return nil, &Error{Path: path, Reason: fmt.Sprintf("exports %s, but not as a function (const char *%s(void), which PLOVER_BUNDLE defines)", abi.SymLastError, abi.SymLastError)}
	}
	ver, err := symbolBytes(ef, verSym, 4)
	if err != nil {
		return nil, &Error{Path: path, Reason: "cannot read " + abi.SymABIVersion, Err: err}
	}
	info.ABI = abi.DecodeVersion(binary.LittleEndian.Uint32(ver))
	tgt, err := symbolBytes(ef, targetSym, 0)
	if err != nil {
		return nil, &Error{Path: path, Reason: "cannot read " + abi.SymTarget, Err: err}
	}
	if i := bytes.IndexByte(tgt, 0); i >= 0 {
		tgt = tgt[:i]
	}
	info.Target = string(tgt)
	if itemsSym != nil {
		b, err := symbolBytes(ef, itemsSym, 4)
		if err != nil {
			return nil, &Error{Path: path, Reason: "cannot read " + abi.SymMaxItems, Err: err}
		}
		info.MaxItems = binary.LittleEndian.Uint32(b)
	}
	if info.ABI.Major >= 2 {
		if info.Declared, err = declaredEntries(ef); err != nil {
			return nil, &Error{Path: path, Reason: "cannot read section " + abi.EntriesSection, Err: err}
		}
	}
	return info, nil
}

// declaredEntries reads the NUL-separated names PLOVER_ENTRY put in the
// plover_entries section (the linker may pad between object files with
// NULs, hence the empty names skipped).
func declaredEntries(ef *elf.File) ([]string, error) {
	sec := ef.Section(abi.EntriesSection)
	if sec == nil {
		return []string{}, nil
	}
	if sec.Type == elf.SHT_NOBITS || sec.Size > 1<<20 {
		return nil, fmt.Errorf("section is %v of %d bytes", sec.Type, sec.Size)
	}
	data, err := sec.Data()
	if err != nil {
		return nil, err
	}
	names := []string{}
	for _, n := range bytes.Split(data, []byte{0}) {
		// Only a name a chain could run: PLOVER_ENTRY writes
		// identifiers, and anything else (control bytes, a terminal's
		// escapes) would reach deploy answers, the index and logs.
		if len(n) > 0 && abi.ValidSymbol(string(n)) {
			names = append(names, string(n))
		}
	}
	sort.Strings(names) // the compiler's order is no one's intent
	return names, nil
}

// symbolBytes returns the bytes a defined data symbol points at; n = 0 means
// the symbol's own size (bounded to 64 bytes, enough for a target name).
func symbolBytes(ef *elf.File, s *elf.Symbol, n uint64) ([]byte, error) {
	if n == 0 {
		n = min(s.Size, 64)
	}
	if int(s.Section) >= len(ef.Sections) {
		return nil, errors.New("symbol in no section")
	}
	sec := ef.Sections[s.Section]
	if sec.Flags&elf.SHF_COMPRESSED != 0 || sec.ReaderAt == nil {
		// The dynamic linker reads no section headers: a loadable
		// section marked compressed in its header is a lie about the
		// bytes it maps (and debug/elf gives it no ReaderAt).
		return nil, fmt.Errorf("symbol in section %s, which its header says is compressed: a loaded section never is", sec.Name)
	}
	if sec.Type == elf.SHT_NOBITS || s.Value < sec.Addr || s.Value+n > sec.Addr+sec.Size {
		return nil, errors.New("symbol outside its section's data")
	}
	buf := make([]byte, n)
	if _, err := sec.ReadAt(buf, int64(s.Value-sec.Addr)); err != nil {
		return nil, err
	}
	return buf, nil
}

// Check verifies an inspected library against the device target and the
// kernels a chain names. It is the part of Open that runs no code.
func (info *Info) Check(path, target string, kernels []string) error {
	if err := abi.Accept(info.ABI); err != nil {
		return &Error{Path: path, Reason: err.Error()}
	}
	if info.Target != target {
		return &Error{Path: path, Reason: fmt.Sprintf("built for target %q, the device is %q", info.Target, target)}
	}
	for _, k := range kernels {
		if err := info.CheckEntry(k); err != nil {
			return &Error{Path: path, Reason: err.Error()}
		}
	}
	return nil
}

// CheckHooks refuses, in an ABI 2 bundle, an exported function that looks
// like a hook but that the runtime never calls, so that deploy says so
// instead of the function running without it (s->program NULL, wrong
// answers): a name with the reserved prefix one typo from a hook's
// (plover_instance_int), or a C++ function of a hook's name, or one typo
// from it, whose name is mangled (another signature, a namespace or class,
// which plover.h's extern "C" declaration of the hooks does not cover).
// Deploy runs it, not a program's load (Check): refused there, a bundle
// deployed before it, exporting an author's plover_log, would stop
// loading after an upgrade. Another function of the prefix two typos or
// more from a hook (plover_sum, plover_lock) is left alone.
func (info *Info) CheckHooks(path string) error {
	if info.ABI.Major < 2 {
		return nil // ABI 1 has no hooks: a plover_ function there is no one's
	}
	funcs := make([]string, 0, len(info.Funcs))
	for f := range info.Funcs {
		funcs = append(funcs, f)
	}
	sort.Strings(funcs) // the same refusal for the same library
	for _, f := range funcs {
		name := mangledName(f)
		var reason string
		switch {
		case strings.HasPrefix(f, abi.ReservedPrefix) && !slices.Contains(abi.ReservedFunctions, f) && abi.OneTypo(f, abi.Hooks) != "":
			reason = fmt.Sprintf("exports the function %s, which the runtime never calls: no ABI function has that name (did you mean %q?)", f, abi.OneTypo(f, abi.Hooks))
		case slices.Contains(abi.Hooks, name):
			reason = fmt.Sprintf("exports %s, a C++ function named %s that is not the hook, which the runtime never calls: its name is mangled (C++ linkage: another signature, a namespace or class, or a plover.h older than its declaration of the hooks); define it at global scope as PLOVER_EXPORT void %s(plover_state_t *s)", f, name, name)
		case strings.HasPrefix(name, abi.ReservedPrefix) && abi.OneTypo(name, abi.Hooks) != "":
			reason = fmt.Sprintf("exports %s, a C++ function named %s, which the runtime never calls (did you mean %q?)", f, name, abi.OneTypo(name, abi.Hooks))
		default:
			continue
		}
		return &Error{Path: path, Reason: reason}
	}
	return nil
}

// mangledName is the unqualified name of a C++ function's symbol mangled
// as the Itanium ABI does it: _Z<length><name>... at namespace scope,
// _ZN<length><name>...E... nested; plover_load for both
// _Z11plover_loadPv and _ZN2ns11plover_loadEP12plover_state. "" for any
// other symbol, and for forms this does not read (templates, operators,
// std::, local entities).
func mangledName(sym string) string {
	rest, ok := strings.CutPrefix(sym, "_Z")
	if !ok {
		return ""
	}
	nested := false
	if r, ok := strings.CutPrefix(rest, "N"); ok {
		rest, nested = strings.TrimLeft(r, "rVKRO"), true // the qualifiers of a member function
	}
	name := ""
	for {
		i := 0
		for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
			i++
		}
		n, err := strconv.Atoi(rest[:i])
		if i == 0 || err != nil || n <= 0 || n > len(rest)-i {
			break
		}
		name, rest = rest[i:i+n], rest[i+n:]
		if !nested {
			return name
		}
	}
	if nested && strings.HasPrefix(rest, "E") {
		return name
	}
	return ""
}

// CheckEntry allows only functions the library itself defines, outside the
// reserved plover_ prefix and names starting with an underscore, and for ABI
// 2 bundles only the entries the bundle declared. dlsym on a
// library handle also searches its dependencies, so without this a chain
// could name "system" from libc; and a C++ library defines many functions
// that are no entry points (mangled "_Z..." template instantiations, "_init"
// and "_fini"), which an invoker must not be able to call.
func (info *Info) CheckEntry(name string) error {
	switch {
	case strings.HasPrefix(name, abi.ReservedPrefix):
		return fmt.Errorf("kernel %q: names starting with %q are reserved for the ABI", name, abi.ReservedPrefix)
	case strings.HasPrefix(name, "_"):
		return fmt.Errorf("kernel %q: names starting with an underscore are reserved (C++ mangled names, _init, _fini): an entry point is a PLOVER_ENTRY", name)
	case !info.Funcs[name]:
		return fmt.Errorf("kernel %q is not in the library%s", name, info.missingHint(name))
	case info.Declared != nil && len(info.Declared) == 0:
		return fmt.Errorf("kernel %q: the bundle declares no entries (no %s section: define entries with PLOVER_ENTRY, and link without --gc-sections or with a compiler that knows __attribute__((retain)))", name, abi.EntriesSection)
	case info.Declared != nil && !info.Declares(name):
		return fmt.Errorf("kernel %q is not a declared entry (define entries with PLOVER_ENTRY); this bundle declares %s%s", name, listed(info.Declared), didYouMean(name, info.Declared))
	}
	return nil
}

// missingHint says, for a kernel the library does not export, what it has
// instead: a C++ function of that name without PLOVER_ENTRY (exported
// mangled), the declared entries, and the closest of them.
func (info *Info) missingHint(name string) string {
	mangled := fmt.Sprintf("%d%s", len(name), name) // the Itanium ABI's <length><name>
	for f := range info.Funcs {
		if strings.HasPrefix(f, "_Z") && strings.Contains(f, mangled) {
			return fmt.Sprintf(": %s is a C++ function (exported as %s, its name mangled), not an entry point: define it with PLOVER_ENTRY(%s)", name, f, name)
		}
	}
	entries := info.Declared
	if entries == nil { // ABI 1: the exported functions that could be entries
		for f := range info.Funcs {
			if !strings.HasPrefix(f, "_") && !strings.HasPrefix(f, abi.ReservedPrefix) {
				entries = append(entries, f)
			}
		}
		sort.Strings(entries)
	}
	if len(entries) == 0 {
		return " (it declares no entries: define them with PLOVER_ENTRY)"
	}
	hint := "; this bundle declares " + listed(entries)
	if typo := didYouMean(name, entries); typo != "" || info.Declared == nil {
		return hint + typo
	}
	// Not a typo of an entry: most often a kernel's name, which an entry
	// launches and the chain cannot.
	return hint + ": a chain names entries (their PLOVER_ENTRY names), not the __global__ kernels they launch"
}

// listedEntries is how many entry names a message lists: a library may
// declare any number (80,000 made a 1 MB deploy error).
const listedEntries = 20

// listed is names, sorted, for a message: the first listedEntries and how
// many more.
func listed(names []string) string {
	if len(names) <= listedEntries {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:listedEntries], ", "), len(names)-listedEntries)
}

// didYouMean is ` (did you mean "x"?)` for the candidate within a typo of
// name (abi.Suggest, as commands, flags and manifest fields), or "".
func didYouMean(name string, candidates []string) string {
	if s := abi.Suggest(name, candidates); s != "" && s != name {
		return fmt.Sprintf(" (did you mean %q?)", s)
	}
	return ""
}

// CheckManifest checks what the manifest says about the library against the
// library, before any code runs: "abi" must name the major version it was
// built for (a manifest copied between an ABI 1 and an ABI 2 build), and a
// "batch" section needs a library that declares PLOVER_BATCHED for at least
// max_items, and the other way round (kernels written for s->items would
// see 0).
func (info *Info) CheckManifest(path string, m *abi.Manifest) error {
	if uint32(m.ABI) != info.ABI.Major {
		return &Error{Path: path, Reason: fmt.Sprintf("built for ABI %s but plover.json says \"abi\": %d", info.ABI, m.ABI)}
	}
	switch b := m.Batch; {
	case b == nil && info.MaxItems > 0:
		return &Error{Path: path, Reason: fmt.Sprintf("declares PLOVER_BATCHED(%d) but plover.json has no \"batch\" section: add one (max_items, item_input_bytes, item_output_bytes), or drop PLOVER_BATCHED", info.MaxItems)}
	case b == nil:
	case info.ABI.Major != abi.Major || info.ABI.Minor < abi.BatchMinor:
		return &Error{Path: path, Reason: fmt.Sprintf("built for ABI %s, but plover.json's \"batch\" needs ABI 2.%d or later (s->items): rebuild against this plover's headers", info.ABI, abi.BatchMinor)}
	case info.MaxItems == 0:
		return &Error{Path: path, Reason: "plover.json has a \"batch\" section but the library does not declare PLOVER_BATCHED(max_items): a chain that is not written for s->items must not be batched"}
	case uint32(b.MaxItems) > info.MaxItems:
		return &Error{Path: path, Reason: fmt.Sprintf("batch.max_items %d is over the %d the library declares with PLOVER_BATCHED", b.MaxItems, info.MaxItems)}
	}
	return nil
}

// Bounds on the dynamic symbol table read at deploy, in the server:
// debug/elf reads .dynsym and its strings whole and makes a 72-byte
// symbol of each 24-byte entry, so a library whose table is large (zeros
// compress to nothing in a bundle) would cost the server gigabytes. A
// library of a million exported symbols still fits.
const (
	maxDynsym   = 32 << 20
	maxDynstr   = 64 << 20
	maxVersions = maxDynsym / 24 * 2 // .gnu.version for a full .dynsym
)

// boundSymbols refuses a dynamic symbol table past the bounds before
// anything of it is read.
func boundSymbols(ef *elf.File) error {
	for _, sec := range ef.Sections {
		switch sec.Type {
		case elf.SHT_DYNSYM:
			if sec.Size > maxDynsym {
				return fmt.Errorf("its dynamic symbol table (.dynsym) is %d bytes, over the %d this server reads (export fewer symbols: -fvisibility=hidden)", sec.Size, maxDynsym)
			}
			if int(sec.Link) < len(ef.Sections) {
				if str := ef.Sections[sec.Link]; str.Size > maxDynstr {
					return fmt.Errorf("the string table of its dynamic symbols (%s) is %d bytes, over the %d this server reads", str.Name, str.Size, maxDynstr)
				}
			}
		case elf.SHT_GNU_VERSYM, elf.SHT_GNU_VERDEF, elf.SHT_GNU_VERNEED:
			// Read whole with the symbols too: 2 bytes a symbol in
			// .gnu.version; definitions and needs of a few kilobytes.
			if sec.Size > maxVersions {
				return fmt.Errorf("its symbol version section %s is %d bytes, over the %d this server reads", sec.Name, sec.Size, maxVersions)
			}
		}
	}
	return nil
}
