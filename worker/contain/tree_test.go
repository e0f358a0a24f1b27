package contain

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The tree tests run a Spawner in a child (Contain changes the process
// for good: a child subreaper stays one), which starts a stand-in worker;
// the worker starts a daemon in a session of its own, either through a
// middle process that exits at once (a double fork) or as a child of the
// server's (CLONE_PARENT). The daemon holds the write end of the test's
// pipe, so the pipe's end is the daemon's.

type treeReport struct {
	Containment string
	Err         string
}

// childTree: TREE_CONTAIN says what to ask of Contain ("namespaces",
// "subreaper", or "" for none), TREE_HOW how the worker ends ("exits" by
// itself, or is "killed" by the server). It starts the worker with the
// pipe on fd 3, waits until the daemon runs, ends the worker, releases its
// Tree, reports, and stays (the Spawner with it) until its stdin closes.
func childTree() {
	sp := NewSpawner()
	c := ProcessGroup
	if what := os.Getenv("TREE_CONTAIN"); what != "" {
		c, _ = sp.Contain(what == "namespaces")
	}
	rep := treeReport{Containment: c.String()}
	w := selfCommand("tree-worker", "TREE_HOW="+os.Getenv("TREE_HOW"), "TREE_KIND="+os.Getenv("TREE_KIND"))
	// As the server starts a worker ("EXE worker FLAGS"): with
	// --pid-namespace its constructor mounts its namespace's /proc.
	w.Args = append(append([]string{os.Args[0], "worker"}, sp.WorkerArgs()...), w.Args[1:]...)
	w.ExtraFiles = []*os.File{os.NewFile(3, "daemon")}
	out, err := w.StdoutPipe()
	if err != nil {
		die("pipe: %v", err)
	}
	tree, err := sp.Start(w)
	if err != nil {
		die("start: %v", err)
	}
	w.ExtraFiles[0].Close()
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "daemon started\n" {
		die("worker said %q: %v", line, err)
	}
	if os.Getenv("TREE_HOW") == "killed" {
		KillGroup(w.Process.Pid)
		tree.Kill()
	}
	if err := w.Wait(); err != nil && os.Getenv("TREE_HOW") == "exits" {
		rep.Err = "worker: " + err.Error()
	}
	tree.Release()
	report(rep)
	os.Stdin.Read(make([]byte, 1))
}

// childTreeWorker enters containment as a worker does (a subreaper if
// told; no_new_privs, which marks what it starts as a worker's), starts
// the daemon (TREE_KIND), says so, and then exits or waits to be killed
// (TREE_HOW).
func childTreeWorker() {
	subreaper := false
	for _, a := range os.Args {
		subreaper = subreaper || a == "--subreaper"
	}
	if err := Enter(Policy{Subreaper: subreaper}); err != nil {
		die("enter: %v", err)
	}
	if os.Getenv("TREE_KIND") == "clone-parent" {
		startDaemon(syscall.CLONE_PARENT)
	} else {
		m := selfCommand("tree-middle")
		m.ExtraFiles = []*os.File{os.NewFile(3, "daemon")}
		if err := m.Run(); err != nil {
			die("middle: %v", err)
		}
	}
	os.Stdout.WriteString("daemon started\n")
	if os.Getenv("TREE_HOW") == "killed" {
		pauseForever()
	}
}

// childTreeMiddle starts the daemon and exits without waiting for it.
func childTreeMiddle() { startDaemon(0) }

// startDaemon starts the daemon in a session of its own, with clone
// flags, and returns once it runs.
func startDaemon(flags uintptr) {
	d := selfCommand("tree-daemon")
	d.ExtraFiles = []*os.File{os.NewFile(3, "daemon")}
	d.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Cloneflags: flags}
	ready, w, err := os.Pipe()
	if err != nil {
		die("pipe: %v", err)
	}
	d.Stdout = w
	if err := d.Start(); err != nil {
		die("daemon: %v", err)
	}
	w.Close()
	if _, err := ready.Read(make([]byte, 1)); err != nil {
		die("daemon did not start: %v", err)
	}
}

