package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
)

// plover run (and deploy, through the same resolveBundle) rebuilds after a
// header the kernel includes changed, wherever the header is: beside the
// source, below it, or in a directory outside it that an -I in cxxflags
// names, relative or absolute. Such a header once went unseen, and the
// old bytes ran. With the dependency file plover build has the compiler
// write, and without it (a build of several sources, an older Makefile's)
// by the walk, which once left out a directory an absolute -I names, and
// does not tell a header the build read from one beside it that it did
// not.
func TestRunRebuildsWhenAHeaderChanged(t *testing.T) {
	compilerFor(t, abi.TargetHost)
	for _, tt := range []struct {
		name     string
		header   string   // its path from the source directory
		include  string   // as the kernel names it
		cxxflags []string // $SRC: the source directory
	}{
		{"beside the source", "offset.h", "offset.h", nil},
		{"below the source", "kern/offset.h", "kern/offset.h", nil},
		{"through -I in cxxflags, outside the source", "../common/offset.h", "offset.h", []string{"-I../common"}},
		{"through an absolute -I in cxxflags", "../common/offset.h", "offset.h", []string{"-I$SRC/../common"}},
		{"through an absolute -I, a symbolic link", "../common/offset.h", "offset.h", []string{"-I$SRC/../link"}},
	} {
		for _, withDeps := range []bool{true, false} {
			name := tt.name
			if !withDeps {
				name += ", no dependency file"
			}
			t.Run(name, func(t *testing.T) {
				src := headerFixture(t, tt.header, tt.include, tt.cxxflags)
				m := mustManifest(t, src)
				built := filepath.Join(src, BuildDir, "host")
				deps := filepath.Join(built, depFile(m))
				if _, err := os.Stat(deps); err != nil {
					t.Fatalf("plover build wrote no dependency file: %v", err)
				}
				if !withDeps {
					os.Remove(deps)
				}
				inPath := filepath.Join(t.TempDir(), "in.bin")
				os.WriteFile(inPath, float32sLE(1, 2, 3, 4), 0o644)
				if ys, stderr := runFloats(t, src, inPath); !reflect.DeepEqual(ys, []float32{3, 5, 7, 9}) || strings.Contains(stderr, "rebuilding") {
					t.Fatalf("fresh build: %v, stderr %q", ys, stderr)
				}
				// What plover run writes into the source directory, after
				// the build, is no change of the function.
				os.WriteFile(filepath.Join(src, "output.bin"), nil, 0o644)
				if got := staleSources(src, m, built); got != "" {
					t.Fatalf("stale by %s before the header changed", got)
				}
				if withDeps { // a header the build did not read is no change
					os.WriteFile(filepath.Join(src, "unused.h"), nil, 0o644)
					if got := staleSources(src, m, built); got != "" {
						t.Fatalf("stale by %s, which the kernel does not include", got)
					}
				}
				h := filepath.Join(src, tt.header)
				os.WriteFile(h, []byte("#define OFFSET 100.0f\n"), 0o644)
				// As the compiler or the walk named it: through $SRC/.. for
				// the absolute -I, through the link or where it leads.
				stale := staleSources(src, m, built)
				if !sameFile(stale, h) {
					t.Fatalf("stale by %q, want the edited header %s", stale, h)
				}
				ys, stderr := runFloats(t, src, inPath)
				if !reflect.DeepEqual(ys, []float32{103, 105, 107, 109}) {
					t.Fatalf("after the header changed: %v (stale bytes run), stderr %q", ys, stderr)
				}
				if !strings.Contains(stderr, stale+" changed after "+built+" was built: rebuilding it") {
					t.Fatalf("stderr does not say it rebuilt: %q", stderr)
				}
			})
		}
	}
}

