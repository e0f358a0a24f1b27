package contain

import (
	"bufio"
	"encoding/json"
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

// chainC, run as "chain DEPTH", forks a chain of DEPTH processes, each in
// a session of its own (out of reach of KillGroup), each writing its pid
// on fd 3; its first link says "started" once the last one runs.
const chainC = `
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/prctl.h>
int main(int argc, char **argv) {
	int depth = atoi(argv[1]);
	prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); /* as Enter: marks a worker's descendants */
	prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
	int ready[2];
	if (pipe(ready)) return 1;
	for (int i = 0; i < depth; i++) {
		pid_t c = fork();
		if (c < 0) { perror("fork"); return 1; }
		if (c > 0) {
			if (i == 0) { close(ready[1]); char b; read(ready[0], &b, 1); printf("started\n"); fflush(stdout); }
			for (;;) pause();
		}
		setsid();
		dprintf(3, "%d\n", getpid());
	}
	write(ready[1], "R", 1);
	for (;;) pause();
}
`

// chainDepth is past the 100 generations Release once ended: each link is
// the server's only once its parent died.
const chainDepth = 150

// childDeepChain plays a subreaper server: it starts CHAIN_BIN, kills it
// once its chain runs, reaps it, releases its Tree, and reports how many
// of its own children still run; then stays until its stdin closes.
func childDeepChain() {
	sp := NewSpawner()
	if c, err := sp.Contain(false); c != Subreaper {
		die("containment %v: %v", c, err)
	}
	w := exec.Command(os.Getenv("CHAIN_BIN"), strconv.Itoa(chainDepth))
	w.ExtraFiles = []*os.File{os.NewFile(3, "pids")}
	w.Stderr = os.Stderr
	out, err := w.StdoutPipe()
	if err != nil {
		die("pipe: %v", err)
	}
	tree, err := sp.Start(w)
	if err != nil {
		die("start: %v", err)
	}
	w.ExtraFiles[0].Close()
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "started\n" {
		die("worker said %q", line)
	}
	KillGroup(w.Process.Pid)
	w.Wait()
	tree.Release()
	left := 0
	for _, k := range childrenOf(os.Getpid()) {
		if !zombie(k) {
			left++
		}
	}
	report(left)
	os.Stdin.Read(make([]byte, 1))
}

// A worker's descendants, however deep a chain of sessions they make, are
// gone once Release returns (Subreaper). Before, Release ended at most 100
// generations: 50 of a chain of 150 ran on.
func TestReleaseEndsADeepChainOfSessions(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "chain.c")
	if err := os.WriteFile(src, []byte(chainC), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "chain")
	if out, err := exec.Command("cc", "-o", bin, src).CombinedOutput(); err != nil {
		t.Skipf("cc: %v %s", err, out)
	}
	r, out := startReporting(t, "deep-chain", "CHAIN_BIN="+bin)
	br := bufio.NewReader(r)
	var pids []int
	defer func() {
		for _, p := range pids {
			unix.Kill(p, unix.SIGKILL)
		}
	}()
	r.SetReadDeadline(time.Now().Add(childTimeout))
	for range chainDepth {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("the chain's pids: %v (%d read)", err, len(pids))
		}
		n, err := strconv.Atoi(strings.TrimSpace(line))
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, n)
	}
	var left int
	if err := json.NewDecoder(out).Decode(&left); err != nil {
		t.Fatalf("server child: %v", err)
	}
	alive := 0
	for _, p := range pids {
		if !zombie(p) {
			alive++
		}
	}
	if alive > 0 || left > 0 {
		t.Errorf("after Release: %d of the worker's %d chained descendants run, %d children of the server", alive, chainDepth, left)
	}
}

