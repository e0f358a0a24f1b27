// Package layout checks README.md's "Layout" against the module: every
// package's directory is listed, and imports run downwards in the list (a
// package imports only packages listed above it, or inside its own
// directory), as the README says they do.
package layout

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const module = "github.com/plover-run/plover/"

// listed reads the Layout block: the directories in order, a subpackage
// line (indented) joined to the directory above it.
func listed(t *testing.T, readme string) []string {
	t.Helper()
	f, err := os.Open(readme)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var dirs []string
	var parent string
	in, fence := false, 0
	for sc := bufio.NewScanner(f); sc.Scan(); {
		line := sc.Text()
		switch {
		case line == "## Layout":
			in = true
			continue
		case !in:
			continue
		case strings.HasPrefix(line, "```"):
			if fence++; fence == 2 {
				return dirs
			}
			continue
		case fence == 0 || strings.TrimSpace(line) == "":
			continue
		}
		name := strings.Fields(line)[0]
		if !strings.HasSuffix(name, "/") {
			continue // a description's next line
		}
		name = strings.TrimSuffix(name, "/")
		switch {
		case !strings.HasPrefix(line, " "):
			parent = name
			dirs = append(dirs, name)
		case strings.HasPrefix(line, "  ") && !strings.HasPrefix(line, "   "):
			dirs = append(dirs, parent+"/"+name)
		}
	}
	t.Fatalf("%s: no Layout block with its closing fence", readme)
	return nil
}

// place is the position of the listed directory that holds pkg (the
// deepest), or -1.
func place(pos map[string]int, pkg string) (string, int) {
	for d := pkg; d != "." && d != ""; d = filepath.Dir(d) {
		if i, ok := pos[d]; ok {
			return d, i
		}
	}
	return "", -1
}

func TestLayoutIsTrue(t *testing.T) {
	root := filepath.Join("..", "..")
	dirs := listed(t, filepath.Join(root, "README.md"))
	pos := map[string]int{}
	for i, d := range dirs {
		pos[d] = i
	}
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg := strings.TrimPrefix(f[0], module)
		if pkg == f[0] || strings.HasPrefix(pkg, "internal/") {
			continue // the module's root, or test helpers (imported by tests only)
		}
		dir, at := place(pos, pkg)
		if at < 0 {
			t.Errorf("package %s is in no directory README.md's Layout lists", pkg)
			continue
		}
		for _, imp := range f[1:] {
			ip, ok := strings.CutPrefix(imp, module)
			if !ok {
				continue
			}
			idir, iat := place(pos, ip)
			if iat < 0 || idir == dir || strings.HasPrefix(idir, dir+"/") {
				continue // unlisted (reported above) or inside its own directory
			}
			if iat > at {
				t.Errorf("%s imports %s, listed below it in README.md's Layout (%s at %d, %s at %d): imports must run downwards", pkg, ip, dir, at, idir, iat)
			}
		}
	}
}