// headerFixture is a function source directory, built for the host, whose
// kernel adds OFFSET (0) from header (a path from the directory), which it
// includes as include, built with cxxflags; ../link beside the directory
// is a symbolic link to the header's directory. Every file in the
// directory and the header are dated a minute before the library, so that
// what a test writes next is newer than the build without waiting for the
// clock.
func headerFixture(t *testing.T, header, include string, cxxflags []string) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "fn", "hdr")
	if err := os.MkdirAll(filepath.Dir(src), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, stderr, err := runCommand(initCmd(), "hdr", "--dir", src); err != nil {
		t.Fatalf("init: %v\n%s", err, stderr)
	}
	h := includeHeader(t, src, header, include)
	if err := os.Symlink(filepath.Dir(h), filepath.Join(filepath.Dir(src), "link")); err != nil {
		t.Fatal(err)
	}
	if cxxflags != nil {
		m := mustManifest(t, src)
		for _, f := range cxxflags {
			m.Build.CXXFlags = append(m.Build.CXXFlags, strings.ReplaceAll(f, "$SRC", src))
		}
		mb, err := manifestJSON(m)
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(src, "plover.json"), mb, 0o644)
	}
	if _, stderr, err := runCommand(buildCmd(), src); err != nil {
		t.Fatalf("build: %v\n%s", err, stderr)
	}
	backdate(t, filepath.Join(src, BuildDir, "host", "hdr.so"), src, filepath.Dir(h))
	return src
}

// includeHeader has the kernel of plover init's directory src add OFFSET
// (0) from header (a path from src, written here), which it includes as
// include. It returns the header's path.
func includeHeader(t *testing.T, src, header, include string) string {
	t.Helper()
	h := filepath.Join(src, header)
	os.MkdirAll(filepath.Dir(h), 0o755)
	if err := os.WriteFile(h, []byte("#define OFFSET 0.0f\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cu := filepath.Join(src, filepath.Base(src)+".cu")
	b, _ := os.ReadFile(cu)
	edited := strings.Replace(string(b), "ab[1];", "ab[1] + OFFSET;", 1)
	edited = strings.Replace(edited, `#include "plover_kernel.h"`, `#include "plover_kernel.h"`+"\n#include \""+include+"\"", 1)
	if !strings.Contains(edited, "OFFSET;") || !strings.Contains(edited, include) {
		t.Fatal("test bug: the scaffold's kernel changed")
	}
	if err := os.WriteFile(cu, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	return h
}

// The dependency files g++ and nvcc write, as plover build reads them.
func TestReadDeps(t *testing.T) {
	for _, tt := range []struct {
		name, text string
		want       []string // nil: no rule read
	}{
		{"g++", "build/host/k.so: k.cu include/plover_kernel.h \\\n include/plover.h\n",
			[]string{"k.cu", "include/plover_kernel.h", "include/plover.h"}},
		{"nvcc", "build/cuda/k.so : k.cu \\\n    include/plover_kernel.h \\\n    include/plover.h\n\n",
			[]string{"k.cu", "include/plover_kernel.h", "include/plover.h"}},
		{"escaped space, # and $", "/a b/k.so: k.cu /x\\ y/h\\#1.h $$HOME.h\n", []string{"k.cu", "/x y/h#1.h", "$HOME.h"}},
		{"-MP's empty rules are no prerequisites", "k.so: k.cu h.h\nh.h:\n", []string{"k.cu", "h.h"}},
		{"a colon within the target", "/t/a:b/k.so: k.cu\n", []string{"k.cu"}},
		{"no rule", "garbage\n", nil},
		{"a rule with nothing", "k.so:\n", nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "k.d")
			os.WriteFile(p, []byte(tt.text), 0o644)
			got, ok := readDeps(p)
			if ok != (tt.want != nil) || !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("readDeps(%q) = %q, %v; want %q", tt.text, got, ok, tt.want)
			}
		})
	}
	if _, ok := readDeps(filepath.Join(t.TempDir(), "absent.d")); ok {
		t.Fatal("a missing file read as a rule")
	}
}

