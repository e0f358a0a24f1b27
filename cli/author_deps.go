package cli

// What a build read, so that plover run and plover deploy know when a
// build is stale: the dependency file the compiler writes beside the
// library, or without one the files of the source directory that could be
// headers.

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/plover-run/plover/abi"
)

// depFile is the name, in a target's build directory, of the file the
// compiler writes the headers it read to: the library's, .d for its
// extension, as -MMD itself would name it. "" where that name is a file
// the bundle holds.
func depFile(m *abi.Manifest) string {
	name := strings.TrimSuffix(m.Library, filepath.Ext(m.Library)) + ".d"
	if name == m.Library || name == m.Constants || name == abi.ManifestFile {
		return ""
	}
	return name
}

// freshDepFile removes the dependency file of bdir's earlier build and
// returns its path as the compiler, run in dir, should write it anew ("":
// none). Removed because a compiler may write none this time (several
// sources), and the earlier build's list would then vouch for this one.
func freshDepFile(dir, bdir string, m *abi.Manifest) (string, error) {
	name := depFile(m)
	if name == "" {
		return "", nil
	}
	p := filepath.Join(bdir, name)
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("removing the earlier build's dependency file: %w", err)
	}
	return outputPath(dir, p)
}

// readDeps reads a dependency file as g++ and nvcc write it (-MMD -MF):
// one make rule, "target: prerequisite ...", its lines continued with a
// backslash, a space in a name written "\ ", a # "\#" and a $ "$$". false
// when there is none, or it holds no such rule.
func readDeps(path string) ([]string, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, false
	}
	rule := strings.ReplaceAll(string(b), "\\\n", " ")
	if i := strings.IndexByte(rule, '\n'); i >= 0 {
		rule = rule[:i] // -MP's empty rules, were they asked for, name nothing more
	}
	// The target ends at a colon before a blank: g++ writes "lib.so: ",
	// nvcc "lib.so : "; a colon inside a path has none after it.
	colon := -1
	for i := 0; i < len(rule) && colon < 0; i++ {
		if rule[i] == ':' && (i+1 == len(rule) || rule[i+1] == ' ' || rule[i+1] == '\t') {
			colon = i
		}
	}
	if colon < 0 {
		return nil, false
	}
	var deps []string
	var cur strings.Builder
	flush := func() {
		if cur.Len() > 0 {
			deps = append(deps, cur.String())
			cur.Reset()
		}
	}
	for i := colon + 1; i < len(rule); i++ {
		switch c := rule[i]; {
		case c == '\\' && i+1 < len(rule) && (rule[i+1] == ' ' || rule[i+1] == '#'):
			i++
			cur.WriteByte(rule[i])
		case c == '$' && i+1 < len(rule) && rule[i+1] == '$':
			i++
			cur.WriteByte('$')
		case c == ' ' || c == '\t' || c == '\r':
			flush()
		default:
			cur.WriteByte(c)
		}
	}
	flush()
	return deps, len(deps) > 0
}

// staleUnder is staleSources for a build that left no dependency file (of
// several sources, by an older plover or the Makefile an older plover init
// wrote, or by an nvcc before CUDA 10.2), past build.include (staleIncludes, which every build
// is checked against): a file newer than since among the C, C++ and CUDA
// files of the source directory and of the directories -I flags in
// cxxflags and nvccflags name (includeFlagRoots).
func staleUnder(dir string, m *abi.Manifest, since time.Time) string {
	buildDir := filepath.Join(dir, BuildDir)
	if p := newerUnder(dir, buildDir, since, isCSource, 0); p != "" {
		return p
	}
	flags := append(append([]string{}, m.Build.CXXFlags...), m.Build.NVCCFlags...)
	for _, root := range includeFlagRoots(dir, flags) {
		if p := newerUnder(root.dir, buildDir, since, isCSource, root.limit); p != "" {
			return p
		}
	}
	return ""
}

// walkRoot is a directory an -I flag names, and the most entries its walk
// may count (0: no bound).
type walkRoot struct {
	dir   string
	limit int
}

// includeWalkLimit bounds the walk of a directory an absolute -I flag
// names, in entries: a larger tree is a library's or a toolkit's (CUDA's
// include directory holds thousands of files), not the function's own
// headers, and walking it on every plover run and deploy would cost more
// than the check is worth; it is left unwatched. A relative -I names the
// author's own tree (a monorepo's -I../common), walked whole as it always
// was: bounded, a header edited there in a tree of more files went
// unseen and plover run ran the old bytes. A variable for tests.
var includeWalkLimit = 2000

