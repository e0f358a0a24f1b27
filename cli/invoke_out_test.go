package cli

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

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

// outScene is where a row of TestInvokeOutAsTheShellWrites writes: --out,
// and the command's stdout where it is a file.
type outScene struct {
	out    string
	stdout *os.File
}

// outAnswer is the answer TestInvokeOutAsTheShellWrites's server gives.
const outAnswer = "OUTPUT"

// writeOwned writes s to path at mode (past the umask), owned by uid
// (0: as it is).
func writeOwned(t *testing.T, path, s string, mode os.FileMode, uid int) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	if uid != 0 {
		if err := os.Chown(path, uid, uid); err != nil {
			t.Fatal(err)
		}
	}
}

// fileHolds wants path to hold want.
func fileHolds(t *testing.T, path, want string) {
	t.Helper()
	if b, err := os.ReadFile(path); err != nil || string(b) != want {
		t.Errorf("%s holds %q (%v); want %q", path, b, err, want)
	}
}

// ownedBy wants path owned by uid want.
func ownedBy(t *testing.T, path string, want int) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if uid := int(fi.Sys().(*syscall.Stat_t).Uid); uid != want {
		t.Errorf("%s: owner %d; want %d kept", path, uid, want)
	}
}

// outCase is one of TestInvokeOutAsTheShellWrites's scenes.
type outCase struct {
	name  string
	root  bool // the scene needs root: another owner, another euid
	euid  int  // the euid invoke runs as (0: this test's)
	dir   os.FileMode
	cut   bool // the answer is cut short
	scene func(t *testing.T, dir string) outScene
	code  int
	errs  string // in stderr
	sent  bool   // the request went out
	check func(t *testing.T, dir string, stdout string)
}

// openedOut is a reader's file, opened before the invoke (the first scene).
var openedOut *os.File

