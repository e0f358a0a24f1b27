package contain

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// tracedStrayC leaves two strays, each in a session of its own: A, and
// its child B, which PTRACE_SEIZEs A, so that A's exit is reported to B,
// which never waits for it. It writes B's pid to fd 3.
const tracedStrayC = `
#define _GNU_SOURCE
#include <stdio.h>
#include <unistd.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
int main(void) {
	prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
	prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
	int ready[2];
	if (pipe(ready)) return 1;
	if (fork() == 0) {
		setsid();
		prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
		pid_t a = getpid();
		if (fork() == 0) {
			setsid();
			if (ptrace(PTRACE_SEIZE, a, 0, 0)) { perror("seize"); _exit(1); }
			dprintf(3, "%d\n", getpid());
			write(ready[1], "R", 1);
			for (;;) pause();
		}
		for (;;) pause();
	}
	char c;
	close(ready[1]);
	if (read(ready[0], &c, 1) != 1) return 1;
	printf("started\n"); fflush(stdout);
	for (;;) pause();
}
`

// regrowC leaves a chain of sessions whose tip forks a new link whenever
// RLIMIT_NPROC (argv[1], as uid 65534) leaves room, that is whenever a
// link is reaped; each link holds argv[3] MiB. Each link ends itself argv[2] seconds after the start,
// so that a test that fails leaves nothing for long.
const regrowC = `
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <time.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/mman.h>
#include <string.h>
int main(int argc, char **argv) {
	int n = atoi(argv[1]);
	time_t stop = time(NULL) + atoi(argv[2]);
	prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
	prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
	struct rlimit rl = {n, n};
	if (setgid(65534) || setuid(65534)) { perror("setuid"); return 1; }
	if (setrlimit(RLIMIT_NPROC, &rl)) { perror("rlimit"); return 1; }
	int ready[2];
	if (pipe(ready)) return 1;
	if (fork() == 0) {
		setsid();
		close(ready[0]);
		for (int links = 0; time(NULL) < stop; ) {
			pid_t k = fork();
			if (k < 0) continue; /* no room: at once again, as a reap makes some */
			if (k == 0) { setsid(); links++; continue; }
			if (links == n / 2) write(ready[1], "R", 1);
			close(ready[1]);
			size_t m = (size_t)atoi(argv[3]) << 20;
			char *p = mmap(0, m, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0);
			if (p != MAP_FAILED) memset(p, 1, m);
			alarm(stop - time(NULL) + 1);
			for (;;) pause();
		}
		_exit(0);
	}
	char c;
	close(ready[1]);
	if (read(ready[0], &c, 1) != 1) return 1;
	printf("started\n"); fflush(stdout);
	for (;;) pause();
}
`

// strayReport is what childStrayServer reports.
type strayReport struct {
	EndMs     int64
	Hung      bool
	LeftAtEnd int
}

