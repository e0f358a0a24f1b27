package cli

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// A --server (or $PLOVER_SERVER) that is not a server URL is a command line
// that cannot run: exit 2, naming where the value came from and what is
// wrong with it, not "cannot reach the plover server" (exit 1, as if the
// server were down).
func TestServerURLMalformedIsUsage(t *testing.T) {
	tests := []struct {
		name string
		vars map[string]string
		args []string
		want string // in stderr
	}{
		{"scheme", nil, []string{"ls", "--server", "ftp://127.0.0.1:8080"}, `--server "ftp://127.0.0.1:8080": want http:// or https://`},
		{"bracket", nil, []string{"ls", "--server", "http://[::1"}, `--server "http://[::1": `},
		{"port", nil, []string{"ls", "--server", "http://127.0.0.1:99999"}, `--server "http://127.0.0.1:99999": port 99999`},
		{"no host", nil, []string{"ls", "--server", "http://"}, `--server "http://": no host`},
		{"query", nil, []string{"ls", "--server", "http://127.0.0.1:8080?x=1"}, `--server "http://127.0.0.1:8080?x=1": `},
		{"colon", nil, []string{"ls", "--server", "http//127.0.0.1:8080"}, `--server "http//127.0.0.1:8080": no host but "http": a ':' missing after the scheme?`},
		{"variable", map[string]string{"PLOVER_SERVER": "ftp://h:1"}, []string{"ls"}, `$PLOVER_SERVER "ftp://h:1": want http:// or https://`},
		{"invoke", nil, []string{"invoke", "f", "--server", "tcp://h:1"}, `--server "tcp://h:1"`},
		{"bench", nil, []string{"bench", "f", "--size", "4", "--server", "tcp://h:1"}, `--server "tcp://h:1"`},
		// Credentials, which the server does not take, refused unechoed.
		{"password", nil, []string{"ls", "--server", "http://alice:hunter2@127.0.0.1:1"}, `--server: an @ in it`},
		{"user", map[string]string{"PLOVER_SERVER": "http://alice@h:1"}, []string{"ls"}, `$PLOVER_SERVER: an @ in it`},
		// Before any other refusal, which would echo the value.
		{"password, a query", nil, []string{"ls", "--server", "http://u:hunter2@h/?q"}, `--server: an @ in it`},
		{"password, a scheme", nil, []string{"ls", "--server", "ftp://u:hunter2@h"}, `--server: an @ in it`},
		{"password, no host", nil, []string{"ls", "--server", "http://u:hunter2@:8080"}, `--server: an @ in it`},
		{"password, unparsed", nil, []string{"ls", "--server", "http://u:hunter2@h:8080/%zz"}, `--server: an @ in it`},
		{"password with a slash", nil, []string{"ls", "--server", "http://u:hunter2/x@h:1"}, `--server: an @ in it`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, errs, code := runMain(t, envOf(tt.vars), tt.args...)
			if code != 2 || !strings.Contains(errs, tt.want) || strings.Contains(errs, "cannot reach") || strings.Contains(errs, "hunter2") {
				t.Fatalf("exit %d, stderr %q; want exit 2 and %q", code, errs, tt.want)
			}
		})
	}
	// Those that are URLs still go on to the server: one without a scheme
	// is http://, a path is kept (a server behind a proxy's prefix).
	for _, s := range []string{"127.0.0.1:1", "http://127.0.0.1:1/prefix/", "https://[::1]:1"} {
		_, errs, code := runMain(t, envOf(nil), "ls", "--server", s)
		if code != 1 || !strings.Contains(errs, "cannot reach the plover server") {
			t.Errorf("--server %s: exit %d, stderr %q; want exit 1, cannot reach", s, code, errs)
		}
	}
}

// plover help with a mistyped command says so, as plover with one does, and
// exits 2; it printed the root's help and exited 0.
func TestHelpUnknownCommand(t *testing.T) {
	out, errs, code := runMain(t, envOf(nil), "help", "invok")
	if code != 2 || !strings.Contains(errs, `unknown command "invok" (did you mean "invoke"?)`) || strings.Contains(out, "Available Commands") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errs)
	}
	out, _, code = runMain(t, envOf(nil), "help", "invoke")
	if code != 0 || !strings.Contains(out, "plover invoke NAME") {
		t.Fatalf("help invoke: exit %d, stdout %q", code, out)
	}
}

// A duration from the environment without its unit gets the hint the
// command line's does.
func TestEnvDurationWithoutUnit(t *testing.T) {
	_, errs, code := runMain(t, envOf(map[string]string{"PLOVER_TIMEOUT": "5"}), "invoke", "f")
	if code != 2 || !strings.Contains(errs, "$PLOVER_TIMEOUT (for --timeout)") || !strings.Contains(errs, "a duration takes a unit") {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
}

// A flag's help shows one default: a duration whose default is 0 shows
// none from the flag library, as pflag's own durations do, so logs --since
// keeps only the default its usage says (the usability review's "(default:
// all the server keeps, ...) (default 0s)").
func TestHelpShowsOneDefault(t *testing.T) {
	out, _, code := runMain(t, nil, "logs", "--help")
	var since string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "--since duration") {
			since = l
		}
	}
	if code != 0 || strings.Count(since, "(default") != 1 || !strings.Contains(since, "(default: all the server keeps") {
		t.Fatalf("exit %d, --since: %q; want one default, its usage's", code, since)
	}
	root := newRoot(&Env{Stdin: strings.NewReader(""), Stdout: io.Discard, Stderr: io.Discard})
	for _, c := range root.Commands() {
		if u := c.Flags().FlagUsages(); strings.Contains(u, "(default 0s)") {
			t.Errorf("plover %s --help shows a default of 0s:\n%s", c.Name(), u)
		}
	}
}

// A token read from a file ($(cat f) keeps no newline, a variable set from
// one may) is sent without the white space around it.
func TestTokenWithoutItsNewline(t *testing.T) {
	got := make(chan string, 1)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("Authorization")
		w.Write([]byte(`{"functions":[]}`))
	}))
	defer ts.Close()
	_, errs, code := runMain(t, envOf(map[string]string{"PLOVER_SERVER": ts.URL, "PLOVER_TOKEN": "s3cr3t\n"}), "ls")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if a := <-got; a != "Bearer s3cr3t" {
		t.Fatalf("sent Authorization %q", a)
	}
}