// A look walks each killed process's children by its pid. A killed p that
// was reaped (its parent ignoring SIGCHLD) leaves its pid to the next
// process, whose children the walk then listed and, their parent matching
// p by number, killed: an unrelated process's. The race is not reliable to
// provoke, so here the look's state holds p by a pidfd of a reaped process
// while p's pid is an unrelated x: x's child must be left alone. A zombie
// p (exited, not reaped) still holds its pid, so its children are taken.
func TestStrayWalkSkipsTheChildrenOfAReapedParent(t *testing.T) {
	gone, goneFd := childPidfd(t)
	// A zombie first: exited, waited for without reaping it.
	gone.Process.Kill()
	var info unix.Siginfo
	for unix.Waitid(unix.P_PID, gone.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil) == unix.EINTR {
	}
	zombie := strayKill{fds: map[int]int{gone.Process.Pid: goneFd}}
	if !zombie.held(gone.Process.Pid) {
		t.Error("a zombie not held: its pid is still its own")
	}
	gone.Wait()
	if zombie.held(gone.Process.Pid) {
		t.Error("a reaped process held")
	}

	x := exec.Command("sh", "-c", "sleep 60 & echo $!; wait")
	x.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := x.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := x.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { unix.Kill(-x.Process.Pid, unix.SIGKILL); x.Wait() }()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	c, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatal(err)
	}
	// p's pid now x's, p held by the reaped process's pidfd.
	k := strayKill{fds: map[int]int{x.Process.Pid: goneFd}, direct: map[int]bool{}}
	if k.killUnder(x.Process.Pid, c) {
		unix.Close(k.fds[c])
		t.Fatalf("killed %d, the child of %d, which took the pid of a reaped process the look had killed", c, x.Process.Pid)
	}
	if f := statFields(c); len(f) == 0 || f[0] == "Z" {
		t.Fatalf("%d, x's child, gone: %v", c, f)
	}
	// Held by its own pidfd, x's child is taken.
	xFd, err := unix.PidfdOpen(x.Process.Pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(xFd)
	k = strayKill{fds: map[int]int{x.Process.Pid: xFd}, direct: map[int]bool{}}
	if !k.killUnder(x.Process.Pid, c) {
		t.Fatalf("%d, the child of %d, held by its pidfd, not killed", c, x.Process.Pid)
	}
	unix.Close(k.fds[c])
}

// What a look leaves running is kept by pidfd for the next (not waited for
// again); a kept process that exited since is reaped by the next look,
// which then lets it go; one whose pid went to another process since is not
// taken for it.
func TestStuckStraysAreKeptAndReaped(t *testing.T) {
	if !HavePidfds() {
		t.Skip("no pidfds")
	}
	start := func() (*exec.Cmd, int) {
		c := exec.Command("sleep", "60")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
		fd, err := unix.PidfdOpen(c.Process.Pid, 0)
		if err != nil {
			t.Fatal(err)
		}
		return c, fd
	}
	running, runFd := start()
	dead, deadFd := start()
	dead.Process.Kill()
	var info unix.Siginfo
	for unix.Waitid(unix.P_PID, dead.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil) == unix.EINTR {
	}
	// A look ends with both killed: the running one is kept, the other's
	// pidfd closed (it is reaped by reap, not by close).
	stuck := map[int]int{}
	k := strayKill{fds: map[int]int{running.Process.Pid: runFd, dead.Process.Pid: deadFd}, direct: map[int]bool{}}
	k.close(stuck)
	if len(stuck) != 1 || stuck[running.Process.Pid] != runFd {
		t.Fatalf("kept %v, want only %d (fd %d)", stuck, running.Process.Pid, runFd)
	}
	// The next look takes it, not waited for; once it exited, the one
	// after reaps it.
	k = strayKill{fds: map[int]int{}, direct: map[int]bool{}, old: map[int]bool{}}
	k.adopt(stuck)
	if !k.old[running.Process.Pid] || !k.allExited() || len(stuck) != 0 {
		t.Fatalf("adopted %v (old %v), all exited %v, left %v", k.fds, k.old, k.allExited(), stuck)
	}
	k.close(stuck)
	running.Process.Kill()
	for unix.Waitid(unix.P_PID, running.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil) == unix.EINTR {
	}
	k = strayKill{fds: map[int]int{}, direct: map[int]bool{}, old: map[int]bool{}}
	k.adopt(stuck)
	k.reap()
	k.close(stuck)
	if len(stuck) != 0 {
		t.Fatalf("an exited stuck process still kept: %v", stuck)
	}
	if f := statFields(running.Process.Pid); len(f) != 0 {
		t.Errorf("the exited stuck process not reaped: %v", f)
	}
	// A kept pid now another process's: known says it is not the one killed.
	other, otherFd := start()
	defer unix.Close(otherFd)
	gone, goneFd := start()
	gone.Process.Kill()
	gone.Wait()
	k = strayKill{fds: map[int]int{other.Process.Pid: goneFd}, direct: map[int]bool{}, old: map[int]bool{other.Process.Pid: true}}
	if k.known(other.Process.Pid) {
		t.Errorf("%d taken for the stuck process whose pid it has", other.Process.Pid)
	}
	if _, ok := k.fds[other.Process.Pid]; ok {
		t.Errorf("the reaped stuck process still held")
	}
}

