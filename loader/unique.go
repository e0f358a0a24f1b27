package loader

import (
	"fmt"
	"path/filepath"
	"sync"
)

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
	if len(info.Unique) == 0 {
		return unclaim, nil
	}
	uniques.Lock()
	defer uniques.Unlock()
	for _, s := range info.Unique {
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
	for _, s := range info.Unique {
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
