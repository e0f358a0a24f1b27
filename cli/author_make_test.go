package cli

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
)

// The Makefile plover init writes rebuilds the library when a header the
// kernel includes changed, beside the source or under include/: it once
// listed only the two ABI headers, and make said "up to date" over a
// changed one. With one source the compiler's own list (-MMD) says which
// headers, and a header deleted since stops no make (-MP); with several
// (SRC given on make's command line) every header beside them and in
// include/ is a prerequisite. The host build of the first is then fresh
// to plover run too, which reads make's list.
func TestMakefileRebuildsWhenAHeaderChanged(t *testing.T) {
	needMake(t)
	for _, tt := range []struct {
		name, target string
		header       string // its path from the source directory
		include      string // as the kernel names it
		extra        bool   // a second source, extra.cu, including extra.h, is in SRC
	}{
		{"host, beside the source", abi.TargetHost, "offset.h", "offset.h", false},
		{"host, under include", abi.TargetHost, "include/offset.h", "offset.h", false},
		{"host, two sources", abi.TargetHost, "offset.h", "offset.h", true},
		{"cuda, beside the source", abi.TargetCUDA, "offset.h", "offset.h", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			compilerFor(t, tt.target)
			src := initDir(t, "mkh")
			m := mustManifest(t, src)
			h := includeHeader(t, src, tt.header, tt.include)
			args := makeArgs(t, tt.target)
			// Each header, and what it is changed to.
			changed := [][2]string{{h, "#define OFFSET 100.0f\n"}}
			if tt.extra {
				os.WriteFile(filepath.Join(src, "extra.h"), []byte("#define EXTRA 1\n"), 0o644)
				os.WriteFile(filepath.Join(src, "extra.cu"), []byte("#include \"extra.h\"\nint mkh_extra = EXTRA;\n"), 0o644)
				args = append(args, "SRC=mkh.cu extra.cu")
				changed = append(changed, [2]string{filepath.Join(src, "extra.h"), "#define EXTRA 2\n"})
			}
			built := filepath.Join(src, BuildDir, tt.target)
			lib := filepath.Join(built, m.Library)
			runMake(t, src, args...)
			for _, c := range changed {
				at := backdate(t, lib, src)
				if !makeUpToDate(t, src, args...) {
					t.Fatal("make would rebuild before any change")
				}
				if err := os.WriteFile(c[0], []byte(c[1]), 0o644); err != nil {
					t.Fatal(err)
				}
				if makeUpToDate(t, src, args...) {
					t.Fatalf("%s changed, and make says %s is up to date", c[0], lib)
				}
				runMake(t, src, args...)
				if fi, err := os.Stat(lib); err != nil || !fi.ModTime().After(at) {
					t.Fatalf("make did not rebuild %s after %s changed: %v", lib, c[0], err)
				}
			}
			if _, err := os.Stat(filepath.Join(built, depFile(m))); (err == nil) == tt.extra {
				t.Fatalf("dependency file %s: %v, want one only for one source", depFile(m), err)
			}
			if tt.target == abi.TargetHost && !tt.extra {
				inPath := filepath.Join(t.TempDir(), "in.bin")
				os.WriteFile(inPath, float32sLE(1, 2, 3, 4), 0o644)
				if ys, stderr := runFloats(t, built, inPath); !reflect.DeepEqual(ys, []float32{103, 105, 107, 109}) || strings.Contains(stderr, "rebuilding") {
					t.Fatalf("make's build: %v, stderr %q; want the new header's sums, no rebuild", ys, stderr)
				}
			}
			// The header and its #include gone: the list make reads still
			// names it, and its empty rule (-MP) lets make go on.
			cu := filepath.Join(src, "mkh.cu")
			os.WriteFile(cu, []byte(strings.Replace(strings.Replace(readText(t, cu), "#include \""+tt.include+"\"\n", "", 1), " + OFFSET", "", 1)), 0o644)
			if err := os.Remove(h); err != nil {
				t.Fatal(err)
			}
			runMake(t, src, args...)
		})
	}
}

// makeArgs are make's arguments for target: for cuda, the host compiler
// plover build would give nvcc (CCBIN), where the default g++ is too new.
func makeArgs(t *testing.T, target string) []string {
	t.Helper()
	if target != abi.TargetCUDA {
		return []string{target}
	}
	tg, _ := abi.TargetOf(target)
	argv, err := tg.Command(&abi.Build{Sources: []string{"k.cu"}}, "k.so", "")
	if err != nil {
		t.Skipf("nvcc cannot build here: %v", err)
	}
	for i, a := range argv {
		if a == "-ccbin" && i+1 < len(argv) {
			return []string{target, "CCBIN=" + argv[i+1]}
		}
	}
	return []string{target}
}

// needMake skips t unless make is here.
func needMake(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make not found: the generated Makefile is not checked here")
	}
}

// runMake runs make with args in dir and fails t when it fails.
func runMake(t *testing.T, dir string, args ...string) {
	t.Helper()
	mk := exec.Command("make", args...)
	mk.Dir = dir
	if out, err := mk.CombinedOutput(); err != nil {
		t.Fatalf("make %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// makeUpToDate asks make (-q) whether args' targets in dir are up to date.
func makeUpToDate(t *testing.T, dir string, args ...string) bool {
	t.Helper()
	mk := exec.Command("make", append([]string{"-q"}, args...)...)
	mk.Dir = dir
	out, err := mk.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok && ee.ExitCode() == 1 {
		return false
	}
	if err != nil {
		t.Fatalf("make -q %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return true
}

// backdate dates every file under dirs an hour ago and the library lib a
// minute after, so that a file written next is newer than lib without
// waiting for the clock. It returns lib's new time.
func backdate(t *testing.T, lib string, dirs ...string) time.Time {
	t.Helper()
	past := time.Now().Add(-time.Hour)
	for _, dir := range dirs {
		filepath.WalkDir(dir, func(p string, _ fs.DirEntry, _ error) error { return os.Chtimes(p, past, past) })
	}
	if err := os.Chtimes(lib, past, past.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	return past.Add(time.Minute)
}

func readText(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// plover build writes the list the Makefile reads (one name, NAME.d), so
// it gives the headers empty rules too (-MP): without them a make after
// the header and its #include were deleted stopped at "No rule to make
// target".
func TestMakeAfterPloverBuildOfADeletedHeader(t *testing.T) {
	needMake(t)
	compilerFor(t, abi.TargetHost)
	src := headerFixture(t, "offset.h", "offset.h", nil)
	cu := filepath.Join(src, "hdr.cu")
	os.WriteFile(cu, []byte(strings.Replace(strings.Replace(readText(t, cu), "#include \"offset.h\"\n", "", 1), " + OFFSET", "", 1)), 0o644)
	if err := os.Remove(filepath.Join(src, "offset.h")); err != nil {
		t.Fatal(err)
	}
	runMake(t, src, abi.TargetHost)
}
