package engine_test

import (
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// The engine's files form layers: a file calls functions of files below
// it and never of a file that calls it back, directly or around a loop, so
// the request path reads top to bottom (README, "The engine's files"). A
// lower file that must reach up declares an interface (the run pool's
// slotWaiter and unloader).
func TestEngineFilesCallDownOnly(t *testing.T) {
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, n := range names {
		if strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, n, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	// The imports' export data, as the go command builds it (cached).
	out, err := exec.Command("go", "list", "-export", "-deps", "-f", "{{.ImportPath}}={{.Export}}", ".").Output()
	if err != nil {
		t.Fatalf("go list -export: %v", err)
	}
	exports := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if path, file, ok := strings.Cut(l, "="); ok && file != "" {
			exports[path] = file
		}
	}
	lookup := func(path string) (io.ReadCloser, error) {
		if f, ok := exports[path]; ok {
			return os.Open(f)
		}
		return nil, fmt.Errorf("no export data for %s", path)
	}
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}}
	conf := types.Config{Importer: importer.ForCompiler(fset, "gc", lookup)}
	pkg, err := conf.Check("github.com/plover-run/plover/engine", fset, files, info)
	if err != nil {
		t.Fatalf("type-checking the engine: %v", err)
	}
	calls := map[string]map[string][]string{} // file -> file -> functions
	for id, obj := range info.Uses {
		fn, ok := obj.(*types.Func)
		if !ok || fn.Pkg() != pkg {
			continue
		}
		from, to := fset.Position(id.Pos()).Filename, fset.Position(fn.Pos()).Filename
		if from == to {
			continue
		}
		if calls[from] == nil {
			calls[from] = map[string][]string{}
		}
		calls[from][to] = append(calls[from][to], fn.Name())
	}
	if len(calls) < 5 {
		t.Fatalf("found calls between only %d files: the analysis is broken", len(calls))
	}
	// Depth-first search for a loop of calls between files.
	state := map[string]int{}
	var path []string
	var visit func(f string)
	visit = func(f string) {
		switch state[f] {
		case 1:
			i := len(path) - 1
			for path[i] != f {
				i--
			}
			loop := append(append([]string{}, path[i:]...), f)
			var why []string
			for k := 0; k+1 < len(loop); k++ {
				fns := calls[loop[k]][loop[k+1]]
				sort.Strings(fns)
				why = append(why, loop[k]+" -> "+loop[k+1]+" ("+strings.Join(fns, ", ")+")")
			}
			t.Errorf("engine files call in a loop: %s", strings.Join(why, "; "))
			return
		case 2:
			return
		}
		state[f] = 1
		path = append(path, f)
		var next []string
		for g := range calls[f] {
			next = append(next, g)
		}
		sort.Strings(next)
		for _, g := range next {
			visit(g)
		}
		path = path[:len(path)-1]
		state[f] = 2
	}
	var all []string
	for f := range calls {
		all = append(all, f)
	}
	sort.Strings(all)
	for _, f := range all {
		visit(f)
	}
}