// A dependency file an earlier plover build wrote outlives a Makefile
// build after it, which writes none: a header added under build.include
// since, which it does not list, still makes the build stale (every file
// there counts, whatever the list says), as it did before the list was
// read (a review's probe: plover run ran the old library).
func TestAnOldDependencyFileHidesNoIncludedHeader(t *testing.T) {
	dir := t.TempDir()
	m := &abi.Manifest{Name: "fn", Library: "fn.so", Build: &abi.Build{Sources: []string{"fn.cu"}, Include: []string{"include"}}}
	built := filepath.Join(dir, BuildDir, "host")
	for _, p := range []string{filepath.Join(dir, "include"), built} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-time.Hour)
	write := func(p, text string, at time.Time) {
		t.Helper()
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, at, at); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(dir, "fn.cu"), "#include \"extra.h\"\n", old)
	write(filepath.Join(dir, abi.ManifestFile), "{}", old)
	write(filepath.Join(built, "fn.d"), "build/host/fn.so: fn.cu\n", old) // plover build's, before extra.h
	write(filepath.Join(built, "fn.so"), "", old.Add(time.Minute))        // make's, after it
	if p := staleSources(dir, m, built); p != "" {
		t.Fatalf("before any change: stale by %s", p)
	}
	write(filepath.Join(dir, "include", "extra.h"), "#error changed\n", old.Add(2*time.Minute))
	if p := staleSources(dir, m, built); p != filepath.Join(dir, "include", "extra.h") {
		t.Fatalf("a header under build.include changed after the build: stale by %q, want it", p)
	}
}

// A build without a dependency file is checked against the directories
// -I flags name, absolute ones too, but not a system directory (nor one
// below, nor a link to one), and not a tree past includeWalkLimit entries:
// each is left unwatched, whatever changed in it.
func TestStaleUnderAbsoluteIncludes(t *testing.T) {
	limit, system := includeWalkLimit, systemIncludeDirs
	t.Cleanup(func() { includeWalkLimit, systemIncludeDirs = limit, system })
	includeWalkLimit = 8
	for _, tt := range []struct {
		name     string
		files    int  // besides the header
		system   bool // the -I directory is one of systemIncludeDirs
		relative bool // named by a relative -I: the author's tree, never bounded
		watch    bool
	}{
		{"a few files", 3, false, false, true},
		{"at the limit", includeWalkLimit - 2, false, false, true}, // the directory, the header and these
		{"past the limit", includeWalkLimit - 1, false, false, false},
		{"a system directory", 0, true, false, false},
		{"relative, past the limit", includeWalkLimit + 5, false, true, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir, inc := t.TempDir(), t.TempDir()
			systemIncludeDirs = system
			if tt.system {
				systemIncludeDirs = append(append([]string{}, system...), inc)
			}
			flag := inc
			if tt.relative {
				rel, err := filepath.Rel(dir, inc)
				if err != nil {
					t.Fatal(err)
				}
				flag = rel
			}
			m := &abi.Manifest{Name: "fn", Library: "fn.so", Build: &abi.Build{Sources: []string{"fn.cu"}, CXXFlags: []string{"-I" + flag}}}
			built := filepath.Join(dir, BuildDir, "host")
			if err := os.MkdirAll(built, 0o755); err != nil {
				t.Fatal(err)
			}
			old := time.Now().Add(-time.Hour)
			for i := 0; i < tt.files; i++ {
				writeAt(t, filepath.Join(inc, fmt.Sprintf("a%02d.h", i)), old)
			}
			writeAt(t, filepath.Join(dir, "fn.cu"), old)
			writeAt(t, filepath.Join(dir, abi.ManifestFile), old)
			writeAt(t, filepath.Join(built, "fn.so"), old.Add(time.Minute))
			h := filepath.Join(inc, "z.h") // walked last: the count is past the limit by then
			writeAt(t, h, old)
			if p := staleSources(dir, m, built); p != "" {
				t.Fatalf("before any change: stale by %s", p)
			}
			writeAt(t, h, old.Add(2*time.Minute))
			want := ""
			if tt.watch {
				want = h
			}
			if p := staleSources(dir, m, built); p != want {
				t.Fatalf("%s changed: stale by %q, want %q", h, p, want)
			}
		})
	}
}

