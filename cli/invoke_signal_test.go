package cli

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// childInvoke runs, in a child process of its own (this test binary, run
// for test), plover invoke with args; with stderr, where not nil, as its
// stderr, and commitSignals: two ^Cs as the commit starts. It returns the
// child's stderr (when stderr is nil) and how it ended.
func childInvoke(t *testing.T, test string, args []string, stderr *os.File, commitSignals bool) (string, error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$")
	cmd.Env = append(os.Environ(), "PLOVER_TEST_INVOKE_CHILD="+strings.Join(args, "\n"))
	if commitSignals {
		cmd.Env = append(cmd.Env, "PLOVER_TEST_COMMIT_SIGNALS=1")
	}
	var b bytes.Buffer
	cmd.Stderr = &b
	if stderr != nil {
		cmd.Stderr = stderr
	}
	err := cmd.Run()
	return b.String(), err
}

// runChildInvoke is the child's side of childInvoke: it does not return.
func runChildInvoke() {
	args := os.Getenv("PLOVER_TEST_INVOKE_CHILD")
	if args == "" {
		return
	}
	if os.Getenv("PLOVER_TEST_COMMIT_SIGNALS") != "" {
		beforeCommit = func(sig context.Context) {
			syscall.Kill(os.Getpid(), syscall.SIGINT)
			<-sig.Done()
			time.Sleep(100 * time.Millisecond) // past any release of the signals the first set off
			syscall.Kill(os.Getpid(), syscall.SIGINT)
			time.Sleep(200 * time.Millisecond) // its default action had ended the process by now
		}
	}
	os.Exit(Main(strings.Split(args, "\n"), &Env{Stdin: strings.NewReader(""), Stdout: os.Stdout, Stderr: os.Stderr}))
}

// Signals that come once the answer is whole neither stop the commit
// midway nor pass unsaid: the first went unchecked (invoke exited 0 after
// a ^C), and the second had its default action again, which could end
// the process between a copy in place and its truncation. FILE gets the
// whole output and invoke exits 1, saying so.
func TestInvokeSignalsDuringCommit(t *testing.T) {
	runChildInvoke()
	srv := echoOut(t)
	dir := t.TempDir()
	out := filepath.Join(dir, "out.bin")
	writeOwned(t, out, "the old output", 0o644, 0)
	errs, err := childInvoke(t, "TestInvokeSignalsDuringCommit", []string{"invoke", "f", "--server", srv.url(), "--in", inFile(t), "--out", out}, nil, true)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(errs, "plover invoke: interrupted once the output was whole: --out "+out+" holds all of it") {
		t.Fatalf("the invoke ended with %v, stderr %q; want exit 1, saying interrupted once the output was whole", err, errs)
	}
	fileHolds(t, out, outAnswer)
	if names := tempsIn(dir, "out.bin"); len(names) != 0 {
		t.Errorf("temporary files left: %v", names)
	}
}

// A stderr whose reader has gone (--timing 2>&1 | true) fails no invoke
// whose output goes to --out FILE: the Go runtime ended it by SIGPIPE at
// the --timing line, leaving the temporary file and an empty new FILE.
func TestInvokeOutOutlivesABrokenStderr(t *testing.T) {
	runChildInvoke()
	srv := echoOut(t)
	dir := t.TempDir()
	out := filepath.Join(dir, "w.bin")
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	r.Close() // no reader: a write to w fails with EPIPE
	defer w.Close()
	_, err = childInvoke(t, "TestInvokeOutOutlivesABrokenStderr", []string{"invoke", "f", "--server", srv.url(), "--in", inFile(t), "--out", out, "--timing"}, w, false)
	if err != nil {
		t.Errorf("the invoke ended with %v; want exit 0", err)
	}
	fileHolds(t, out, outAnswer)
	if names := tempsIn(dir, "w.bin"); len(names) != 0 {
		t.Errorf("temporary files left: %v", names)
	}
}
