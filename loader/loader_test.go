package loader_test

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/loader"
)

func writeSrc(t *testing.T, dir, name, src string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestOpenRefusals(t *testing.T) {
	dir := t.TempDir()
	good := testkit.BuildLib(t, testkit.KernelsSource(), dir, "good.so")
	withVersion := func(name, version string) string {
		return testkit.BuildLib(t, writeSrc(t, dir, name+".cu", `#include "plover.h"
#undef PLOVER_ABI_VERSION
#define PLOVER_ABI_VERSION `+version+`
PLOVER_BUNDLE("host");
PLOVER_ENTRY(k) { (void)s; (void)grid; (void)block; }`), dir, name+".so")
	}
	abi3 := withVersion("abi3", "(3 << 16)")
	abi23 := withVersion("abi23", "((2 << 16) | 3)")
	abi0 := withVersion("abi0", "0")
	plain2 := withVersion("plain2", "2")
	abi1 := testkit.BuildLib(t, testkit.KernelsSource(), dir, "abi1.so", testkit.ABI1Include())
	// An extern "C" helper is a function the library exports, but no
	// declared entry; hooks are not entries either.
	helper := testkit.BuildLib(t, writeSrc(t, dir, "helper.cu", `#include "plover.h"
PLOVER_BUNDLE("host");
extern "C" void helper(plover_state_t *s, int grid, int block) { (void)s; (void)grid; (void)block; }
PLOVER_EXPORT void plover_load(plover_state_t *s) { (void)s; }
PLOVER_ENTRY(k) { (void)s; (void)grid; (void)block; }
PLOVER_ENTRY(k2) { (void)s; (void)grid; (void)block; }`), dir, "helper.so")
	// A hook's name as data, which plover.h's declaration of the hooks
	// makes a compile error: the asm label stands for a bundle built
	// against an earlier header.
	dataHook := testkit.BuildLib(t, writeSrc(t, dir, "datahook.cu", `#include "plover.h"
PLOVER_BUNDLE("host");
__attribute__((visibility("default"))) int plover_instance_init_data __asm__("plover_instance_init") = 1;
PLOVER_ENTRY(k) { (void)s; (void)grid; (void)block; }`), dir, "datahook.so")
	// plover_last_error as data: the runtime would call its address.
	dataLastError := testkit.BuildLib(t, writeSrc(t, dir, "datalasterror.cu", `#include "plover.h"
PLOVER_EXPORT const uint32_t plover_abi_version = PLOVER_ABI_VERSION;
PLOVER_EXPORT const char plover_target[] = "host";
PLOVER_EXPORT const char *plover_last_error = 0;
PLOVER_ENTRY(k) { (void)s; (void)grid; (void)block; }`), dir, "datalasterror.so")
	cudaTarget := testkit.BuildLib(t, writeSrc(t, dir, "cuda.cu", `#include "plover.h"
PLOVER_BUNDLE("cuda");
PLOVER_ENTRY(k) { (void)s; (void)grid; (void)block; }`), dir, "cuda.so")
	noBundle := testkit.BuildLib(t, writeSrc(t, dir, "nobundle.cu", `#include "plover.h"
PLOVER_ENTRY(k) { (void)s; (void)grid; (void)block; }`), dir, "nobundle.so")
	// C++ with helpers of external linkage: exported under mangled names,
	// as in any C++ bundle, and no entry points.
	cxx := testkit.BuildLib(t, writeSrc(t, dir, "cxx.cu", `#include "plover.h"
PLOVER_BUNDLE("host");
void helper(int *p) { *p = 0; }
template <typename T> T twice(T x) { return x + x; }
template int twice<int>(int);
PLOVER_ENTRY(k) { (void)s; (void)grid; (void)block; }`), dir, "cxx.so")
	notELF := filepath.Join(dir, "text.so")
	os.WriteFile(notELF, []byte("#!/bin/sh\necho not a library\n"), 0o644)
	truncated := filepath.Join(dir, "truncated.so")
	b, _ := os.ReadFile(good)
	os.WriteFile(truncated, b[:64], 0o644)

	tests := []struct {
		name    string
		path    string
		kernels []string
		want    string // substring of the error; "" = success
	}{
		{"good", good, []string{"echo", "add_one"}, ""},
		{"missing file", filepath.Join(dir, "nope.so"), nil, "cannot open"},
		{"not an ELF", notELF, nil, "not an ELF"},
		{"truncated ELF", truncated, nil, "ELF"},
		{"ABI 3 refused naming both", abi3, []string{"k"}, "built for ABI 3.0; this runtime speaks ABI 2.2"},
		{"newer minor refused", abi23, []string{"k"}, "built for ABI 2.3, newer than this runtime's ABI 2.2"},
		{"ABI 0 refused", abi0, []string{"k"}, "built for ABI 0.0"},
		{"a plain 2 is no ABI 2", plain2, []string{"k"}, "built for ABI 0.2"},
		{"ABI 1 bundle loads", abi1, []string{"echo", "add_one"}, ""},
		{"declared entries load", helper, []string{"k", "k2"}, ""},
		{"undeclared helper is no kernel", helper, []string{"helper"}, `kernel "helper" is not a declared entry (define entries with PLOVER_ENTRY); this bundle declares k, k2`},
		{"hook is no kernel", helper, []string{"plover_load"}, "reserved"},
		{"hook must be a function", dataHook, []string{"k"}, "exports plover_instance_init, but not as a function"},
		{"wrong target", cudaTarget, []string{"k"}, `built for target "cuda", the device is "host"`},
		{"no PLOVER_BUNDLE", noBundle, []string{"k"}, "does not export plover_abi_version"},
		{"plover_last_error must be a function", dataLastError, []string{"k"}, "exports plover_last_error, but not as a function"},
		{"missing kernel", good, []string{"echo", "nope"}, `kernel "nope" is not in the library; this bundle declares `},
		{"a typo gets a suggestion", good, []string{"ech"}, `(did you mean "echo"?)`},
		{"libc function is no kernel", good, []string{"system"}, `kernel "system" is not in the library`},
		{"plain C++ function names PLOVER_ENTRY", cxx, []string{"helper"}, `helper is a C++ function (exported as _Z6helperPi, its name mangled), not an entry point: define it with PLOVER_ENTRY(helper)`},
		{"undeclared helper typo", helper, []string{"k3"}, `this bundle declares k, k2 (did you mean "k"?)`},
		{"data symbol is no kernel", good, []string{"plover_target"}, "reserved"},
		{"C++ entry alongside helpers", cxx, []string{"k"}, ""},
		{"mangled C++ helper is no kernel", cxx, []string{"_Z6helperPi"}, "reserved (C++ mangled names"},
		{"template instantiation is no kernel", cxx, []string{"_Z5twiceIiET_S0_"}, "reserved (C++ mangled names"},
		{"_init is no kernel", cxx, []string{"_init"}, "underscore"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { openHost(t, tt.path, tt.kernels, tt.want) })
	}
}

// openHost opens the library at path for the host target and kernels. want
// "": it opens, kernels and plover_last_error resolved, and is returned
// (closed when the test ends); else Open refuses it with a *loader.Error
// containing want, and it returns nil.
func openHost(t *testing.T, path string, kernels []string, want string) *loader.Library {
	t.Helper()
	lib, err := loader.Open(path, abi.TargetHost, kernels)
	if want == "" {
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		t.Cleanup(func() { lib.Close() })
		for _, k := range kernels {
			if p, err := lib.Entry(k); err != nil || p == nil {
				t.Fatalf("Entry(%s) = %v, %v", k, p, err)
			}
		}
		if lib.LastError == nil {
			t.Fatal("plover_last_error not resolved")
		}
		return lib
	}
	if err == nil {
		lib.Close()
		t.Fatalf("Open succeeded, want an error containing %q", want)
	}
	var le *loader.Error
	if !errors.As(err, &le) {
		t.Fatalf("error %v is not a *loader.Error", err)
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not contain %q", err, want)
	}
	return nil
}

func TestInspectReadsABIValues(t *testing.T) {
	lib := testkit.BuildLib(t, testkit.KernelsSource(), t.TempDir(), "k.so")
	info, err := loader.Inspect(lib)
	if err != nil {
		t.Fatal(err)
	}
	if abi.Accept(info.ABI) != nil || info.Target != abi.TargetHost {
		t.Fatalf("Inspect = version %s target %q", info.ABI, info.Target)
	}
	for _, k := range []string{"echo", "add_one", "count", "fail", "sleep_ms"} {
		if !info.Funcs[k] {
			t.Errorf("kernel %s not among functions", k)
		}
	}
	if info.Funcs["plover_target"] {
		t.Error("plover_target (data) listed as a function")
	}
}

// TestInspectFindsGNUUniqueSymbols: g++ makes a C++ inline function's
// static a GNU unique symbol, unless told not to (-fno-gnu-unique); the
// test kernels define none.
func TestInspectFindsGNUUniqueSymbols(t *testing.T) {
	const src = `#include "plover.h"
PLOVER_BUNDLE("host");
inline int &counter() { static int n; return n; }
PLOVER_ENTRY(count) { (void)grid; (void)block; (void)s; counter()++; }
`
	dir := t.TempDir()
	p := writeSrc(t, dir, "u.cu", src)
	for _, tt := range []struct {
		name   string
		lib    string
		flags  []string
		unique bool
	}{
		{"an inline function's static", "u.so", nil, true},
		{"the same, -fno-gnu-unique", "nu.so", []string{"-fno-gnu-unique"}, false},
		{"the test kernels", "", nil, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var lib string
			if tt.lib == "" {
				lib = testkit.BuildLib(t, testkit.KernelsSource(), dir, "k.so")
			} else {
				lib = testkit.BuildLib(t, p, dir, tt.lib, tt.flags...)
			}
			info, err := loader.Inspect(lib)
			if err != nil {
				t.Fatal(err)
			}
			if (len(info.Unique) > 0) != tt.unique {
				t.Fatalf("Unique = %q, want some: %v", info.Unique, tt.unique)
			}
		})
	}
}