// writeAt writes an empty file at p dated at.
func writeAt(t *testing.T, p string, at time.Time) {
	t.Helper()
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(p, at, at); err != nil {
		t.Fatal(err)
	}
}

// Which -I directories the walk starts at: relative ones from the source
// directory, links resolved; not one that is not there, nor the system's.
func TestIncludeFlagRoots(t *testing.T) {
	dir, ext := t.TempDir(), t.TempDir()
	for _, d := range []string{"inc", "real"} {
		os.Mkdir(filepath.Join(dir, d), 0o755)
	}
	os.Symlink(filepath.Join(dir, "real"), filepath.Join(dir, "link"))
	os.Symlink("/usr/include", filepath.Join(ext, "sys"))
	for _, tt := range []struct {
		flags []string
		want  []walkRoot
	}{
		{[]string{"-Iinc", "-I", ext, "-DX=1"}, []walkRoot{{filepath.Join(dir, "inc"), 0}, {ext, includeWalkLimit}}},
		{[]string{"-Ilink"}, []walkRoot{{filepath.Join(dir, "real"), 0}}},
		{[]string{"-Iabsent", "-I" + filepath.Join(ext, "absent")}, nil},
		{[]string{"-I/usr/include", "-I/", "-I" + filepath.Join(ext, "sys")}, nil},
	} {
		if got := includeFlagRoots(dir, tt.flags); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("includeFlagRoots(%q) = %v, want %v", tt.flags, got, tt.want)
		}
	}
}

// The directories compilers and toolkits keep headers in, and those below.
func TestIsSystemDir(t *testing.T) {
	for _, tt := range []struct {
		dir  string
		want bool
	}{
		{"/", true},
		{"/usr/include", true},
		{"/usr/include/x86_64-linux-gnu", true},
		{"/usr/local/include", true},
		{"/usr/lib/gcc/x86_64-linux-gnu/12/include", true},
		{"/usr/local/cuda/include", true},
		{"/usr/local/cuda-12.4/targets/x86_64-linux/include", true},
		{"/opt/cuda/include", true},
		{"/opt/nvidia/hpc_sdk/Linux_x86_64/24.1/cuda/include", true},
		{"/usr/src/app/include", false}, // a container's WORKDIR
		{"/opt/app/common", false},
		{"/home/me/fn/common", false},
	} {
		if got := isSystemDir(tt.dir); got != tt.want {
			t.Errorf("isSystemDir(%s) = %v, want %v", tt.dir, got, tt.want)
		}
	}
}

// A list found beside a build of several sources is an earlier one-source
// build's (no build of several writes one, and the Makefile's leaves the
// last one's): it is not read, so a header only the new sources include
// makes the build stale.
func TestAnEarlierBuildsListVouchesForNoSources(t *testing.T) {
	dir := t.TempDir()
	built := filepath.Join(dir, BuildDir, "host")
	if err := os.MkdirAll(built, 0o755); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	for _, n := range []string{"fn.cu", "b.cu", "b.h", abi.ManifestFile} {
		writeAt(t, filepath.Join(dir, n), old)
	}
	writeAt(t, filepath.Join(built, "fn.so"), old.Add(time.Minute))
	if err := os.WriteFile(filepath.Join(built, "fn.d"), []byte("build/host/fn.so: fn.cu\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	m := &abi.Manifest{Name: "fn", Library: "fn.so", Build: &abi.Build{Sources: []string{"fn.cu", "b.cu"}}}
	if p := staleSources(dir, m, built); p != "" {
		t.Fatalf("before any change: stale by %s", p)
	}
	h := filepath.Join(dir, "b.h")
	writeAt(t, h, old.Add(2*time.Minute))
	if p := staleSources(dir, m, built); p != h {
		t.Fatalf("b.h changed after a two-source build, an older one-source list beside it: stale by %q, want %q", p, h)
	}
}