// childStrayServer is a server in Subreaper mode whose one worker
// (STRAY_BIN with STRAY_ARGS) leaves strays and is killed: it reports
// how Tree.End, which proc.wait calls before the reap, went.
func childStrayServer() {
	sp := NewSpawner()
	if c, err := sp.Contain(false); c != Subreaper {
		die("containment %v: %v", c, err)
	}
	w := exec.Command(os.Getenv("STRAY_BIN"), strings.Fields(os.Getenv("STRAY_ARGS"))...)
	w.Stderr = os.Stderr
	w.ExtraFiles = []*os.File{os.NewFile(3, "pids")}
	out, _ := w.StdoutPipe()
	tree, err := sp.Start(w)
	if err != nil {
		die("start: %v", err)
	}
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "started\n" {
		die("worker said %q", line)
	}
	KillGroup(w.Process.Pid)
	var info unix.Siginfo
	unix.Waitid(unix.P_PID, w.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
	ended := make(chan struct{})
	t0 := time.Now()
	go func() { tree.End(); close(ended) }()
	var rep strayReport
	select {
	case <-ended:
		rep.EndMs = time.Since(t0).Milliseconds()
		for _, c := range childrenOf(os.Getpid()) {
			if c != w.Process.Pid && !zombie(c) {
				rep.LeftAtEnd++
			}
		}
	case <-time.After(5 * time.Second): // a bound, not a wait for anything
		rep.Hung = true
	}
	report(rep)
	os.Stdout.Close()
	<-ended // a hung End: the test kills the tracer
	w.Wait()
	tree.Release()
}

// runStrayServer compiles src and runs childStrayServer with it as the
// worker; it returns the report and the pid the worker wrote to fd 3.
func runStrayServer(t *testing.T, src string, args ...string) (strayReport, int) {
	t.Helper()
	if testing.Short() {
		t.Skip("compiles C")
	}
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	bin := filepath.Join(dir, "w")
	os.WriteFile(bin+".c", []byte(src), 0o644)
	if out, err := exec.Command("cc", "-o", bin, bin+".c").CombinedOutput(); err != nil {
		t.Skipf("cc: %v %s", err, out)
	}
	r, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cmd := childCommand(t, "stray-server", "STRAY_BIN="+bin, "STRAY_ARGS="+strings.Join(args, " "))
	cmd.Stderr = os.Stderr
	cmd.ExtraFiles = []*os.File{pw}
	out, _ := cmd.StdoutPipe()
	if err := startChild(cmd); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	var rep strayReport
	derr := json.NewDecoder(out).Decode(&rep)
	line, _ := bufio.NewReader(r).ReadString('\n')
	pid, _ := strconv.Atoi(strings.TrimSpace(line))
	if rep.Hung && pid > 0 {
		unix.Kill(pid, unix.SIGKILL) // the tracer: End returns then
	}
	if err := cmd.Wait(); err != nil || derr != nil {
		t.Fatalf("server: %v; report: %v", err, derr)
	}
	return rep, pid
}

// A stray whose exit is reported to its tracer, a stray too, which never
// waits: Tree.End waited for it for ever (a blocking waitid), and with it
// the worker's reap and every later look of the server's.
func TestEndKillsATracedStrayAndItsTracer(t *testing.T) {
	t.Parallel()
	rep, _ := runStrayServer(t, tracedStrayC)
	if rep.Hung {
		t.Fatal("Tree.End did not return in 5 s: a stray traced by a stray blocks it")
	}
	if rep.LeftAtEnd != 0 {
		t.Errorf("Tree.End left %d strays running", rep.LeftAtEnd)
	}
}

// A chain whose tip forks again whenever a link is reaped: killing and
// reaping a link a round let it regrow until strayTime ran out.
func TestEndEndsARegrowingChain(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	// 20 links of 64 MiB: a link's exit is slow enough for the tip to
	// fork into the room its reap makes.
	rep, _ := runStrayServer(t, regrowC, "20", "15", "64")
	t.Logf("%+v", rep)
	if rep.Hung || rep.LeftAtEnd != 0 || rep.EndMs > strayTime.Milliseconds()/2 {
		t.Errorf("Tree.End: %+v; want it to end the chain, well before strayTime", rep)
	}
}

// frozenStrayC leaves one stray S, in a session of its own, frozen in the
// v1 freezer group argv[1] (SIGKILL cannot end it until it is thawed); it
// writes S's pid to fd 3 and says "started" once S is frozen.
const frozenStrayC = `
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sys/prctl.h>
static void put(const char *d, const char *f, const char *v) {
	char p[512]; snprintf(p, sizeof p, "%s/%s", d, f);
	FILE *fp = fopen(p, "w"); if (!fp) { perror(p); return; } fputs(v, fp); fclose(fp);
}
int main(int argc, char **argv) {
	prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); // as a worker is
	pid_t s = fork();
	if (s == 0) { setsid(); for (;;) pause(); }
	dprintf(3, "%d\n", s);
	char b[32]; snprintf(b, sizeof b, "%d", s);
	put(argv[1], "cgroup.procs", b);
	put(argv[1], "freezer.state", "FROZEN");
	for (int i = 0; i < 1000; i++) {
		char st[64] = {0}; char p[512]; snprintf(p, sizeof p, "%s/freezer.state", argv[1]);
		FILE *fp = fopen(p, "r"); if (fp) { fgets(st, sizeof st, fp); fclose(fp); }
		if (!strncmp(st, "FROZEN", 6)) break;
		usleep(10000);
	}
	printf("started\n"); fflush(stdout);
	for (;;) pause();
}
`

// A stray that does not die (frozen here; also an uninterruptible sleep,
// or 400 processes sharing a large mapping, slow to exit) cost every look
// the whole strayTime and stayed for the next, which paid it again: the
// dead worker's End and then its Release held the server 2 x strayTime,
// and every later worker's death another 2. A look now waits for it once;
// later looks walk it, and reap it once it exits, without waiting.
func TestAStrayThatCannotDieCostsOneLook(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	freezer := "/sys/fs/cgroup/freezer"
	if _, err := os.Stat(filepath.Join(freezer, "cgroup.procs")); err != nil {
		t.Skip("no cgroup v1 freezer")
	}
	fz := filepath.Join(freezer, fmt.Sprintf("plover-test-stuck-%d", os.Getpid()))
	if err := os.Mkdir(fz, 0o755); err != nil {
		t.Fatal(err)
	}
	var stray int
	t.Cleanup(func() {
		fd := -1
		if stray > 0 {
			fd, _ = unix.PidfdOpen(stray, 0) // frozen: not reaped, its pid its own
		}
		if fd >= 0 {
			unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
		}
		os.WriteFile(filepath.Join(fz, "freezer.state"), []byte("THAWED"), 0o644)
		if fd >= 0 {
			unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 10000)
			unix.Close(fd)
		}
		if err := os.Remove(fz); err != nil {
			t.Errorf("the freezer group: %v", err)
		}
	})
	t0 := time.Now()
	rep, pid := runStrayServer(t, frozenStrayC, fz)
	stray = pid
	took := time.Since(t0)
	t.Logf("%+v; End and Release took %v together", rep, took)
	if took > strayTime+strayTime/2 {
		t.Errorf("one dead worker's End and Release, with one stray that cannot die, held the server %v: its stray was waited for by more than one look (strayTime %v)", took, strayTime)
	}
}