// A worker reaped (proc.wait's cmd.Wait) and only then Released: a new
// worker started in between that got the same pid stays ours. Before, the
// old tree's forget dropped the pid, and the next look (that Release's
// own) killed and reaped the live worker as a stray (a reviewer's test).
// ns_last_pid forces the reuse.
func TestReleaseLeavesANewWorkerOfTheSamePid(t *testing.T) {
	requireRoot(t)
	sp := NewSpawner()
	if c, err := sp.Contain(false); c != Subreaper {
		t.Skipf("containment %v: %v", c, err)
	}
	a := exec.Command("setpriv", "--no-new-privs", "true")
	ta, err := sp.Start(a)
	if err != nil {
		t.Fatal(err)
	}
	x := a.Process.Pid
	ta.End()
	a.Wait() // the reap, as proc.wait's cmd.Wait
	var b *exec.Cmd
	for i := 0; i < 20; i++ {
		os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(x-1)), 0o644)
		c := exec.Command("setpriv", "--no-new-privs", "sleep", "60")
		tb, err := sp.Start(c)
		if err != nil {
			t.Fatal(err)
		}
		if c.Process.Pid == x {
			b = c
			_ = tb
			break
		}
		c.Process.Kill()
		c.Wait()
		tb.Release()
	}
	if b == nil {
		t.Skip("could not get the pid again")
	}
	defer func() { b.Process.Kill(); b.Wait() }()
	ta.Release() // the old worker's: forget(x), then a look
	f := statFields(x)
	t.Logf("new worker %d after the old tree's Release: stat %.20v", x, f)
	if len(f) == 0 || f[0] == "Z" {
		t.Errorf("the new live worker %d, holding the old one's pid, was killed by the old tree's Release", x)
	}
}

// An entry the look killed under another stray, reaped since by someone
// else (a parent that ignores SIGCHLD), whose pid a new stray then took,
// is not taken for the new stray: the look kills it. Before, only entries
// kept from an earlier look were checked, and the stray lived until the
// next look (a reviewer's test).
func TestAStrayOnAKilledProcesssPidIsKilled(t *testing.T) {
	gone, goneFd := childPidfd(t)
	gone.Process.Kill()
	gone.Wait() // its pidfd now names a reaped process
	x := exec.Command("setpriv", "--no-new-privs", "sleep", "60")
	if err := x.Start(); err != nil {
		t.Skip("setpriv: ", err)
	}
	defer x.Wait()
	defer x.Process.Kill()
	for end := time.Now().Add(10 * time.Second); !noNewPrivs(x.Process.Pid); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("setpriv never set no_new_privs")
		}
	}
	fd, err := unix.Dup(goneFd)
	if err != nil {
		t.Fatal(err)
	}
	xp := x.Process.Pid
	k := strayKill{self: os.Getpid(), tellable: true, fds: map[int]int{xp: fd}, direct: map[int]bool{}, old: map[int]bool{}}
	defer func() {
		for _, fd := range k.fds {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
	}()
	if n := k.round(); n != 1 {
		t.Fatalf("a round killed %d, want the stray on a killed process's pid", n)
	}
}

// childPidfd starts a child that sleeps, and opens a pidfd of it (closed
// at the test's end); it skips without pidfds.
func childPidfd(t *testing.T) (*exec.Cmd, int) {
	t.Helper()
	if !HavePidfds() {
		t.Skip("no pidfds")
	}
	c := exec.Command("sleep", "60")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.PidfdOpen(c.Process.Pid, 0)
	if err != nil {
		c.Process.Kill()
		c.Wait()
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return c, fd
}
