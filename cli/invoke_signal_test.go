package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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
// whole output and invoke exits 130 (^C's status), saying so.
func TestInvokeSignalsDuringCommit(t *testing.T) {
	runChildInvoke()
	srv := echoOut(t)
	dir := t.TempDir()
	out := filepath.Join(dir, "out.bin")
	writeOwned(t, out, "the old output", 0o644, 0)
	errs, err := childInvoke(t, "TestInvokeSignalsDuringCommit", []string{"invoke", "f", "--server", srv.url(), "--in", inFile(t), "--out", out}, nil, true)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 130 || !strings.Contains(errs, "plover invoke: interrupted once the output was whole: --out "+out+" holds all of it") {
		t.Fatalf("the invoke ended with %v, stderr %q; want exit 130, saying interrupted once the output was whole", err, errs)
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

// An --out FIFO with no reader blocks its open, where signals were caught
// for good from before it (so that a FILE made for the output is removed):
// ^C, SIGTERM and SIGHUP all passed, and SIGKILL alone ended the invoke
// (helper-370's MEDIUM). They are caught once there: the second ends it.
func TestInvokeBlockedOnAFIFOEndsAtASecondSignal(t *testing.T) {
	runChildInvoke()
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestInvokeBlockedOnAFIFOEndsAtASecondSignal$")
	args := []string{"invoke", "f", "--server", "http://127.0.0.1:1", "--in", inFile(t), "--out", fifo}
	cmd.Env = append(os.Environ(), "PLOVER_TEST_INVOKE_CHILD="+strings.Join(args, "\n"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer cmd.Process.Kill()
	// Signalled once it waits in the FIFO's open: its signals caught by then.
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		waits, seen := waitsForAFIFOPartner(cmd.Process.Pid)
		if waits {
			break
		}
		if time.Now().After(end) && !seen {
			t.Skip("this kernel hides where a thread sleeps (/proc/PID/task/*/wchan): the FIFO's open cannot be seen")
		}
		if time.Now().After(end) {
			t.Fatal("the invoke did not come to wait in the FIFO's open within 10 s")
		}
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	limit := time.After(10 * time.Second)
	for sent := 0; ; {
		select {
		case err := <-done:
			var ee *exec.ExitError
			// The first is caught (a FILE made for the output must go),
			// the second is not: ended by the first, nothing was caught.
			if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGINT || sent < 2 {
				t.Fatalf("the invoke ended with %v after %d ^Cs; want ended by the second", err, sent)
			}
			return
		case <-tick.C:
			cmd.Process.Signal(syscall.SIGINT)
			sent++
		case <-limit:
			t.Fatalf("the invoke, blocked opening a FIFO, outlived %d ^Cs over 10 s", sent)
		}
	}
}

// waitsForAFIFOPartner reports whether a thread of pid sleeps in a FIFO's
// open (the kernel's wait_for_partner), and whether any of its threads'
// sleeping places could be seen (a kernel may hide them all as "0").
func waitsForAFIFOPartner(pid int) (waits, seen bool) {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/wchan", pid))
	for _, w := range tasks {
		b, _ := os.ReadFile(w)
		switch string(b) {
		case "wait_for_partner":
			return true, true
		case "", "0":
		default:
			seen = true
		}
	}
	return false, seen
}
