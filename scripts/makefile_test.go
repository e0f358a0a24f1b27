package scripts

import (
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