// outCases are TestInvokeOutAsTheShellWrites's scenes.
var outCases = []outCase{
	{name: "a file of ours is replaced by a rename", dir: 0o700, code: 0, sent: true,
		scene: func(t *testing.T, dir string) outScene {
			writeOwned(t, filepath.Join(dir, "f"), "the old output", 0o640, 0)
			f, _ := os.Open(filepath.Join(dir, "f"))
			t.Cleanup(func() { f.Close() })
			openedOut = f
			return outScene{out: filepath.Join(dir, "f")}
		},
		check: func(t *testing.T, dir, _ string) {
			// A reader that opened it before reads the old output still:
			// the new one was put in place whole.
			b, _ := io.ReadAll(openedOut)
			fi, err := os.Stat(filepath.Join(dir, "f"))
			if string(b) != "the old output" || err != nil || fi.Mode().Perm() != 0o640 {
				t.Errorf("the file opened before reads %q; mode %v (%v); want the old output, 0640", b, fi.Mode(), err)
			}
		}},
	{name: "hard links keep one file", dir: 0o700, code: 0, sent: true,
		scene: func(t *testing.T, dir string) outScene {
			writeOwned(t, filepath.Join(dir, "a"), "the old output", 0o644, 0)
			if err := os.Link(filepath.Join(dir, "a"), filepath.Join(dir, "b")); err != nil {
				t.Fatal(err)
			}
			return outScene{out: filepath.Join(dir, "a")}
		},
		check: func(t *testing.T, dir, _ string) {
			fileHolds(t, filepath.Join(dir, "b"), outAnswer)
			a, _ := os.Stat(filepath.Join(dir, "a"))
			b, _ := os.Stat(filepath.Join(dir, "b"))
			if a == nil || b == nil || !os.SameFile(a, b) {
				t.Errorf("a and b are no longer one file")
			}
		}},
	{name: "hard link, answer cut: left as it was", dir: 0o700, cut: true, code: 1, errs: "left as it was", sent: true,
		scene: func(t *testing.T, dir string) outScene {
			writeOwned(t, filepath.Join(dir, "a"), "the old output", 0o644, 0)
			os.Link(filepath.Join(dir, "a"), filepath.Join(dir, "b"))
			return outScene{out: filepath.Join(dir, "a")}
		},
		check: func(t *testing.T, dir, _ string) { fileHolds(t, filepath.Join(dir, "b"), "the old output") }},
	{name: "a dangling link: its target made", dir: 0o700, code: 0, sent: true,
		scene: func(t *testing.T, dir string) outScene {
			os.Symlink("made", filepath.Join(dir, "link"))
			return outScene{out: filepath.Join(dir, "link")}
		},
		check: func(t *testing.T, dir, _ string) {
			fileHolds(t, filepath.Join(dir, "made"), outAnswer)
			if fi, err := os.Lstat(filepath.Join(dir, "link")); err != nil || fi.Mode()&os.ModeSymlink == 0 {
				t.Errorf("link is no longer a link (%v)", err)
			}
		}},
	{name: "a dangling link, answer cut: nothing made", dir: 0o700, cut: true, code: 1, errs: "left as it was", sent: true,
		scene: func(t *testing.T, dir string) outScene {
			os.Symlink("made", filepath.Join(dir, "link"))
			return outScene{out: filepath.Join(dir, "link")}
		},
		check: func(t *testing.T, dir, _ string) {
			if _, err := os.Lstat(filepath.Join(dir, "made")); err == nil {
				t.Errorf("made was made")
			}
		}},
	{name: "another's file: written in place, owner kept", root: true, dir: 0o700, code: 0, sent: true,
		scene: func(t *testing.T, dir string) outScene {
			writeOwned(t, filepath.Join(dir, "f"), "the old output", 0o644, 65534)
			return outScene{out: filepath.Join(dir, "f")}
		},
		check: func(t *testing.T, dir, _ string) { ownedBy(t, filepath.Join(dir, "f"), 65534) }},
	{name: "a read-only file: refused before the request", root: true, euid: 10001, dir: 0o777, code: 1, errs: "permission denied",
		scene: func(t *testing.T, dir string) outScene {
			writeOwned(t, filepath.Join(dir, "f"), "the old output", 0o444, 10001)
			return outScene{out: filepath.Join(dir, "f")}
		},
		check: func(t *testing.T, dir, _ string) { fileHolds(t, filepath.Join(dir, "f"), "the old output") }},
	{name: "a writable file in a directory that is not", root: true, euid: 10001, dir: 0o755, code: 0, sent: true,
		scene: func(t *testing.T, dir string) outScene {
			writeOwned(t, filepath.Join(dir, "f"), "the old output", 0o666, 0)
			return outScene{out: filepath.Join(dir, "f")}
		}},
	{name: "another's file in a sticky directory", root: true, euid: 10001, dir: 0o777 | os.ModeSticky, code: 0, sent: true,
		scene: func(t *testing.T, dir string) outScene {
			writeOwned(t, filepath.Join(dir, "f"), "the old output", 0o666, 10002)
			return outScene{out: filepath.Join(dir, "f")}
		},
		check: func(t *testing.T, dir, _ string) { ownedBy(t, filepath.Join(dir, "f"), 10002) }},
	{name: "a file that is stdout: written at its position", dir: 0o700, code: 0, sent: true,
		scene: func(t *testing.T, dir string) outScene {
			f, err := os.OpenFile(filepath.Join(dir, "o.txt"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
			f.WriteString("header\n")
			return outScene{out: filepath.Join(dir, "o.txt"), stdout: f}
		}},
	{name: "/dev/fd/N: written at its position", dir: 0o700, code: 0, sent: true,
		scene: func(t *testing.T, dir string) outScene {
			f, err := os.OpenFile(filepath.Join(dir, "o.txt"), os.O_WRONLY|os.O_CREATE, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
			f.WriteString("header\n")
			return outScene{out: fmt.Sprintf("/dev/fd/%d", f.Fd()), stdout: f}
		}},
	{name: "/dev/stdout is the command's", dir: 0o700, code: 0, sent: true,
		scene: func(t *testing.T, dir string) outScene { return outScene{out: "/dev/stdout"} },
		check: func(t *testing.T, _ string, stdout string) {
			if stdout != outAnswer {
				t.Errorf("stdout %q; want %q", stdout, outAnswer)
			}
		}},
}

// plover invoke --out FILE writes FILE as a shell's > FILE would, but only
// once the output is whole: the temporary file renamed over FILE replaced
// a read-only file, failed for a writable one in a directory that is not,
// failed after the function ran in a sticky directory, split hard links,
// took FILE from its owner, replaced a dangling link instead of making its
// target, and unlinked the file the shell had open as stdout
// (/dev/stdout, /dev/fd/N), with what the shell had written to it.
func TestInvokeOutAsTheShellWrites(t *testing.T) {
	for _, tt := range outCases {
		t.Run(tt.name, func(t *testing.T) { runOutCase(t, tt) })
	}
}

// runOutCase invokes with --out as tt sets the scene, and checks it.
func runOutCase(t *testing.T, tt outCase) {
	if tt.root && os.Geteuid() != 0 {
		t.Skip("needs root: another owner's file, or another euid")
	}
	srv := newRawServer(t, func(c net.Conn, _ *http.Request) {
		if tt.cut {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 100\r\n\r\n0123456789")
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 6\r\n\r\n"+outAnswer)
	})
	// Not t.TempDir: its parent is root's 0700, closed to another euid.
	dir, err := os.MkdirTemp("", "plover-out-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	in := filepath.Join(dir, "in")
	writeOwned(t, in, "input", 0o644, 0)
	s := tt.scene(t, dir)
	before, _ := os.ReadDir(dir)
	if err := os.Chmod(dir, tt.dir); err != nil {
		t.Fatal(err)
	}
	var stdout bytes.Buffer
	var errb bytes.Buffer
	env := &Env{Stdin: strings.NewReader(""), Stdout: &stdout, Stderr: &errb}
	if s.stdout != nil {
		env.Stdout = s.stdout
	}
	if tt.euid != 0 {
		if err := syscall.Seteuid(tt.euid); err != nil {
			t.Skipf("cannot take uid %d: %v", tt.euid, err)
		}
	}
	code := Main([]string{"invoke", "f", "--server", srv.url(), "--in", in, "--out", s.out}, env)
	if tt.euid != 0 {
		if err := syscall.Seteuid(0); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(dir, 0o700)
	if code != tt.code || !strings.Contains(errb.String(), tt.errs) {
		t.Fatalf("exit %d, stderr %q; want exit %d, %q", code, errb.String(), tt.code, tt.errs)
	}
	if got := len(srv.requests()) > 0; got != tt.sent {
		t.Errorf("the request sent: %v; want %v", got, tt.sent)
	}
	if after, _ := os.ReadDir(dir); tt.code == 0 && len(after) > len(before)+1 || tt.code != 0 && len(after) != len(before) {
		t.Errorf("%s holds %v, %v before: a temporary file left?", dir, after, before)
	}
	switch {
	case s.stdout != nil:
		s.stdout.WriteString("trailer\n")
		fileHolds(t, filepath.Join(dir, "o.txt"), "header\n"+outAnswer+"trailer\n")
	case tt.code == 0 && s.out != "/dev/stdout":
		fileHolds(t, s.out, outAnswer)
	}
	if tt.check != nil {
		tt.check(t, dir, stdout.String())
	}
}

// ^C (or SIGTERM, or SIGHUP) while the answer comes ends plover invoke
// with --out's temporary file removed and FILE as it was: the signal's
// default action ended it with the temporary file left beside FILE. It
// exits as a shell says a signal ended a command (128 and its number),
// not 1, which a failed invoke exits.
func TestInvokeInterruptedLeavesNoTemporaryFile(t *testing.T) {
	// Caught here too, so that an invoke that does not catch them fails
	// the test (by its --timeout) instead of ending the test binary.
	caught := make(chan os.Signal, 3)
	signal.Notify(caught, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(caught)
	for _, s := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP} {
		t.Run(s.String(), func(t *testing.T) {
			var srv *rawServer
			srv = newRawServer(t, func(c net.Conn, _ *http.Request) {
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 100\r\n\r\n0123456789")
				time.Sleep(50 * time.Millisecond) // the first part written to the temporary file
				syscall.Kill(os.Getpid(), s)
				<-srv.release
			})
			dir := t.TempDir()
			in, out := filepath.Join(dir, "in"), filepath.Join(dir, "out")
			os.WriteFile(in, []byte("input"), 0o644)
			os.WriteFile(out, []byte("the old output"), 0o644)
			_, errs, code := runMain(t, nil, "invoke", "f", "--server", srv.url(), "--in", in, "--out", out, "--timeout", "1s")
			if want := "plover invoke: interrupted while the answer came (--out " + out + " left as it was)"; code != 128+int(s) || !strings.Contains(errs, want) {
				t.Errorf("exit %d, stderr %q; want %d, %q", code, errs, 128+int(s), want)
			}
			if b, _ := os.ReadFile(out); string(b) != "the old output" {
				t.Errorf("%s holds %q", out, b)
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 2 {
				t.Errorf("%s holds %v; want in and out alone", dir, ents)
			}
		})
	}
}

// invoke catches ^C and SIGTERM once: an invoke stuck writing its output
// (a FIFO whose reader stopped), which its context cannot end, caught them
// all and could be ended by SIGKILL alone (a review's LOW). The second
// signal has its default action. In a child process of its own: that
// action ends the process.
func TestInvokeStuckWritingEndsAtASecondSignal(t *testing.T) {
	if os.Getenv("PLOVER_TEST_STUCK_INVOKE") != "" {
		args := strings.Split(os.Getenv("PLOVER_TEST_STUCK_INVOKE"), "\n")
		os.Exit(Main(args, &Env{Stdin: strings.NewReader(""), Stdout: io.Discard, Stderr: os.Stderr}))
	}
	for _, nohup := range []bool{false, true} {
		t.Run(fmt.Sprintf("nohup %v", nohup), func(t *testing.T) {
			var srv *rawServer
			srv = newRawServer(t, func(c net.Conn, _ *http.Request) {
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 4194304\r\n\r\n")
				c.Write(make([]byte, 4<<20))
				<-srv.release
			})
			dir := t.TempDir()
			in, fifo := filepath.Join(dir, "in"), filepath.Join(dir, "fifo")
			os.WriteFile(in, []byte("input"), 0o644)
			if err := syscall.Mkfifo(fifo, 0o600); err != nil {
				t.Fatal(err)
			}
			rd, err := os.OpenFile(fifo, os.O_RDONLY|syscall.O_NONBLOCK, 0) // a reader that never reads
			if err != nil {
				t.Fatal(err)
			}
			defer rd.Close()
			cmd := exec.Command(os.Args[0], "-test.run=^TestInvokeStuckWritingEndsAtASecondSignal$")
			if nohup { // as nohup starts it: the hangup ignored
				cmd = exec.Command("sh", "-c", `trap '' HUP; exec "$@"`, "sh", os.Args[0], "-test.run=^TestInvokeStuckWritingEndsAtASecondSignal$")
			}
			cmd.Env = append(os.Environ(), "PLOVER_TEST_STUCK_INVOKE="+strings.Join([]string{"invoke", "f", "--server", srv.url(), "--in", in, "--out", fifo, "--timeout", "60s"}, "\n"))
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			// Stuck once the FIFO's buffer is full (the answer is far larger):
			// what it holds has stopped growing.
			for last, same, end := -1, 0, time.Now().Add(10*time.Second); same < 5; time.Sleep(20 * time.Millisecond) {
				n, err := unix.IoctlGetInt(int(rd.Fd()), unix.TIOCINQ)
				if err == nil && n > 0 && n == last {
					same++
				} else {
					same = 0
				}
				last = n
				if time.Now().After(end) {
					cmd.Process.Kill()
					<-done
					t.Fatalf("the invoke did not fill the FIFO within 10 s: %s", stderr.Bytes())
				}
			}
			if nohup {
				// Outlives its hangup: catching SIGHUP undid nohup's ignoring.
				cmd.Process.Signal(syscall.SIGHUP)
				select {
				case err := <-done:
					t.Fatalf("an invoke whose hangup was ignored ended at a SIGHUP: %v", err)
				case <-time.After(time.Second):
				}
			}
			for i := 0; ; i++ {
				cmd.Process.Signal(syscall.SIGINT)
				select {
				case err := <-done:
					var ee *exec.ExitError
					if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGINT || i != 1 {
						t.Fatalf("after %d SIGINTs the invoke ended with %v; want it ended by the second", i+1, err)
					}
					return
				case <-time.After(2 * time.Second):
					if i == 1 {
						cmd.Process.Kill()
						t.Fatal("an invoke stuck writing its output outlived two SIGINTs")
					}
				}
			}
		})
	}
}