// childTreeDaemon writes its pid as its /proc says (the machine's but in
// a PID namespace, where it dies with the tree child anyway: so that it
// can be killed should a test fail) on fd 3, says it is ready on stdout
// and sleeps.
func childTreeDaemon() {
	self, err := os.Readlink("/proc/self")
	if err != nil {
		die("%v", err)
	}
	f := os.NewFile(3, "daemon")
	f.WriteString(self + "\n")
	os.Stdout.WriteString("R")
	os.Stdout.Close()
	pauseForever()
}

func TestTreeEndsDaemons(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		contain, want string
		ends          bool
	}{
		{"namespaces", "pid namespace", true},
		{"subreaper", "subreaper", true},
		{"", "process group", false}, // the test can fail: a group alone misses the daemon
	} {
		for _, how := range []string{"double-fork/exits", "double-fork/killed", "clone-parent/exits", "clone-parent/killed"} {
			kind, how, _ := strings.Cut(how, "/")
			t.Run(tc.want+"/"+kind+"/"+how, func(t *testing.T) {
				t.Parallel()
				r, out := startReporting(t, "tree", "TREE_CONTAIN="+tc.contain, "TREE_HOW="+how, "TREE_KIND="+kind)
				pid, err := strconv.Atoi(readLine(t, r))
				if err != nil {
					t.Fatalf("daemon's pid: %v", err)
				}
				var rep treeReport
				if err := json.NewDecoder(out).Decode(&rep); err != nil {
					unix.Kill(pid, unix.SIGKILL)
					t.Fatalf("tree child: %v", err)
				}
				if rep.Containment != tc.want {
					unix.Kill(pid, unix.SIGKILL)
					if tc.contain == "namespaces" {
						t.Skipf("no PID namespaces here (got %s): needs CAP_SYS_ADMIN", rep.Containment)
					}
					t.Fatalf("containment %s, want %s", rep.Containment, tc.want)
				}
				if rep.Err != "" {
					t.Errorf("tree child: %s", rep.Err)
				}
				if !tc.ends {
					// Release has returned: the daemon is there or not, no waiting.
					if err := unix.Kill(pid, 0); err != nil {
						t.Errorf("daemon %d gone with process groups alone (%v): then what do the others prove?", pid, err)
					}
					unix.Kill(pid, unix.SIGKILL)
					return
				}
				// Released, with the Spawner still running: the daemon is
				// gone, and with it the pipe's last writer.
				r.SetReadDeadline(time.Now().Add(time.Second))
				if _, err := r.Read(make([]byte, 1)); err != io.EOF {
					if tc.contain != "namespaces" {
						unix.Kill(pid, unix.SIGKILL)
					}
					t.Fatalf("daemon outlived its worker's Tree.Release (its pipe: %v)", err)
				}
			})
		}
	}
}

// zombie reports a process that ended and waits to be reaped (or is
// gone).
func zombie(pid int) bool {
	f := statFields(pid)
	return len(f) == 0 || f[0] == "Z"
}

