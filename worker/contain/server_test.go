package contain

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// dropForTest is the identity the server-side tests' children take:
// nobody when root (whose CAP_SYS_PTRACE would bypass every check),
// otherwise the test's own.
func dropForTest() *Identity {
	if os.Geteuid() == 0 {
		return &Identity{UID: nobody, GID: nobody}
	}
	return nil
}

// childDumpableTarget stands in for the server: same user as the
// reader, dumpable or not, waiting to be read.
func childDumpableTarget() {
	if err := Enter(Policy{Drop: dropForTest()}); err != nil {
		die("enter: %v", err)
	}
	// The uid switch in Enter leaves the process non-dumpable already;
	// set the flag either way so both cases are explicit.
	if os.Getenv("CT_DUMPABLE") == "1" {
		if err := unix.Prctl(unix.PR_SET_DUMPABLE, 1, 0, 0, 0); err != nil {
			die("PR_SET_DUMPABLE 1: %v", err)
		}
	} else if err := MakeNonDumpable(); err != nil {
		die("MakeNonDumpable: %v", err)
	}
	v, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0)
	if err != nil {
		die("PR_GET_DUMPABLE: %v", err)
	}
	os.Stdout.WriteString("ready " + strconv.Itoa(v) + "\n")
	pauseForever()
}

type environReport struct{ Environ, Mem string }

// childReadEnviron stands in for a worker of the same user trying to
// read the server's secrets.
func childReadEnviron() {
	if err := Enter(Policy{Drop: dropForTest()}); err != nil {
		die("enter: %v", err)
	}
	target := os.Getenv("CT_TARGET")
	report(environReport{
		Environ: tryRead("/proc/" + target + "/environ"),
		Mem:     outcome(func() error { f, err := os.Open("/proc/" + target + "/mem"); f.Close(); return err }()),
	})
}

func TestMakeNonDumpable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		dumpable string
		want     string
	}{
		{"1", "ok"},     // the control: same user, dumpable, readable
		{"0", "EACCES"}, // what MakeNonDumpable buys the server
	}
	for _, tc := range tests {
		t.Run("dumpable="+tc.dumpable, func(t *testing.T) {
			t.Parallel()
			target := childCommand(t, "dumpable-target", "CT_DUMPABLE="+tc.dumpable)
			target.Stderr = os.Stderr
			out, err := target.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := startChild(target); err != nil {
				t.Fatal(err)
			}
			defer func() {
				target.Process.Kill()
				target.Wait()
			}()
			if line := readLine(t, out.(*os.File)); line != "ready "+tc.dumpable {
				t.Fatalf("target said %q, want %q", line, "ready "+tc.dumpable)
			}
			var rep environReport
			runJSONChild(t, &rep, "read-environ", "CT_TARGET="+strconv.Itoa(target.Process.Pid))
			if rep.Environ != tc.want || rep.Mem != tc.want {
				t.Errorf("same-user reader: environ %q, mem %q; want %q", rep.Environ, rep.Mem, tc.want)
			}
		})
	}
}

type procReport struct {
	Pid, Pgid, Sid, Ppid, Pdeathsig int
}

func childReportProc() {
	pgid, err := unix.Getpgid(0)
	if err != nil {
		die("getpgid: %v", err)
	}
	sid, err := unix.Getsid(0)
	if err != nil {
		die("getsid: %v", err)
	}
	// The main goroutine is locked to the thread that was exec'd, the
	// one that carries the signal armed at fork.
	sig, err := parentDeathSignal()
	if err != nil {
		die("PR_GET_PDEATHSIG: %v", err)
	}
	report(procReport{Pid: os.Getpid(), Pgid: pgid, Sid: sid, Ppid: os.Getppid(), Pdeathsig: sig})
}

func TestSpawnerStart(t *testing.T) {
	t.Parallel()
	sp := NewSpawner()
	defer sp.Close()

	tests := []struct {
		name string
		attr *syscall.SysProcAttr
	}{
		{"no attributes", nil},
		{"empty attributes", &syscall.SysProcAttr{}},
		{"own session kept", &syscall.SysProcAttr{Setsid: true}},
		{"foreign group overridden", &syscall.SysProcAttr{Setpgid: true, Pgid: 1}},
		{"other death signal overridden", &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}},
	}
	// Start them all at once: the Spawner serialises concurrent starts.
	var wg sync.WaitGroup
	for _, tc := range tests {
		wg.Go(func() {
			var orig syscall.SysProcAttr
			if tc.attr != nil {
				orig = *tc.attr
			}
			cmd := childCommand(t, "report-proc")
			cmd.SysProcAttr = tc.attr
			var out, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &stderr
			if _, err := sp.Start(cmd); err != nil {
				t.Errorf("%s: Start: %v", tc.name, err)
				return
			}
			if tc.attr != nil && !reflect.DeepEqual(*tc.attr, orig) {
				t.Errorf("%s: Start modified the caller's SysProcAttr: %+v", tc.name, *tc.attr)
			}
			if err := cmd.Wait(); err != nil {
				t.Errorf("%s: %v: %s", tc.name, err, stderr.String())
				return
			}
			var rep procReport
			if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
				t.Errorf("%s: %v: %q", tc.name, err, out.String())
				return
			}
			if rep.Pid != cmd.Process.Pid || rep.Ppid != os.Getpid() {
				t.Errorf("%s: pid %d ppid %d, want %d and %d", tc.name, rep.Pid, rep.Ppid, cmd.Process.Pid, os.Getpid())
			}
			if rep.Pgid != rep.Pid {
				t.Errorf("%s: process group %d, want its own (%d)", tc.name, rep.Pgid, rep.Pid)
			}
			if rep.Sid != rep.Pid { // whatever the caller asked: a session of its own
				t.Errorf("%s: session %d, want its own (%d)", tc.name, rep.Sid, rep.Pid)
			}
			if rep.Pdeathsig != int(syscall.SIGKILL) {
				t.Errorf("%s: parent-death signal %d, want SIGKILL", tc.name, rep.Pdeathsig)
			}
		})
	}
	wg.Wait()
}

