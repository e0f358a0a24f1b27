package cli

import (
	"bytes"
	"reflect"
	"strings"
	"testing"

	"github.com/plover-run/plover/auth"
)

func TestTokenNew(t *testing.T) {
	tests := []struct {
		args   []string
		scopes auth.Scope
		funcs  []string
	}{
		{[]string{"token", "new", "ci", "--scopes", "invoke"}, auth.Invoke, []string{"*"}},
		{[]string{"token", "new", "ci-bot@example.com", "--scopes", "invoke,read", "--functions", "cnn,vec*"}, auth.Invoke | auth.Read, []string{"cnn", "vec*"}},
		{[]string{"token", "--scopes=deploy", "--functions=v?c", "new", "deployer"}, auth.Deploy, []string{"v?c"}},
		{[]string{"token", "new", "ops", "--scopes", "admin"}, auth.Admin, []string{"*"}},
	}
	seen := map[string]bool{}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := Main(tt.args, &Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb}); code != 0 {
				t.Fatalf("exit %d, stderr %q", code, errb.String())
			}
			// stdout is the token and nothing else.
			tok, ok := strings.CutSuffix(out.String(), "\n")
			if !ok || tok == "" || strings.ContainsAny(tok, " \t\n") {
				t.Fatalf("stdout %q: want the token alone on one line", out.String())
			}
			if seen[tok] {
				t.Fatal("the same token twice")
			}
			seen[tok] = true
			if strings.Contains(errb.String(), tok) {
				t.Fatal("the token is on stderr too")
			}
			if !strings.Contains(errb.String(), "not stored anywhere") {
				t.Errorf("stderr %q lacks the reminder", errb.String())
			}
			// The one line of stderr with tabs is the auth-file line.
			var line string
			for _, l := range strings.Split(errb.String(), "\n") {
				if strings.Contains(l, "\t") {
					if line != "" {
						t.Fatalf("stderr has two auth-file lines: %q", errb.String())
					}
					line = l
				}
			}
			// stderr whole appends to the file, as the help's 2>>auth does:
			// its notes are comments.
			tab, err := auth.Parse(strings.NewReader("# tokens\n"+errb.String()), "tokens")
			if err != nil {
				t.Fatalf("stderr appended to an auth file does not parse: %v\n%s", err, errb.String())
			}
			p := tab.Lookup([]byte(tok))
			name := tt.args[len(tt.args)-1]
			if tt.args[1] == "new" {
				name = tt.args[2]
			}
			want := &auth.Principal{Name: name, Scopes: tt.scopes, Functions: tt.funcs}
			if !reflect.DeepEqual(p, want) {
				t.Fatalf("Lookup(token) = %+v, want %+v", p, want)
			}
			if tab.Lookup([]byte(tok+"x")) != nil {
				t.Fatal("another token matched")
			}
		})
	}
}

func TestTokenErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string // in stderr
	}{
		{[]string{"token"}, "plover token: takes 2 argument(s), got 0"},
		{[]string{"token", "new", "--scopes", "read"}, "plover token: takes 2 argument(s), got 1"},
		{[]string{"token", "new", "a", "b", "--scopes", "read"}, "plover token: takes 2 argument(s), got 3"},
		{[]string{"token", "hash", "ci"}, `unknown subcommand "hash"`},
		{[]string{"token", "new", "ci"}, "--scopes is required"},
		{[]string{"token", "new", "ci", "--scopes", "invoke,write"}, `--scopes: unknown scope "write"`},
		{[]string{"token", "new", "ci", "--scopes", "read,"}, `--scopes: empty scope`},
		{[]string{"token", "new", "c i", "--scopes", "read"}, `NAME: name "c i" has ' '`},
		{[]string{"token", "new", "c#i", "--scopes", "read"}, `NAME: name "c#i" has '#'`},
		{[]string{"token", "new", strings.Repeat("n", 65), "--scopes", "read"}, `longer than 64`},
		{[]string{"token", "new", "ci", "--scopes", "invoke", "--functions", "vec["}, `--functions: glob "vec["`},
		{[]string{"token", "new", "ci", "--scopes", "invoke", "--functions", "cnn,"}, `--functions: empty glob`},
		{[]string{"token", "new", "ci", "--scopes", "invoke", "--functions", "#cnn"}, `--functions: glob "#cnn" has whitespace or '#'`},
		{[]string{"token", "new", "ci", "--scopes", "invoke", "--functions", "a b"}, `--functions: glob "a b" has whitespace`},
		{[]string{"token", "new", "ci", "--scopes", "invoke", "--functions", ""}, `--functions: no functions`},
		{[]string{"token", "new", "ci", "--bogus"}, "unknown flag: --bogus"},
		// The operator's mistake, named as the server would name it: it
		// was an "internal error: the auth-file line does not parse", exit 1.
		{[]string{"token", "new", "ops", "--scopes", "admin,read", "--functions", "cnn"}, `--functions: an admin token acts on every function`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			code := Main(tt.args, &Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb})
			if code != 2 || !strings.Contains(errb.String(), tt.want) {
				t.Fatalf("exit %d, stderr %q; want exit 2 and %q", code, errb.String(), tt.want)
			}
			if out.Len() != 0 {
				t.Fatalf("stdout %q: want nothing", out.String())
			}
		})
	}
}

func TestTokenHelp(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Main([]string{"token", "--help"}, &Env{Stdout: &out, Stderr: &errb}); code != 0 || !strings.Contains(out.String(), "plover token new NAME --scopes") {
		t.Fatalf("exit %d, stdout %q", code, out.String())
	}
	out.Reset()
	Main([]string{"help"}, &Env{Stdout: &out, Stderr: &errb})
	if !strings.Contains(out.String(), "  token ") {
		t.Fatalf("top usage lacks token: %q", out.String())
	}
}