// systemIncludeDirs are where compilers and toolkits keep their headers,
// as patterns (filepath.Match) for a directory or one above it. An -I
// naming one is never walked: a package update there is no change of the
// function, and most are far past includeWalkLimit anyway, but a walk up to
// the limit could still find a newer file first.
var systemIncludeDirs = []string{
	"/usr/include", "/usr/local/include", "/usr/lib*", "/usr/local/lib*", "/usr/share",
	"/usr/local/cuda*", "/opt/cuda*", "/opt/nvidia", "/opt/rocm*",
}

// isSystemDir reports whether abs, an absolute path with its symbolic
// links resolved, is / or lies in one of systemIncludeDirs.
func isSystemDir(abs string) bool {
	if abs == "/" {
		return true
	}
	for p := abs; p != "/" && p != "."; p = filepath.Dir(p) {
		for _, pattern := range systemIncludeDirs {
			if ok, _ := filepath.Match(pattern, p); ok {
				return true
			}
		}
	}
	return false
}

// includeFlagRoots are the directories -I flags among flags name, as a
// walk should start at them: a relative one taken from dir, symbolic links
// resolved (a walk does not enter a link it starts at), an absolute one
// bounded by includeWalkLimit; one that is not there, or is the system's
// (isSystemDir), is left out.
func includeFlagRoots(dir string, flags []string) []walkRoot {
	var roots []walkRoot
	for _, inc := range includeFlagDirs(flags) {
		limit := includeWalkLimit
		if !filepath.IsAbs(inc) {
			inc, limit = filepath.Join(dir, inc), 0
		}
		real, err := filepath.EvalSymlinks(inc)
		if err != nil {
			continue // not there: nothing in it changed
		}
		if abs, err := filepath.Abs(real); err != nil || isSystemDir(abs) {
			continue
		}
		roots = append(roots, walkRoot{real, limit})
	}
	return roots
}

// staleIncludes is the first file under the build's include directories
// (build.include) modified after since, or "".
func staleIncludes(dir string, m *abi.Manifest, since time.Time) string {
	buildDir := filepath.Join(dir, BuildDir)
	for _, inc := range m.Build.IncludeDirs() {
		if p := newerUnder(filepath.Join(dir, inc), buildDir, since, func(string) bool { return true }, 0); p != "" {
			return p
		}
	}
	return ""
}

// newerUnder is the first file under root modified after since whose name
// want takes, or "". It does not enter buildDir (the build's outputs,
// written after the library) or hidden directories (version control's).
// With a limit, a tree of more entries than that is "" whatever it holds
// (see includeWalkLimit), so the walk goes on past a newer file to count.
func newerUnder(root, buildDir string, since time.Time, want func(name string) bool, limit int) string {
	found, seen := "", 0
	filepath.WalkDir(root, func(p string, de fs.DirEntry, err error) error {
		if seen++; limit > 0 && seen > limit {
			found = ""
			return filepath.SkipAll
		}
		switch {
		case err != nil:
			return nil // unreadable: what is not there is no change
		case de.IsDir() && p != root && (p == buildDir || strings.HasPrefix(de.Name(), ".")):
			return filepath.SkipDir
		case de.IsDir() || !want(de.Name()) || found != "":
			return nil
		}
		if fi, err := de.Info(); err == nil && fi.ModTime().After(since) {
			found = p
			if limit <= 0 {
				return filepath.SkipAll
			}
		}
		return nil
	})
	return found
}

// cSourceExts are the extensions of the files a C, C++ or CUDA build may
// read: what else sits in a source directory (inputs, outputs, scripts) is
// written after a build without changing it.
var cSourceExts = map[string]bool{
	".h": true, ".hh": true, ".hpp": true, ".hxx": true, ".h++": true, ".cuh": true, ".inc": true, ".inl": true, ".ipp": true, ".tcc": true,
	".c": true, ".cc": true, ".cpp": true, ".cxx": true, ".c++": true, ".cu": true,
}

func isCSource(name string) bool { return cSourceExts[strings.ToLower(filepath.Ext(name))] }

// includeFlagDirs are the directories -I flags name: -Idir and -I dir.
func includeFlagDirs(flags []string) []string {
	var dirs []string
	for i, f := range flags {
		switch {
		case f == "-I" && i+1 < len(flags):
			dirs = append(dirs, flags[i+1])
		case strings.HasPrefix(f, "-I") && len(f) > 2:
			dirs = append(dirs, f[2:])
		}
	}
	return dirs
}
