package main_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/internal/testkit"
)

// health runs plover health with args and returns its exit status and
// what it printed, stdout then stderr. PLOVER_ variables that would steer
// it elsewhere are cleared: each case names its server.
func health(t *testing.T, bin string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"health"}, args...)...)
	cmd.Env = append(os.Environ(), "PLOVER_SERVER=", "PLOVER_CACERT=", "PLOVER_TIMEOUT=", "PLOVER_READY=", "PLOVER_QUIET=")
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, out.String(), errb.String()
	case errors.As(err, &ee):
		return ee.ExitCode(), out.String(), errb.String()
	}
	t.Fatalf("plover health %s: %v", strings.Join(args, " "), err)
	return 0, "", ""
}

// TestHealthCommand: plover health against real plover serve processes,
// plain and TLS, and against the address of one that has stopped, as a
// container's HEALTHCHECK runs it.
func TestHealthCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts servers")
	}
	bin := buildPlover(t)
	dir := t.TempDir()
	ca, cert, key, _ := testkit.WriteCerts(t, dir)
	plain := startIsoServer(t, bin, t.TempDir(), nil)
	secure := startIsoServer(t, bin, t.TempDir(), nil, "--tls-cert", cert, "--tls-key", key)
	if !strings.HasPrefix(secure.url, "https://") {
		t.Fatalf("TLS server at %s", secure.url)
	}
	asHTTP := strings.Replace(secure.url, "https://", "http://", 1)

	tests := []struct {
		name   string
		args   []string
		code   int
		stdout string // in stdout; "" wants it empty
		stderr string // in stderr
	}{
		{"healthy", []string{"--server", plain.url}, 0, "healthy: " + plain.url + "/healthz answered 200; 1 device: host", ""},
		{"ready", []string{"--server", plain.url, "--ready"}, 0, "ready: " + plain.url + "/readyz answered 200", ""},
		{"quiet", []string{"--server", plain.url, "-q", "--timeout", "2s"}, 0, "", ""},
		{"TLS", []string{"--server", secure.url, "--cacert", ca}, 0, "healthy: " + secure.url + "/healthz answered 200", ""},
		{"TLS ready", []string{"--server", secure.url, "--cacert", ca, "--ready"}, 0, "ready: " + secure.url + "/readyz answered 200", ""},
		{"TLS without its CA", []string{"--server", secure.url}, 3, "",
			"GET " + secure.url + "/healthz: no answer: TLS: the server's certificate is not trusted"},
		{"plain HTTP to TLS", []string{"--server", asHTTP}, 3, "",
			"GET " + asHTTP + "/healthz: no answer: the server speaks TLS there and closed this plain-HTTP request unread, before any TLS handshake (use " + secure.url + ")"},
		{"unreadable CA", []string{"--server", secure.url, "--cacert", filepath.Join(dir, "none.pem")}, 2, "", "--cacert: open "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errs := health(t, bin, tt.args...)
			if code != tt.code {
				t.Fatalf("exit %d, want %d; stdout %q, stderr %q", code, tt.code, out, errs)
			}
			if tt.stdout == "" && out != "" || !strings.Contains(out, tt.stdout) {
				t.Errorf("stdout %q, want %q", out, tt.stdout)
			}
			if !strings.Contains(errs, tt.stderr) || tt.stderr == "" && errs != "" {
				t.Errorf("stderr %q, want %q", errs, tt.stderr)
			}
		})
	}

	// A server that has stopped: nothing listens on its port, and plover
	// health says so, naming the address, well within its bound.
	plain.stop(t)
	start := time.Now()
	code, out, errs := health(t, bin, "--server", plain.url)
	if want := "GET " + plain.url + "/healthz: no answer: connection refused"; code != 3 || out != "" || !strings.Contains(errs, want) {
		t.Fatalf("after the server stopped: exit %d, stdout %q, stderr %q; want exit 3 and %q", code, out, errs, want)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("a refused connection took %v to report", d)
	}
}
