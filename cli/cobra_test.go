package cli

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra/doc"

	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// envOf is an environment holding only vars.
func envOf(vars map[string]string) *Env {
	return &Env{Getenv: func(k string) string { return vars[k] }}
}

// Every flag can come from PLOVER_<FLAG>; the command line wins, and a bad
// value names the variable.
func TestFlagsFromEnvironment(t *testing.T) {
	url := testkit.Serve(t, testkit.Engine(t, engine.Config{}), httpapi.Options{})
	tests := []struct {
		name     string
		vars     map[string]string
		args     []string
		code     int
		stdout   string // in stdout
		stderr   string // in stderr
		noStdout string // must not be in stdout
	}{
		{"bool flag", map[string]string{"PLOVER_JSON": "true"}, []string{"version"}, 0, `"abi": "2.2"`, "", ""},
		{"command line wins", map[string]string{"PLOVER_JSON": "true"}, []string{"version", "--json=false"}, 0, "plover dev (ABI", "", `"abi"`},
		{"bad value names the variable", map[string]string{"PLOVER_JSON": "maybe"}, []string{"version"}, 2, "", "$PLOVER_JSON (for --json)", ""},
		{"string flag", map[string]string{"PLOVER_SERVER": url, "PLOVER_JSON": "1"}, []string{"ls"}, 0, `"functions": []`, "", ""},
		{"string flag from a variable", map[string]string{"PLOVER_SCOPES": "invoke,read"}, []string{"token", "new", "ci"}, 0, "", "ci\tread,invoke\t", ""},
		{"second string flag", map[string]string{"PLOVER_SCOPES": "read", "PLOVER_FUNCTIONS": "cnn"}, []string{"token", "new", "ci"}, 0, "", "\tcnn\n", ""},
		{"empty is unset", map[string]string{"PLOVER_SCOPES": ""}, []string{"token", "new", "ci"}, 2, "", "--scopes is required", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, errs, code := runMain(t, envOf(tt.vars), tt.args...)
			if code != tt.code || !strings.Contains(out, tt.stdout) || !strings.Contains(errs, tt.stderr) ||
				(tt.noStdout != "" && strings.Contains(out, tt.noStdout)) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit %d, %q in stdout, %q in stderr", code, out, errs, tt.code, tt.stdout, tt.stderr)
			}
		})
	}
	// Help lists each command's variables.
	out, _, _ := runMain(t, nil, "serve", "--help")
	for _, v := range []string{"PLOVER_LISTEN", "PLOVER_MAX_CONNS", "PLOVER_AUTH_FILE", "PLOVER_S3_ENDPOINT"} {
		if !strings.Contains(out, v) {
			t.Errorf("serve --help does not name %s:\n%s", v, out)
		}
	}
}

// Completion goes through cobra's hidden __complete command, which is what
// the scripts from "plover completion bash|zsh|fish" call.
func TestCompletion(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("vecadd"), nil))
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("cnn"), nil))
	url := testkit.Serve(t, e, httpapi.Options{})
	tests := []struct {
		name    string
		env     *Env
		args    []string
		want    []string
		notWant []string
	}{
		{"commands", nil, []string{"__complete", "ro"}, []string{"rollback"}, []string{"run\n", "worker"}},
		{"flags", nil, []string{"__complete", "invoke", "x", "--ti"}, []string{"--timing"}, []string{"--json"}},
		{"function names from the server", nil, []string{"__complete", "invoke", "--server", url, "v"}, []string{"vecadd"}, []string{"cnn"}},
		{"server from the environment", envOf(map[string]string{"PLOVER_SERVER": url}), []string{"__complete", "rm", ""}, []string{"vecadd", "cnn"}, nil},
		{"no server: nothing, quickly", nil, []string{"__complete", "rm", "--server", "http://127.0.0.1:1", ""}, []string{":4"}, []string{"vecadd"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, errs, code := runMain(t, tt.env, tt.args...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errs)
			}
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("want %q in %q", w, out)
				}
			}
			for _, w := range tt.notWant {
				if strings.Contains(out, w) {
					t.Errorf("do not want %q in %q", w, out)
				}
			}
		})
	}
	for _, sh := range []string{"bash", "zsh", "fish"} {
		out, errs, code := runMain(t, nil, "completion", sh)
		if code != 0 || !strings.Contains(out, "__complete") {
			t.Errorf("completion %s: exit %d, %d bytes, %s", sh, code, len(out), errs)
		}
	}
}

func TestDidYouMean(t *testing.T) {
	_, errs, code := runMain(t, nil, "invok")
	if code != 2 || !strings.Contains(errs, `unknown command "invok" (did you mean "invoke"?)`) {
		t.Fatalf("exit %d: %q", code, errs)
	}
	_, errs, code = runMain(t, nil)
	if code != 2 || !strings.Contains(errs, "Available Commands") {
		t.Fatalf("no command: exit %d: %q", code, errs)
	}
}

// The CLI reference in docs/cli is generated from the commands; this test
// fails when it is stale. Regenerate with: make cli-docs.
func TestCLIReferenceUpToDate(t *testing.T) {
	want := filepath.Join(testkit.Root(), "docs", "cli")
	dir := want
	if os.Getenv("PLOVER_UPDATE_CLI_DOCS") == "" {
		dir = t.TempDir()
	} else {
		os.RemoveAll(dir)
		os.MkdirAll(dir, 0o755)
	}
	if err := GenerateReference(dir); err != nil {
		t.Fatal(err)
	}
	got, _ := filepath.Glob(filepath.Join(dir, "*.md"))
	if len(got) < 15 {
		t.Fatalf("generated %d pages", len(got))
	}
	for _, g := range got {
		b, _ := os.ReadFile(g)
		w, err := os.ReadFile(filepath.Join(want, filepath.Base(g)))
		if err != nil || string(w) != string(b) {
			t.Errorf("docs/cli/%s is stale or missing: run make cli-docs", filepath.Base(g))
		}
	}
	old, _ := filepath.Glob(filepath.Join(want, "*.md"))
	if len(old) != len(got) {
		t.Errorf("docs/cli has %d pages, the commands make %d: run make cli-docs", len(old), len(got))
	}
}

// GenerateReference writes the Markdown CLI reference, a page per command,
// into dir. It lives in a test so that the plover binary does not carry
// cobra's documentation generators.
func GenerateReference(dir string) error {
	root := newRoot(&Env{Stdin: strings.NewReader(""), Stdout: io.Discard, Stderr: io.Discard})
	root.InitDefaultCompletionCmd()
	root.InitDefaultHelpCmd()
	root.InitDefaultVersionFlag() // cobra adds it as the command runs: --help shows it
	return doc.GenMarkdownTree(root, dir)
}
