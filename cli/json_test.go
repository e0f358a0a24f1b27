package cli

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

func runMain(t *testing.T, env *Env, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	if env == nil {
		env = &Env{}
	}
	env.Stdin, env.Stdout, env.Stderr = strings.NewReader(""), &out, &errb
	code := Main(args, env)
	return out.String(), errb.String(), code
}

// Every command that reports a result can print it as JSON for scripts.
func TestJSONOutputs(t *testing.T) {
	store := "file://" + filepath.Join(t.TempDir(), "store")
	dir := testkit.BundleDir(t, testkit.Manifest("fn"), nil)
	m := testkit.Manifest("fn")
	m.OutBytes = 128
	dir2 := testkit.BundleDir(t, m, nil)
	e := testkit.Engine(t, engine.Config{})
	url := testkit.Serve(t, e, httpapi.Options{})

	var deployed struct {
		Name, Version, SHA256 string
		Bytes                 int
		Created               bool
	}
	out, errs, code := runMain(t, nil, "deploy", dir, "--store", store, "--json")
	if code != 0 || json.Unmarshal([]byte(out), &deployed) != nil || deployed.Name != "fn" || len(deployed.Version) != 36 || !deployed.Created {
		t.Fatalf("deploy --json: %d %q %q", code, out, errs)
	}
	runMain(t, nil, "deploy", dir2, "--store", store)
	src := filepath.Join(t.TempDir(), "src")
	tests := []struct {
		name string
		args []string
		want string // a JSON key the output must have
	}{
		{"rollback", []string{"rollback", "fn", deployed.Version[:8], "--store", store, "--json"}, `"version": "` + deployed.Version + `"`},
		{"gc", []string{"gc", "--store", store, "--json"}, `"removed": [`},
		{"version", []string{"version", "--json"}, `"abi": "2.2"`},
		{"devices", []string{"devices", "--json"}, `"gpus": [`},
		{"deploy to a server", []string{"deploy", dir, "--server", url, "--json"}, `"created": true`},
		{"rm", []string{"rm", "fn", "--server", url, "--json"}, `"deleted": "fn"`},
		{"token", []string{"token", "new", "ci", "--scopes", "read", "--json"}, `"line": "ci\tread\t`},
		{"init", []string{"init", "saxpy", "--dir", src, "--json"}, `"entry": "saxpy_entry"`},
		{"build", []string{"build", src, "--json"}, `"library": "saxpy.so"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, errs, code := runMain(t, nil, tt.args...)
			var v any
			if code != 0 || json.Unmarshal([]byte(out), &v) != nil || !strings.Contains(out, tt.want) {
				t.Fatalf("%v: exit %d, stdout %q, stderr %q; want JSON with %s", tt.args, code, out, errs, tt.want)
			}
		})
	}
}

func TestVersionFlagAndStdinHint(t *testing.T) {
	out, _, code := runMain(t, nil, "--version")
	if code != 0 || !strings.HasPrefix(out, "plover ") || !strings.Contains(out, "ABI 2.2") {
		t.Fatalf("--version: %d %q", code, out)
	}
	// Reading the input from a terminal says so before it waits.
	_, errs, _ := runMain(t, &Env{StdinIsTerminal: true}, "invoke", "fn", "--in", "-", "--out", filepath.Join(t.TempDir(), "o"), "--server", "http://127.0.0.1:1")
	if !strings.Contains(errs, "reading the input from stdin (Ctrl-D to end)") {
		t.Fatalf("stdin on a terminal: %q", errs)
	}
	_, errs, _ = runMain(t, nil, "invoke", "fn", "--in", "-", "--out", filepath.Join(t.TempDir(), "o"), "--server", "http://127.0.0.1:1")
	if strings.Contains(errs, "Ctrl-D") {
		t.Fatalf("stdin not a terminal, yet: %q", errs)
	}
}
