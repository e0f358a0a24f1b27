package loader

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"
)

// OwnUnique is the library's GNU unique symbols (Unique) but for those of
// the C++ standard library's headers (std::, __gnu_cxx::, __cxxabiv1:::
// std::make_shared's type tag, std::regex's and the locale's tables),
// which g++ makes in every library using them and which are one object in
// a process by design: constants, or state the standard library keeps
// process-wide. Two libraries sharing those are as any two in one process
// are; sharing their own code's statics is what runs one on the other's
// state.
func (i *Info) OwnUnique() []string {
	var own []string
	for _, s := range i.Unique {
		if !stdSymbol(s) {
			own = append(own, s)
		}
	}
	return own
}

// stdSymbol reports whether name, an Itanium C++ ABI mangled name, is of
// the standard library's namespaces: _Z, then perhaps a special name's
// prefix (GV a guard variable, T* a virtual table or type info) and a
// local entity's Z (a function's static), then a nested name (N, its
// qualifiers) or not, led by std:: or one of its abbreviations (St, Sa,
// Sb, Ss, Si, So, Sd), __gnu_cxx:: or __cxxabiv1::.
func stdSymbol(name string) bool {
	s, ok := strings.CutPrefix(name, "_Z")
	if !ok {
		return false
	}
	for _, p := range []string{"GV", "TV", "TI", "TS", "TT", "TH", "TW"} {
		if rest, ok := strings.CutPrefix(s, p); ok {
			s = rest
			break
		}
	}
	s = strings.TrimPrefix(s, "Z")
	if rest, ok := strings.CutPrefix(s, "N"); ok {
		s = strings.TrimLeft(rest, "rVKRO")
	}
	for _, p := range []string{"St", "Sa", "Sb", "Ss", "Si", "So", "Sd", "9__gnu_cxx", "10__cxxabiv1"} {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// uniques maps each GNU unique symbol a library opened in this process
// defined to that library's path. The dynamic linker binds such a name
// once per process, RTLD_LOCAL or not, and a library holding one is never
// unmapped (its dlclose does nothing): a second library defining the
// same name (another version of a function, or another function built
// from the same header library) would run on the first's object, with
// its state, for the process's life. Entries are never removed, for that
// reason. The same path opened again is the same mapping, its statics as
// they were: allowed (an idle function unloaded and loaded again).
var uniques struct {
	sync.Mutex
	by map[string]string
}

// claimUnique records info's unique symbols as path's, or refuses path
// when another library opened in this process defined one of them first.
// Claimed before the dlopen, so that two opens at once cannot both pass;
// unclaim gives back what a failed dlopen claimed (nothing was mapped).
func claimUnique(path string, info *Info) (unclaim func(), err error) {
	unclaim = func() {}
	own := info.OwnUnique()
	if len(own) == 0 {
		return unclaim, nil
	}
	uniques.Lock()
	defer uniques.Unlock()
	for _, s := range own {
		if was, ok := uniques.by[s]; ok && was != path {
			// The other library by its directory and name (a bundle's
			// cache entry is named by its digest), not the node's path.
			was = filepath.Join(filepath.Base(filepath.Dir(was)), filepath.Base(was))
			return unclaim, &Error{Path: path, Reason: fmt.Sprintf("defines the GNU unique symbol %s, as %s did, opened in this process before: "+
				"the dynamic linker would bind both to that library's object (its state, for the process's life); "+
				"build with -fno-gnu-unique (nvcc: -Xcompiler -fno-gnu-unique), or load it in a process of its own (plover serve --isolation process, the default; or restart this one)", s, was)}
		}
	}
	if uniques.by == nil {
		uniques.by = map[string]string{}
	}
	var added []string
	for _, s := range own {
		if _, ok := uniques.by[s]; !ok {
			uniques.by[s] = path
			added = append(added, s)
		}
	}
	return func() {
		uniques.Lock()
		defer uniques.Unlock()
		for _, s := range added {
			delete(uniques.by, s)
		}
	}, nil
}
