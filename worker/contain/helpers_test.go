package contain

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/plover-run/plover/internal/forkthread"
)

// Enter and RestrictFS cannot be undone, so the tests run them in a
// re-executed copy of the test binary. The variable names the role the
// copy plays; TestMain dispatches on it before any test runs.
const childEnv = "CONTAIN_TEST_CHILD"

// childTimeout bounds every wait on a child. It only turns a hang (a
// signal that never arrives) into a failure; no test relies on it to
// order events.
const childTimeout = 2 * time.Minute

// startCThread and openOnCThread start a thread from C, unknown to the Go
// runtime, and open a file on it; nil without cgo.
var (
	startCThread  func() (int, error)
	openOnCThread func(path string) error
)

func init() {
	if os.Getenv(childEnv) != "" {
		// Keep the main goroutine on the main thread for the whole
		// child run. No other goroutine can then run on (and lock)
		// the main thread, which the runtime never ends.
		runtime.LockOSThread()
	}
}

// startChild starts a child from a thread that never ends: a child that
// runs Enter arms SIGKILL as its parent-death signal, which the kernel
// sends when the forking thread ends, as a closed Spawner's does (see
// forkthread). The server starts its workers from its Spawner's thread for
// the same reason.
func startChild(cmd *exec.Cmd) error { return forkthread.Start(cmd) }

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		runChild(mode)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func runChild(mode string) {
	switch mode {
	case "landlock-threads":
		childLandlockThreads()
	case "landlock-default":
		childLandlockDefault()
	case "landlock-ipc":
		childLandlockIPC()
	case "enter-drop":
		childEnterDrop()
	case "enter-keep":
		childEnterKeep()
	case "pdeath-middle":
		childPdeathMiddle()
	case "pdeath-grandchild":
		childPdeathGrandchild()
	case "forker":
		childForker()
	case "sleeper":
		pauseForever()
	case "report-proc":
		childReportProc()
	case "spawner-close":
		childSpawnerClose()
	case "dumpable-target":
		childDumpableTarget()
	case "read-environ":
		childReadEnviron()
	case "tree":
		childTree()
	case "tree-worker":
		childTreeWorker()
	case "tree-middle":
		childTreeMiddle()
	case "tree-daemon":
		childTreeDaemon()
	case "init-oom":
		childInitOOM()
	case "deep-chain":
		childDeepChain()
	case "reach":
		childReach()
	case "reach-sockets":
		childReachSockets()
	case "reach-ns":
		childReachNamespaces()
	case "stray-server":
		childStrayServer()
	default:
		fmt.Fprintf(os.Stderr, "unknown %s=%q\n", childEnv, mode)
		os.Exit(2)
	}
}

// childCommand returns a command that re-runs this test binary as a child
// of the given mode, with extra environment variables.
func childCommand(t *testing.T, mode string, env ...string) *exec.Cmd {
	return childCommandAs(t, "", mode, env...)
}

// childCommandAs is childCommand with argv[1] set to as (the server starts
// workers as "EXE worker ...", which the early constructor looks for).
func childCommandAs(t *testing.T, as, mode string, env ...string) *exec.Cmd {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), childTimeout)
	t.Cleanup(cancel)
	args := []string{"-test.run=^$"}
	if as != "" {
		args = append([]string{as}, args...)
	}
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), childEnv+"="+mode)
	cmd.Env = append(cmd.Env, env...)
	return cmd
}

// selfCommand is childCommand for use inside a child (no *testing.T).
func selfCommand(mode string, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+mode)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	return cmd
}

// runJSONChild runs a child to completion and decodes the JSON report it
// prints on stdout into out.
func runJSONChild(t *testing.T, out any, mode string, env ...string) {
	t.Helper()
	runJSONChildAs(t, out, "", mode, env...)
}

func runJSONChildAs(t *testing.T, out any, as, mode string, env ...string) {
	t.Helper()
	cmd := childCommandAs(t, as, mode, env...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := startChild(cmd)
	if err == nil {
		err = cmd.Wait()
	}
	if err != nil {
		t.Fatalf("child %s: %v\nstdout:\n%s\nstderr:\n%s", mode, err, stdout.String(), stderr.String())
	}
	if err := json.Unmarshal([]byte(stdout.String()), out); err != nil {
		t.Fatalf("child %s: decoding report: %v\nstdout:\n%s\nstderr:\n%s", mode, err, stdout.String(), stderr.String())
	}
}

func report(v any) {
	if err := json.NewEncoder(os.Stdout).Encode(v); err != nil {
		fmt.Fprintln(os.Stderr, "encoding report:", err)
		os.Exit(3)
	}
}

func die(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "child: "+format+"\n", args...)
	os.Exit(4)
}

// outcome turns an error into a stable word: "ok" or the errno name.
func outcome(err error) string {
	if err == nil {
		return "ok"
	}
	var en syscall.Errno
	if errors.As(err, &en) {
		return unix.ErrnoName(en)
	}
	return err.Error()
}

func tryRead(path string) string {
	_, err := os.ReadFile(path)
	return outcome(err)
}

func tryOpenat(dirfd int, name string) string {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err == nil {
		unix.Close(fd)
	}
	return outcome(err)
}

func tryCreate(path string) string {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o644)
	if err == nil {
		f.Close()
		os.Remove(path)
	}
	return outcome(err)
}

func taskIDs() (map[int]bool, error) {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil, err
	}
	ids := map[int]bool{}
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			ids[tid] = true
		}
	}
	return ids, nil
}

func pauseForever() {
	for {
		unix.Pause()
	}
}

// readLine reads one line from r, failing the test rather than hanging if
// nothing comes.
// startReporting starts the test binary as child mode, a stand-in server
// that reports on fd 3 (r) and writes its verdict on stdout (out), and
// runs until its stdin closes: at the test's end, which then waits for it.
func startReporting(t *testing.T, mode string, env ...string) (r *os.File, out io.Reader) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	cmd := childCommand(t, mode, env...)
	cmd.ExtraFiles = []*os.File{w}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err = cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := startChild(cmd); err != nil {
		t.Fatal(err)
	}
	w.Close()
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	return r, out
}

func readLine(t *testing.T, f *os.File) string {
	t.Helper()
	if err := f.SetReadDeadline(time.Now().Add(childTimeout)); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil {
		t.Fatalf("reading from child: %v (got %q)", err, line)
	}
	return strings.TrimSpace(line)
}

// waitEOF waits until every holder of the pipe's write end is gone, which
// for these tests means that process pid, holding it, died. If it does
// not, the test fails and pid is killed so that it does not outlive the
// test (it is known to be alive, so the pid is still its own).
func waitEOF(t *testing.T, f *os.File, pid int, what string) {
	t.Helper()
	if err := f.SetReadDeadline(time.Now().Add(childTimeout)); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(f)
	if err != nil {
		_ = unix.Kill(pid, unix.SIGKILL)
		t.Fatalf("%s (pid %d): still alive (pipe not closed): %v", what, pid, err)
	}
	if len(rest) > 0 {
		t.Logf("%s wrote %q", what, rest)
	}
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: switching to another uid is only possible as root")
	}
}

func requireLandlock(t *testing.T) {
	t.Helper()
	if LandlockABI() < 1 {
		t.Skip("kernel has no Landlock (or it is disabled at boot)")
	}
}