// Resident tells whether dlopen would hand back a mapping the process
// holds: the library open, a hard link to it (matched by device and
// inode), but not a copy, a file never opened, or, on the host, the
// library once closed.
func TestResident(t *testing.T) {
	dir := t.TempDir()
	lib := testkit.BuildLib(t, testkit.KernelsSource(), dir, "res.so")
	link, cp := filepath.Join(dir, "link.so"), filepath.Join(dir, "copy.so")
	if err := os.Link(lib, link); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(lib)
	if err == nil {
		err = os.WriteFile(cp, b, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	check := func(when string, want map[string]bool) {
		t.Helper()
		for _, p := range []string{lib, link, cp, filepath.Join(dir, "none.so")} {
			if got := loader.Resident(p); got != want[p] {
				t.Errorf("%s: Resident(%s) = %v, want %v", when, filepath.Base(p), got, want[p])
			}
		}
	}
	check("before any open", nil)
	l, err := loader.Open(lib, abi.TargetHost, nil)
	if err != nil {
		t.Fatal(err)
	}
	check("open", map[string]bool{lib: true, link: true})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	// The link's name was added to the library's names when Resident
	// matched it: it goes with the library.
	check("closed", nil)
}

// A host library is unmapped at its Close; a CUDA one, or one of a target
// not registered, stays mapped (what Close does, and what a tenant's
// worker counts of the programs it unloaded).
func TestStaysMapped(t *testing.T) {
	for target, want := range map[string]bool{abi.TargetHost: false, abi.TargetCUDA: true, "no such target": true} {
		if got := loader.StaysMapped(target); got != want {
			t.Errorf("StaysMapped(%q) = %v, want %v", target, got, want)
		}
	}
}

// A library whose section header marks the section holding
// plover_abi_version compressed (the dynamic linker reads no section
// headers: it loads as before) is refused, naming the section: debug/elf
// gives such a section no reader, and reading the symbol through it
// panicked, crashing plover serve on a repository holding the bundle and
// plover deploy on the client (a review found it).
func TestInspectRefusesASectionMarkedCompressed(t *testing.T) {
	dir := t.TempDir()
	lib := testkit.BuildLib(t, testkit.KernelsSource(), dir, "k.so")
	b, err := os.ReadFile(lib)
	if err != nil {
		t.Fatal(err)
	}
	ef, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	syms, err := ef.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	idx := -1
	for _, s := range syms {
		if s.Name == abi.SymABIVersion {
			idx = int(s.Section)
		}
	}
	if idx <= 0 || idx >= len(ef.Sections) {
		t.Fatalf("%s in section %d", abi.SymABIVersion, idx)
	}
	name := ef.Sections[idx].Name
	// The header alone: SHF_COMPRESSED, its offset at an Elf64_Chdr
	// appended to the file (ELFCOMPRESS_ZLIB, 1 MiB).
	le := binary.LittleEndian
	shoff, shentsize := le.Uint64(b[0x28:]), uint64(le.Uint16(b[0x3a:]))
	h := b[shoff+uint64(idx)*shentsize:]
	chdr := uint64(len(b))
	le.PutUint64(h[8:], le.Uint64(h[8:])|uint64(elf.SHF_COMPRESSED))
	le.PutUint64(h[0x18:], chdr)
	le.PutUint64(h[0x20:], 24)
	b = le.AppendUint32(b, uint32(elf.COMPRESS_ZLIB))
	b = le.AppendUint32(b, 0)
	b = le.AppendUint64(b, 1<<20)
	b = le.AppendUint64(b, 1)
	if err := os.WriteFile(lib, b, 0o755); err != nil {
		t.Fatal(err)
	}
	info, err := loader.Inspect(lib)
	var le2 *loader.Error
	if !errors.As(err, &le2) || !strings.Contains(err.Error(), "compressed") || !strings.Contains(err.Error(), name) {
		t.Fatalf("Inspect = %+v, %v; want a loader.Error naming section %s compressed", info, err, name)
	}
}

// A library may write anything into its plover_entries section: names
// that are no C identifier (control bytes, a terminal's escapes) are not
// entries, and a message lists at most 20 of the declared ones, saying how
// many more (80,000 names made a 1 MB deploy error).
func TestDeclaredEntriesInMessagesAreBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString("#include \"plover.h\"\nPLOVER_BUNDLE(\"host\");\n")
	for i := range 30 {
		fmt.Fprintf(&b, "PLOVER_ENTRY(k%02d) { (void)grid; (void)block; (void)s; }\n", i)
	}
	// Written as PLOVER_ENTRY writes its names, but not a name.
	b.WriteString("__attribute__((used, section(\"plover_entries\"), aligned(1))) static const char odd[] = \"\\x1b[31mred\";\n")
	dir := t.TempDir()
	lib := testkit.BuildLib(t, writeSrc(t, dir, "many.cu", b.String()), dir, "many.so")
	info, err := loader.Inspect(lib)
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Declared) != 30 || slices.ContainsFunc(info.Declared, func(n string) bool { return strings.Contains(n, "red") }) {
		t.Fatalf("Declared = %q, want k00..k29 alone", info.Declared)
	}
	for _, name := range []string{"nope", "k00x"} {
		err := info.CheckEntry(name)
		if err == nil || !strings.Contains(err.Error(), "k19 and 10 more") || strings.Contains(err.Error(), "k20") {
			t.Errorf("CheckEntry(%q) = %v; want the first 20 entries listed, and 10 more", name, err)
		}
	}
}

