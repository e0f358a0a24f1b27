package cli

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// plover invoke --out FILE replaces FILE only with a whole output: an
// answer cut short left its first part in FILE, in place of what FILE
// held. A FILE that cannot be written fails before the request is sent.
func TestInvokeOutReplacedWhole(t *testing.T) {
	in := filepath.Join(t.TempDir(), "in")
	if err := os.WriteFile(in, []byte("input"), 0o644); err != nil {
		t.Fatal(err)
	}
	cut := newRawServer(t, func(c net.Conn, _ *http.Request) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 100\r\n\r\n0123456789")
	})
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	url := testkit.Serve(t, e, httpapi.Options{})

	t.Run("answer cut short", func(t *testing.T) {
		dir := t.TempDir()
		out := filepath.Join(dir, "out.bin")
		os.WriteFile(out, []byte("the old output"), 0o644)
		_, errs, code := runMain(t, nil, "invoke", "f", "--server", cut.url(), "--in", in, "--out", out)
		if code != 1 || !strings.Contains(errs, "(--out "+out+" left as it was)") {
			t.Fatalf("exit %d, stderr %q", code, errs)
		}
		if b, _ := os.ReadFile(out); string(b) != "the old output" {
			t.Errorf("%s now holds %q", out, b)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 1 {
			t.Errorf("%s holds %d files; want out.bin alone (no temporary file left)", dir, len(ents))
		}
	})

	t.Run("whole: replaced, mode and link kept", func(t *testing.T) {
		dir := t.TempDir()
		target := filepath.Join(dir, "target.bin")
		os.WriteFile(target, []byte("the old output, longer than the new"), 0o600)
		link := filepath.Join(dir, "link.bin")
		if err := os.Symlink("target.bin", link); err != nil {
			t.Fatal(err)
		}
		_, errs, code := runMain(t, nil, "invoke", "echo", "--server", url, "--in", in, "--out", link)
		if code != 0 {
			t.Fatalf("exit %d, stderr %q", code, errs)
		}
		if b, _ := os.ReadFile(target); !bytes.HasPrefix(b, []byte("input")) || bytes.Contains(b, []byte("old")) {
			t.Errorf("%s holds %q; want the echo of %q", target, b, "input")
		}
		if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
			t.Errorf("%s is no longer a link: %v", link, err)
		}
		if fi, err := os.Stat(target); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, %v; want 0600 kept", target, fi.Mode(), err)
		}
	})

	t.Run("a device is written through", func(t *testing.T) {
		if _, errs, code := runMain(t, nil, "invoke", "echo", "--server", url, "--in", in, "--out", os.DevNull); code != 0 {
			t.Fatalf("exit %d, stderr %q", code, errs)
		}
	})

	t.Run("unwritable: no request", func(t *testing.T) {
		s := newRawServer(t, nil)
		out := filepath.Join(t.TempDir(), "no", "such", "out.bin")
		_, errs, code := runMain(t, nil, "invoke", "f", "--server", s.url(), "--in", in, "--out", out)
		if code != 1 || !strings.HasPrefix(errs, "plover invoke: --out "+out+": ") {
			t.Fatalf("exit %d, stderr %q", code, errs)
		}
		if got := s.requests(); len(got) != 0 {
			t.Errorf("the server got %q; want nothing sent", got)
		}
	})
}

// refusingReader fails the test that reads it.
type refusingReader struct{ t *testing.T }

func (r refusingReader) Read([]byte) (int, error) {
	r.t.Error("stdin was read")
	return 0, io.EOF
}

// A terminal stdout is refused before stdin is read (exit 2), as plover
// run refuses it: plover invoke read the input its user typed, then said
// the output could not go there.
func TestInvokeTerminalStdoutFirst(t *testing.T) {
	s := newRawServer(t, nil)
	var out, errb bytes.Buffer
	env := &Env{Stdin: refusingReader{t}, Stdout: &out, Stderr: &errb, StdoutIsTerminal: true, StdinIsTerminal: true}
	code := Main([]string{"invoke", "f", "--server", s.url()}, env)
	if code != 2 || !strings.HasPrefix(errb.String(), "plover invoke: the output is binary and stdout is a terminal: write it with --out FILE, or ask for --json") {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
	if got := s.requests(); len(got) != 0 {
		t.Errorf("the server got %q", got)
	}
}
