package cli

import (
	"bytes"
	"strings"
	"testing"
)

func TestMainArguments(t *testing.T) {
	tests := []struct {
		args []string
		code int
		want string // in stdout or stderr (help goes to stdout)
	}{
		{[]string{"ls", "extra"}, 2, "plover ls: takes 0 argument(s), got 1"},
		{[]string{"rollback", "vecadd"}, 2, "plover rollback: takes 2 argument(s), got 1"},
		{[]string{"invoke"}, 2, "plover invoke: takes 1 argument(s), got 0"},
		{[]string{"deploy", "a", "b"}, 2, "plover deploy: takes 1 argument(s), got 2"},
		{[]string{"nope"}, 2, `unknown command "nope"`},
		{[]string{"rm", "--help"}, 0, "plover rm NAME"},
		{[]string{"version"}, 0, ""},
		{[]string{"invoke", "--bogus", "x"}, 2, "unknown flag: --bogus"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			code := Main(tt.args, &Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb})
			if code != tt.code || !strings.Contains(out.String()+errb.String(), tt.want) {
				t.Fatalf("exit %d, output %q; want exit %d and %q", code, out.String()+errb.String(), tt.code, tt.want)
			}
		})
	}
}