// A function that looks like a hook but that the runtime would never call
// is refused, naming it, since the bundle would run without it (s->program
// NULL); a hook defined without PLOVER_EXPORT is one, since plover.h
// declares the hooks, whatever the default visibility.
func TestHooksTheRuntimeWouldNotCall(t *testing.T) {
	dir := t.TempDir()
	const load = "\nvoid plover_load(plover_state_t *s) { (void)s; }"
	tests := []struct {
		name, def string
		args      []string
		want      string // CheckHooks' refusal; "": none, and plover_load resolves
	}{
		{"a typo of a hook", `PLOVER_EXPORT void plover_instance_int(plover_state_t *s) { (void)s; }`, nil,
			`exports the function plover_instance_int, which the runtime never calls: no ABI function has that name (did you mean "plover_instance_init"?)`},
		{"a C++ hook of another signature", `void plover_load(void *s) { (void)s; }`, nil,
			`exports _Z11plover_loadPv, a C++ function named plover_load that is not the hook, which the runtime never calls: its name is mangled`},
		{"a C++ hook in a namespace", `namespace fn { void plover_unload(plover_state_t *s) { (void)s; } }`, nil,
			`exports _ZN2fn13plover_unloadEP12plover_state, a C++ function named plover_unload that is not the hook`},
		{"a C++ typo of a hook", `void plover_instance_int(plover_state_t *s) { (void)s; }`, nil,
			`exports _Z19plover_instance_intP12plover_state, a C++ function named plover_instance_int, which the runtime never calls (did you mean "plover_instance_init"?)`},
		{"a C++ hook without PLOVER_EXPORT", `void plover_load(plover_state_t *s) { (void)s; }`, nil, ""},
		{"a hook without PLOVER_EXPORT, hidden by default", `void plover_load(plover_state_t *s) { (void)s; }`, []string{"-fvisibility=hidden"}, ""},
		// One typo from a hook is refused at deploy even where an author
		// meant it (plover_upload: rename it); loads take it.
		{"an author's function one typo from a hook", `PLOVER_EXPORT void plover_upload(void) {}` + load, nil,
			`exports the function plover_upload, which the runtime never calls: no ABI function has that name (did you mean "plover_unload"?)`},
		// An author's own functions of the prefix, two typos or more from
		// any hook, are left alone (a review found Suggest's two edits
		// refused plover_lock, plover_read, plover_instance_info and more).
		{"a reserved name like no hook", `PLOVER_EXPORT void plover_helper(void) {}` + load, nil, ""},
		{"helpers two typos from a hook", `PLOVER_EXPORT void plover_lock(void) {}
PLOVER_EXPORT void plover_read(void) {}
PLOVER_EXPORT void plover_loaded(void) {}
PLOVER_EXPORT void plover_instance_info(void) {}` + load, nil, ""},
		{"a C++ function of the prefix like no hook", `void plover_sum(float *a) { (void)a; }` + load, nil, ""},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name := fmt.Sprintf("hook%d", i)
			src := writeSrc(t, dir, name+".cu", "#include \"plover.h\"\nPLOVER_BUNDLE(\"host\");\n"+tt.def+"\nPLOVER_ENTRY(k) { (void)s; }\n")
			path := testkit.BuildLib(t, src, dir, name+".so", tt.args...)
			info, err := loader.Inspect(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := info.CheckHooks(path); tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("CheckHooks: %v, want %q", err, tt.want)
			}
			// A program's load refuses none of them: a bundle deployed
			// before deploy checked its hooks must go on loading.
			lib := openHost(t, path, []string{"k"}, "")
			if tt.want == "" && lib.Load == nil {
				t.Fatal("plover_load not resolved")
			}
		})
	}
}