func TestSpawnerClosed(t *testing.T) {
	t.Parallel()
	sp := NewSpawner()
	sp.Close()
	sp.Close()
	if _, err := sp.Start(exec.Command("/bin/true")); !errors.Is(err, ErrSpawnerClosed) {
		t.Fatalf("Start after Close: %v, want ErrSpawnerClosed", err)
	}
}

type spawnerCloseReport struct {
	Err      string
	Signaled bool
	Signal   int
}

// childSpawnerClose starts a sleeper, closes the Spawner and reports how
// the sleeper died. The main goroutine holds the main thread (see init),
// so the Spawner's goroutine cannot be on it and its thread really ends.
func childSpawnerClose() {
	sp := NewSpawner()
	gc := selfCommand("sleeper")
	if _, err := sp.Start(gc); err != nil {
		die("start: %v", err)
	}
	sp.Close()
	var rep spawnerCloseReport
	err := gc.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		ws := ee.Sys().(syscall.WaitStatus)
		rep.Signaled, rep.Signal = ws.Signaled(), int(ws.Signal())
	} else {
		rep.Err = outcome(err)
	}
	report(rep)
}

func TestSpawnerCloseKillsChildren(t *testing.T) {
	t.Parallel()
	var rep spawnerCloseReport
	runJSONChild(t, &rep, "spawner-close")
	if !rep.Signaled || rep.Signal != int(syscall.SIGKILL) {
		t.Fatalf("child after Spawner.Close: %+v, want killed by SIGKILL", rep)
	}
}

// childForker starts a grandchild in its own process group (a plain
// fork, as tenant code would), hands it the pipe on fd 3, prints its pid
// and waits.
func childForker() {
	gc := selfCommand("sleeper")
	gc.Stderr = nil
	alive := os.NewFile(3, "alive")
	gc.ExtraFiles = []*os.File{alive}
	if err := gc.Start(); err != nil {
		die("start: %v", err)
	}
	alive.Close()
	os.Stdout.WriteString("grandchild " + strconv.Itoa(gc.Process.Pid) + "\n")
	pauseForever()
}

func TestKillGroup(t *testing.T) {
	t.Parallel()
	sp := NewSpawner()
	defer sp.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cmd := childCommand(t, "forker")
	cmd.ExtraFiles = []*os.File{w}
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sp.Start(cmd); err != nil {
		t.Fatal(err)
	}
	w.Close()
	line := readLine(t, stdout.(*os.File))
	gpid, err := strconv.Atoi(strings.TrimPrefix(line, "grandchild "))
	if err != nil {
		t.Fatalf("forker said %q", line)
	}
	pid := cmd.Process.Pid

	if pg, err := unix.Getpgid(pid); err != nil || pg != pid {
		t.Errorf("getpgid(child %d) = %d, %v; want the child's own group", pid, pg, err)
	}
	if pg, err := unix.Getpgid(gpid); err != nil || pg != pid {
		t.Errorf("getpgid(grandchild %d) = %d, %v; want the child's group %d", gpid, pg, err, pid)
	}

	if err := KillGroup(pid); err != nil {
		t.Fatalf("KillGroup: %v", err)
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("child: %v, want killed", err)
	}
	if ws := ee.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Errorf("child: %v, want killed by SIGKILL", ws)
	}
	waitEOF(t, r, gpid, "grandchild after KillGroup")
}

func TestKillGroupArguments(t *testing.T) {
	t.Parallel()
	for _, pid := range []int{0, 1, -1, -42} {
		if err := KillGroup(pid); err == nil {
			t.Errorf("KillGroup(%d) succeeded; it must refuse", pid)
		}
	}
	// A pid above pid_max can belong to no process or group: ESRCH,
	// which KillGroup treats as "already gone".
	b, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		t.Skip(err)
	}
	max, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	if err := KillGroup(max + 1); err != nil {
		t.Errorf("KillGroup(nonexistent %d): %v", max+1, err)
	}
}