func TestEndLeftovers(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	record := filepath.Join(dir, "server.pid")
	if n, err := EndLeftovers(record); n != 0 || err != nil {
		t.Fatalf("no record: %d, %v; want nothing to do", n, err)
	}

	// A live server's record: nothing of its is touched.
	sp := NewSpawner()
	defer sp.Close()
	if err := sp.Record(record); err != nil {
		t.Fatal(err)
	}
	if _, err := EndLeftovers(record); !errors.Is(err, ErrServerRunning) {
		t.Fatalf("the record of a running server: %v, want ErrServerRunning", err)
	}

	// A dead server's: its pid is that of a process that ended.
	gone := exec.Command("/bin/true")
	if err := gone.Run(); err != nil {
		t.Skip(err)
	}
	tag := strings.Repeat("ab", 16)
	other := strings.Repeat("cd", 16)
	if err := os.WriteFile(record, fmt.Appendf(nil, "%d 1 %s\n", gone.Process.Pid, tag), 0o600); err != nil {
		t.Fatal(err)
	}
	procs := []struct {
		what  string
		as    string
		args  []string
		ended bool
	}{
		{"its worker", "worker", []string{"--server-tag", tag}, true},
		{"its worker (flag=value)", "worker", []string{"--server-tag=" + tag}, true},
		{"its namespace's init", "worker-init", []string{"--server-tag", tag}, true},
		{"another server's worker", "worker", []string{"--server-tag", other}, false},
		{"a process naming the tag that is no worker", "", []string{"--server-tag", tag}, false},
	}
	cmds := make([]*exec.Cmd, len(procs))
	for i, p := range procs {
		cmd := childCommandAs(t, p.as, "sleeper")
		cmd.Args = append(cmd.Args, p.args...)
		if err := startChild(cmd); err != nil {
			t.Fatal(err)
		}
		cmds[i] = cmd
		defer func() { cmd.Process.Kill(); cmd.Wait() }()
	}
	// Their argv is in /proc once they have run exec.
	for _, c := range cmds {
		waitArgv(t, c)
	}
	n, err := EndLeftovers(record)
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for i, p := range procs {
		if !p.ended {
			if err := unix.Kill(cmds[i].Process.Pid, 0); err != nil || zombie(cmds[i].Process.Pid) {
				t.Errorf("%s was ended: it is not the dead server's", p.what)
			}
			continue
		}
		want++
		// Killed, and waited for: a zombie now (ours to reap).
		if !zombie(cmds[i].Process.Pid) {
			t.Errorf("%s still runs after EndLeftovers", p.what)
		}
	}
	if n != want {
		t.Errorf("EndLeftovers ended %d, want %d", n, want)
	}
}

// waitArgv waits until the child's /proc/PID/cmdline is its own (after
// exec) rather than its parent's copy.
func waitArgv(t *testing.T, c *exec.Cmd) {
	t.Helper()
	want := strings.Join(c.Args[1:], "\x00")
	deadline := time.Now().Add(childTimeout)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", c.Process.Pid))
		if strings.Contains(string(b), want) {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("pid %d never showed argv %q", c.Process.Pid, want)
}

type initOOMReport struct {
	Err                  string
	Init, Worker, Server int // OOM score adjustments
}

// childInitOOM starts a stand-in worker, one that enters no containment,
// in a PID namespace, and reports the OOM score adjustments of its
// namespace's init, once that is OOMScoreAdj or 10 s passed (the init
// sets its own as it starts, which a Start does not wait for), of the
// worker and of itself, the server.
func childInitOOM() {
	sp := NewSpawner()
	var rep initOOMReport
	if c, why := sp.Contain(true); c != PIDNamespace {
		rep.Err = fmt.Sprintf("no PID namespace here (%s: %v)", c, why)
		report(rep)
		return
	}
	w := selfCommand("sleeper")
	w.Args = append(append([]string{os.Args[0], "worker"}, sp.WorkerArgs()...), w.Args[1:]...)
	tree, err := sp.Start(w)
	if err != nil {
		die("start: %v", err)
	}
	defer func() { KillGroup(w.Process.Pid); tree.Kill(); w.Wait(); tree.Release() }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if rep.Init, err = OOMScore(tree.Root()); err != nil {
			die("the init's score: %v", err)
		}
		if rep.Init == OOMScoreAdj || time.Now().After(deadline) {
			break
		}
	}
	if rep.Worker, err = OOMScore(w.Process.Pid); err != nil {
		die("the worker's score: %v", err)
	}
	if rep.Server, err = OOMScore(os.Getpid()); err != nil {
		die("the server's score: %v", err)
	}
	report(rep)
}

// A worker's PID namespace's init is the OOM killer's first choice too,
// by its own doing: a worker that entered nothing has the server's, which
// is left as it was.
func TestPIDNamespaceInitIsTheOOMKillersFirstChoice(t *testing.T) {
	t.Parallel()
	server, err := OOMScore(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	var rep initOOMReport
	runJSONChild(t, &rep, "init-oom")
	if rep.Err != "" {
		t.Skip(rep.Err)
	}
	if rep.Init != OOMScoreAdj {
		t.Errorf("the namespace's init's oom_score_adj is %d 10 s after its start, want %d", rep.Init, OOMScoreAdj)
	}
	if rep.Worker != server || rep.Server != server {
		t.Errorf("oom_score_adj of a worker that entered nothing %d, of the server %d; want both the test's, %d", rep.Worker, rep.Server, server)
	}
}