// A library defining a GNU unique symbol that another library opened in
// this process defined first is refused, naming both: the dynamic linker
// would bind it to the first's object, and with --isolation none a
// function's next version ran on its last one's state (counter 4, 5 after
// 1, 2, 3), as did another function built from the same source. The same
// library opened again is its own mapping: allowed. Built with
// -fno-gnu-unique, two copies are two objects: both open.
func TestASecondLibraryOfAUniqueSymbolIsRefused(t *testing.T) {
	const src = `#include "plover.h"
PLOVER_BUNDLE("host");
inline int &claimed_counter() { static int n; return n; }
PLOVER_ENTRY(count) { (void)grid; (void)block; (void)s; claimed_counter()++; }
`
	dir := t.TempDir()
	p := writeSrc(t, dir, "c.cu", src)
	first := testkit.BuildLib(t, p, dir, "v1.so")
	second := testkit.BuildLib(t, p, dir, "v2.so")
	open := func(lib string) (*loader.Library, error) { return loader.Open(lib, "host", []string{"count"}) }
	l1, err := open(first)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := open(second); err == nil || !strings.Contains(err.Error(), "defines the GNU unique symbol") ||
		!strings.Contains(err.Error(), "as "+filepath.Base(dir)+"/v1.so did") || !strings.Contains(err.Error(), "-fno-gnu-unique") {
		t.Fatalf("the second library: %v; want a refusal naming %s and -fno-gnu-unique", err, first)
	}
	if err := l1.Close(); err != nil {
		t.Fatal(err)
	}
	again, err := open(first)
	if err != nil {
		t.Fatalf("the first library again: %v", err)
	}
	again.Close()
	for _, lib := range []string{"nu1.so", "nu2.so"} {
		l, err := open(testkit.BuildLib(t, p, dir, lib, "-fno-gnu-unique"))
		if err != nil {
			t.Fatalf("%s, built -fno-gnu-unique: %v", lib, err)
		}
		defer l.Close()
	}
}

