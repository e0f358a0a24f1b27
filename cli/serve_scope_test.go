package cli

import (
	"bytes"
	"flag"
	"strings"
	"testing"
)

// --worker-scope takes function or tenant, and tenant only where there are
// worker processes to share: refused, naming the flag, before the server
// opens anything. (MPS, on only with a CUDA device, is refused where the
// devices are known: isolate.)
func TestServeWorkerScopeRefusals(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unknown", []string{"--worker-scope", "process"}, `--worker-scope "process": want function or tenant`},
		{"empty", []string{"--worker-scope", ""}, `--worker-scope "": want function or tenant`},
		{"unknown without workers", []string{"--worker-scope", "tenants", "--isolation", "none"}, `--worker-scope "tenants"`},
		{"tenant without workers", []string{"--worker-scope", "tenant", "--isolation", "none"}, "--worker-scope tenant: --isolation none"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			args := append([]string{"serve", "--data", t.TempDir(), "--listen", "127.0.0.1:0"}, tt.args...)
			code := Main(args, &Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb})
			if code != 2 || !strings.Contains(errb.String(), tt.want) {
				t.Fatalf("exit %d, stderr %q; want exit 2 and %q", code, errb.String(), tt.want)
			}
		})
	}
}

// The default keeps each function a worker of its own; tenant passes
// where there are worker processes.
func TestWorkerScopeDefault(t *testing.T) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	serveCmd().flags(fs)
	if got := fs.Lookup("worker-scope"); got == nil || got.DefValue != "function" {
		t.Fatalf("--worker-scope %+v, want the default function", got)
	}
	if err := checkWorkerScope(&serveFlags{workerScope: "tenant", isolation: "process"}); err != nil {
		t.Fatalf("tenant with worker processes: %v", err)
	}
}
