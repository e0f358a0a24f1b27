package scripts

import (
	"bufio"
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// runMake runs the repository's Makefile (one directory up) with args and
// returns its output and whether it exited 0.
func runMake(t *testing.T, args ...string) (string, bool) {
	t.Helper()
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make not found")
	}
	cmd := exec.Command("make", append([]string{"-C", "..", "--no-print-directory"}, args...)...)
	b, err := cmd.CombinedOutput()
	return string(b), err == nil
}

// make vet's gofmt-check fails on a file gofmt would change and on one it
// cannot parse (gofmt -l piped into grep passed the latter: only grep's
// status counted), here a file go vet leaves out by its build tags.
func TestMakeGofmtCheckFailsOnAParseError(t *testing.T) {
	gofmt, err := exec.LookPath("gofmt")
	if err != nil {
		t.Skip("gofmt not found")
	}
	for _, tc := range []struct {
		name, src string
		pass      bool
	}{
		{"formatted", "package x\n\nfunc F() {}\n", true},
		{"needs gofmt", "package x\nfunc F()   {}\n", false},
		{"does not parse, excluded by its build tags", "//go:build !unix\n\npackage x\n\nfunc {\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeUnder(t, dir, "src/x.go", []byte(tc.src), 0o644)
			// gofmt as the recipe runs it, on this tree instead of the repository.
			stub := filepath.Join(dir, "gofmt")
			writeUnder(t, dir, "gofmt", []byte("#!/bin/sh\ncd '"+filepath.Join(dir, "src")+"' && exec '"+gofmt+"' \"$@\"\n"), 0o755)
			out, ok := runMake(t, "gofmt-check", "GOFMT="+stub)
			if ok != tc.pass {
				t.Errorf("make gofmt-check passed %v, want %v:\n%s", ok, tc.pass, out)
			}
			if !tc.pass && !strings.Contains(out, "x.go") {
				t.Errorf("make gofmt-check does not name the file:\n%s", out)
			}
		})
	}
}

// Every file a //go:embed in the repository's Go code names is a
// prerequisite of bin/plover, so that make demo and make bench rebuild it
// after a console or scaffold edit instead of running a stale binary.
func TestMakefileRebuildsOnEmbeddedFiles(t *testing.T) {
	db, _ := runMake(t, "-pq", "bin/plover") // -q: exits 1 when out of date; the database is printed either way
	var prereqs map[string]bool
	sc := bufio.NewScanner(strings.NewReader(db))
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		// Not "bin/plover: .SHELLSTATUS := 0", a target-specific variable.
		if rest, ok := strings.CutPrefix(sc.Text(), "bin/plover:"); ok && !strings.Contains(rest, "=") {
			prereqs = map[string]bool{}
			for _, f := range strings.Fields(rest) {
				prereqs[strings.TrimPrefix(f, "./")] = true
			}
			break
		}
	}
	if prereqs == nil {
		t.Fatalf("no bin/plover rule in make -p's database:\n%.2000s", db)
	}
	embedded := embeddedFiles(t, "..")
	if len(embedded) == 0 {
		t.Fatal("no //go:embed found: the scan is broken")
	}
	for _, f := range embedded {
		if !prereqs[f] {
			t.Errorf("%s is embedded (//go:embed) but not a prerequisite of bin/plover (Makefile GO_SRC)", f)
		}
	}
}

// embeddedFiles lists, relative to root, the files the //go:embed lines of
// root's non-test Go files name (a directory: the files under it but those
// named .* or _*, as go:embed takes them).
func embeddedFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != root && (n == "build" || n == "testdata" || strings.HasPrefix(n, ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for line := range bytes.Lines(src) {
			pats, ok := strings.CutPrefix(strings.TrimSpace(string(line)), "//go:embed ")
			if !ok {
				continue
			}
			for _, pat := range strings.Fields(pats) {
				matches, _ := filepath.Glob(filepath.Join(filepath.Dir(p), pat))
				if len(matches) == 0 {
					t.Errorf("%s: //go:embed %s matches nothing", p, pat)
				}
				for _, m := range matches {
					err := filepath.WalkDir(m, func(q string, e fs.DirEntry, err error) error {
						if err != nil {
							return err
						}
						if n := e.Name(); q != m && (strings.HasPrefix(n, ".") || strings.HasPrefix(n, "_")) {
							if e.IsDir() {
								return filepath.SkipDir
							}
							return nil
						}
						if !e.IsDir() {
							rel, _ := filepath.Rel(root, q)
							files = append(files, filepath.ToSlash(rel))
						}
						return nil
					})
					if err != nil {
						return err
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}