// Libraries that share only the C++ standard library's unique symbols
// (std::make_shared's type tag, one object in a process by design) open
// side by side: refused, any two functions using make_shared could not
// both run in one process.
func TestLibrariesSharingTheStandardLibrarysUniqueSymbolsOpen(t *testing.T) {
	dir := t.TempDir()
	var opened []*loader.Library
	defer func() {
		for _, l := range opened {
			l.Close()
		}
	}()
	for i, typ := range []string{"int", "long"} {
		p := writeSrc(t, dir, "s"+strconv.Itoa(i)+".cu", `#include <memory>
#include "plover.h"
PLOVER_BUNDLE("host");
PLOVER_ENTRY(count) { (void)grid; (void)block; (void)s; auto p = std::make_shared<`+typ+`>(1); (void)p; }
`)
		lib := testkit.BuildLib(t, p, dir, "s"+strconv.Itoa(i)+".so")
		info, err := loader.Inspect(lib)
		if err != nil {
			t.Fatal(err)
		}
		if len(info.Unique) == 0 || len(info.OwnUnique()) != 0 {
			t.Fatalf("%s: unique %q, own %q; want the standard library's alone", lib, info.Unique, info.OwnUnique())
		}
		l, err := loader.Open(lib, "host", []string{"count"})
		if err != nil {
			t.Fatalf("library %d using std::make_shared: %v", i, err)
		}
		opened = append(opened, l)
	}
}
