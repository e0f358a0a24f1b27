package worker

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/nicelevel"
)

// threadNice is thread tid of process pid's nice level, and false once
// the thread is gone.
func threadNice(pid int, tid string) (int, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, tid))
	if err != nil {
		return 0, false
	}
	// nice is the 17th field after the command's closing parenthesis.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	n, err := strconv.Atoi(f[16])
	return n, err == nil
}

// A worker's nice level (CPU weights by nice level) is every thread's, and
// a thread takes its level from the thread that made it: renice must leave
// no thread at the old level, those made while it went through the list
// included. A thread that made one after the list was read and before its
// own turn came passed the old level on, and renice read the list once: on
// a process whose threads keep making threads (a bundle's pool, the Go
// runtime), some were left at the old level for good.
func TestReniceLeavesNoThreadBehind(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "spawners")
	if out, err := exec.Command("gcc", "-O2", "-Wall", "-pthread", "-o", bin, filepath.Join("testdata", "spawners.c")).CombinedOutput(); err != nil {
		t.Skipf("cannot build the test program: %v\n%s", err, out)
	}
	for try := 0; try < 3; try++ {
		cmd := exec.Command(bin)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		pid := cmd.Process.Pid
		var r [1]byte
		if n, err := out.Read(r[:]); n != 1 || err != nil {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("the test program did not start: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // its threads come and go
		level := 15 + try
		_, err = renice(pid, level, slicing{}, false)
		var behind []string
		if tasks, rerr := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid)); rerr == nil {
			for _, task := range tasks {
				if n, ok := threadNice(pid, task.Name()); ok && n != level {
					behind = append(behind, fmt.Sprintf("%s at %d", task.Name(), n))
				}
			}
		}
		cmd.Process.Kill()
		cmd.Wait()
		if err != nil {
			t.Fatalf("renice: %v", err)
		}
		if len(behind) > 0 {
			t.Fatalf("renice to %d left %d threads at another level (%s ...)", level, len(behind), strings.Join(behind[:min(4, len(behind))], ", "))
		}
	}
}

// startProgram builds testdata/prog.c, starts it (startInGroup: ended
// with the test) and returns its pid once it says it started.
func startProgram(t *testing.T, prog string) int {
	t.Helper()
	bin := filepath.Join(t.TempDir(), prog)
	if out, err := exec.Command("gcc", "-O2", "-Wall", "-pthread", "-o", bin, filepath.Join("testdata", prog+".c")).CombinedOutput(); err != nil {
		t.Skipf("cannot build the test program: %v\n%s", err, out)
	}
	cmd := exec.Command(bin)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	startInGroup(t, cmd)
	var r [1]byte
	if n, err := out.Read(r[:]); n != 1 || err != nil {
		t.Fatalf("the test program did not start: %v", err)
	}
	return cmd.Process.Pid
}

// With nice levels a worker's level (its weight, its boost) is its
// processes' too, and a process takes its level from the one that forked
// it: renicing the tree is renicing a moving set of processes. A process
// that forked after the tree was read and before its own turn came passed
// the old level to a child the pass never saw: after a boost, that child
// ran boosted until the worker's next change, which may never come. Each
// change must leave no process of the tree at the old level.
func TestReniceTreeLeavesNoProcessBehind(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a boost lowers nice levels: it takes CAP_SYS_NICE")
	}
	pid := startProgram(t, "forkers")
	// Its forkers' children come and go: wait for some to be there (about
	// 240 at once on an idle machine; under a loaded make test, as few as
	// 41 in 10 s, where this waited for 50).
	for end := time.Now().Add(10 * time.Second); len(procTree(pid)) < 20; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the test program's tree has %d processes after 10 s", len(procTree(pid)))
		}
	}
	g := &CPUGroups{nice: true, lower: true, log: slog.New(slog.DiscardHandler), boost: LightBoost}
	c := g.Place(pid, 1)
	behind := func(level int) (n, of int, one string) {
		tree := procTree(pid)
		for _, k := range tree {
			if f, err := statFields(fmt.Sprintf("/proc/%d/stat", k.pid)); err == nil && f[16] != strconv.Itoa(level) {
				n++
				one = fmt.Sprintf("process %d at nice %s", k.pid, f[16])
			}
		}
		return n, len(tree), one
	}
	for try := 0; try < 3; try++ {
		for _, tc := range []struct {
			boost bool
			level int
		}{{true, 1}, {false, 10}} {
			c.setBoost(tc.boost)
			leftBehind(t, fmt.Sprintf("boost %v: processes not at nice %d", tc.boost, tc.level), func() (int, int, string) {
				return behind(tc.level)
			})
		}
	}
	if !g.On() {
		t.Fatal("the weights turned off")
	}
}

// leftBehind fails t where a change of a forking tree's level left more
// than one of its threads or processes behind (behind: how many, of how
// many, one of them), or any behind for a second. A pass that reads the
// tree until it finds nothing new still cannot see a child whose fork is
// under way as it reads last: the child takes its forker's old level and
// keeps it for its 30 ms of life (a window's catch-up would set it), where
// a missed forker or worker stays behind, and a pass that missed the
// forks made during it leaves several.
func leftBehind(t *testing.T, what string, behind func() (n, of int, one string)) {
	t.Helper()
	n, of, one := behind()
	if n > 1 {
		t.Fatalf("%s: %d of the tree's %d (%s)", what, n, of, one)
	}
	for deadline := time.Now().Add(time.Second); n > 0; n, of, one = behind() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d of the tree's %d still after 1 s (%s)", what, n, of, one)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// threadSlice is thread tid of process pid's EEVDF slice, and false once
// the thread is gone.
func threadSlice(tid int) (time.Duration, bool) {
	a, err := nicelevel.Thread(tid)
	return a.Slice, err == nil
}

// needSlices skips a test where the kernel keeps no slice per thread, or,
// with root, where the test is not root (lowered levels and real-time
// policies take CAP_SYS_NICE), and returns the kernel's default slice.
func needSlices(t *testing.T, root bool) time.Duration {
	t.Helper()
	if root && os.Geteuid() != 0 {
		t.Skip("lowered nice levels and real-time policies take CAP_SYS_NICE")
	}
	def := nicelevel.DefaultSlice()
	if def == 0 {
		t.Skip("this kernel keeps no slice per thread (Linux 6.12 and later do)")
	}
	return def
}

// With nice levels and light slices (LightSlice), a boosted worker's
// threads, in every process of its tree, run with the light slice, and
// its others with the kernel's default once the boost ends; the level
// comes with it. The slice is what lets a light function's wakeups beside
// a flood run at once: a slice left on a thread the boost left (or a
// process forked boosted) would let a flood's threads preempt as a light
// one does. The test program's threads and processes come and go.
func TestBoostedWorkerRunsWithTheLightSlice(t *testing.T) {
	def := needSlices(t, true)
	for _, prog := range []string{"forkers", "spawners"} {
		t.Run(prog, func(t *testing.T) {
			pid := startProgram(t, prog)
			g := &CPUGroups{nice: true, lower: true, log: slog.New(slog.DiscardHandler), boost: LightBoost, slice: LightSlice}
			c := g.Place(pid, 1)
			behind := func(level int, slice time.Duration) (n, of int, what string) {
				for _, k := range procTree(pid) {
					tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", k.pid))
					if err != nil {
						continue
					}
					for _, task := range tasks {
						tid, _ := strconv.Atoi(task.Name())
						s, ok1 := threadSlice(tid)
						nice, ok2 := threadNice(k.pid, task.Name())
						if !ok1 || !ok2 {
							continue // gone
						}
						of++
						if s != slice || nice != level {
							n++
							what = fmt.Sprintf("thread %d: nice %d, slice %v", tid, nice, s)
						}
					}
				}
				return n, of, what
			}
			for try := 0; try < 3; try++ {
				for _, tc := range []struct {
					boost bool
					level int
					slice time.Duration
				}{{true, 1, LightSlice}, {false, 10, def}} {
					c.setBoost(tc.boost)
					leftBehind(t, fmt.Sprintf("boost %v: threads not at nice %d with slice %v", tc.boost, tc.level, tc.slice), func() (int, int, string) {
						return behind(tc.level, tc.slice)
					})
				}
			}
			if !g.On() {
				t.Fatal("the weights turned off")
			}
		})
	}
}

// LightSlice is in force only where it can act (nice levels that may come
// back down, a boost, a slice shorter than the kernel's default), says
// why not otherwise, and then gives the server's every thread the slice:
// a thread of the server left at the default would wait out a flood's
// slice on each wakeup of a light function's request. Once the weights
// turn off (fail), the server's threads get the default back: workers
// started after take their slice from the thread that starts them, and
// are placed in no group that would set it.
func TestLightSliceGivesTheServersThreadsTheirs(t *testing.T) {
	def := needSlices(t, false)
	discard := slog.New(slog.DiscardHandler)
	slices := func() map[int]time.Duration {
		out := map[int]time.Duration{}
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			t.Fatal(err)
		}
		for _, task := range tasks {
			tid, _ := strconv.Atoi(task.Name())
			if s, ok := threadSlice(tid); ok {
				out[tid] = s
			}
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		g      *CPUGroups
		d      time.Duration
		factor float64
		off    string // "": in force
	}{
		{"cgroups", &CPUGroups{log: discard}, LightSlice, LightBoost, "not nice levels"},
		{"levels that only rise", &CPUGroups{nice: true, log: discard}, LightSlice, LightBoost, "CAP_SYS_NICE"},
		{"no boost", &CPUGroups{nice: true, lower: true, log: discard}, LightSlice, 1, "--light-boost 1"},
		{"off", &CPUGroups{nice: true, lower: true, log: discard}, 0, LightBoost, "--light-slice 0"},
		{"not shorter than the default", &CPUGroups{nice: true, lower: true, log: discard}, def, LightBoost, "not shorter than the kernel's default"},
		{"nice levels and a boost", &CPUGroups{nice: true, lower: true, log: discard}, LightSlice, LightBoost, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Cleanup(func() { nicelevel.SliceProcess(0) })
			off, err := tc.g.LightSlice(tc.d, tc.factor)
			if err != nil || (off == "") != (tc.off == "") || !strings.Contains(off, tc.off) {
				t.Fatalf("off %q (%v); want %q", off, err, tc.off)
			}
			if off != "" {
				if tc.g.Slice() != 0 {
					t.Fatalf("slices off (%s), but the groups keep %v", off, tc.g.Slice())
				}
				return
			}
			if tc.g.Slice() != tc.d {
				t.Fatalf("the groups' slice %v; want %v", tc.g.Slice(), tc.d)
			}
			for tid, s := range slices() {
				if s != tc.d {
					t.Errorf("the server's thread %d has slice %v; want %v", tid, s, tc.d)
				}
			}
			tc.g.fail(nil, errors.New("a write failed"), "a test's failure")
			if tc.g.Slice() != 0 {
				t.Errorf("the weights off, the groups still give slice %v", tc.g.Slice())
			}
			for tid, s := range slices() {
				if s != def {
					t.Errorf("the weights off, the server's thread %d has slice %v; want the default, %v", tid, s, def)
				}
			}
		})
	}
}

// A bundle may put its threads in another policy (SCHED_IDLE, SCHED_BATCH
// with reset-on-fork; a real-time one needs a privilege a worker does not
// hold, but a worker of an uncontained server may have it): renice with
// slices keeps each thread's policy and flags, sets an idle thread's
// level as setpriority did (sched_setattr sets none there, and renice
// read that as a change every pass: 10 passes on every weight change),
// and leaves a real-time thread alone rather than failing (which turned
// every worker's weights off).
func TestRenicedSlicesKeepAThreadsPolicy(t *testing.T) {
	needSlices(t, true)
	for _, tc := range []struct {
		name       string
		policy     uint32
		prio       uint32
		flags      uint64
		wantNice   int
		wantSlice  time.Duration // 0: not checked
		wantChange bool
	}{
		{"normal", unix.SCHED_NORMAL, 0, 0, 5, LightSlice, true},
		{"batch, reset on fork", unix.SCHED_BATCH, 0, unix.SCHED_FLAG_RESET_ON_FORK, 5, LightSlice, true},
		{"idle", unix.SCHED_IDLE, 0, 0, 5, 0, true},
		{"fifo", unix.SCHED_FIFO, 1, 0, 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command("sleep", "30")
			startInGroup(t, cmd)
			pid := cmd.Process.Pid
			if err := unix.SchedSetAttr(pid, &unix.SchedAttr{Policy: tc.policy, Priority: tc.prio, Flags: tc.flags}, 0); err != nil {
				t.Skipf("cannot set the test's policy: %v", err)
			}
			sl := slicing{LightSlice, LightSlice}
			changed, err := renice(pid, 5, sl, false)
			if err != nil || changed != tc.wantChange {
				t.Fatalf("renice: changed %v, %v; want changed %v and no error", changed, err, tc.wantChange)
			}
			a, err := unix.SchedGetAttr(pid, 0)
			if err != nil {
				t.Fatal(err)
			}
			if a.Policy != tc.policy || a.Flags&unix.SCHED_FLAG_RESET_ON_FORK != tc.flags&unix.SCHED_FLAG_RESET_ON_FORK {
				t.Errorf("policy %d flags %#x; want %d and %#x kept", a.Policy, a.Flags, tc.policy, tc.flags)
			}
			if tc.policy != unix.SCHED_FIFO {
				if n, _ := threadNice(pid, strconv.Itoa(pid)); n != tc.wantNice {
					t.Errorf("nice %d; want %d", n, tc.wantNice)
				}
			}
			if tc.wantSlice != 0 && time.Duration(a.Runtime) != tc.wantSlice {
				t.Errorf("slice %v; want %v", time.Duration(a.Runtime), tc.wantSlice)
			}
			if changed, err := renice(pid, 5, sl, false); changed || err != nil {
				t.Errorf("a second renice to the same level: changed %v, %v; want nothing to change", changed, err)
			}
		})
	}
}

// raisedOr tells a set that failed because its thread raised its own level
// above the one set (where levels only rise) from one that failed
// otherwise: the thread read, here, is at 15.
func TestRaisedOr(t *testing.T) {
	tid := make(chan int)
	done := make(chan struct{})
	defer close(done)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if err := unix.Setpriority(unix.PRIO_PROCESS, 0, 15); err != nil {
			tid <- 0
			return
		}
		tid <- unix.Gettid()
		<-done
	}()
	at15 := <-tid
	if at15 == 0 {
		t.Skip("cannot raise a thread's level here")
	}
	gone := 1 << 22 // above pid_max's largest (4,194,304): no such thread
	for _, tt := range []struct {
		name      string
		tid, n    int
		raiseOnly bool
		err       error
		want      bool
	}{
		{"above the level, refused", at15, 10, true, unix.EACCES, true},
		{"above the level, not permitted", at15, 10, true, unix.EPERM, true},
		{"at the level", at15, 15, true, unix.EACCES, false},
		{"below the level", at15, 19, true, unix.EACCES, false},
		{"levels come back down here", at15, 10, false, unix.EACCES, false},
		{"another error", at15, 10, true, unix.EINVAL, false},
		{"gone", gone, 10, true, unix.EPERM, true},
	} {
		if got := raisedOr(tt.tid, tt.n, tt.raiseOnly, tt.err); (got == nil) != tt.want || got != nil && got != tt.err {
			t.Errorf("%s: raisedOr = %v, want it raised: %v", tt.name, got, tt.want)
		}
	}
}

// Where levels only rise (no CAP_SYS_NICE: a pod), a bundle's thread that
// raises its own level between the server's reading it and setting it
// makes the set fail (it would take the level back down): that is the
// thread's business, not a broken mechanism. Taken for one, it turned every
// worker's weights off, for good, in 42 to 93 tries of testdata/raisers.c.
func TestThreadsRaisingThemselvesAsTheyAreSetFailNothing(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("tried from root, on a thread made unprivileged")
	}
	notNiced(t)
	const nobody = 65534
	dir, err := os.MkdirTemp("", "raisers")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil { // the program runs as nobody
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "raisers")
	if out, err := exec.Command("gcc", "-O2", "-Wall", "-pthread", "-o", bin, filepath.Join("testdata", "raisers.c")).CombinedOutput(); err != nil {
		t.Skipf("cannot build the test program: %v\n%s", err, out)
	}
	for _, slice := range []time.Duration{0, 200 * time.Microsecond} {
		if slice != 0 && nicelevel.DefaultSlice() == 0 {
			continue // no slices on this kernel: the same path as without
		}
		for try := range 150 {
			cmd := exec.Command("nice", "-n", "5", bin)
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			var r [1]byte
			_, rerr := out.Read(r[:])
			var g *CPUGroups
			if rerr == nil {
				onThreadAs(t, nobody, func() {
					g = &CPUGroups{nice: true, slice: slice, log: slog.New(slog.DiscardHandler)}
					g.base, g.lower = nicelevel.Try()
					if !g.lower {
						g.Place(cmd.Process.Pid, 0).Weigh(&abi.Manifest{Name: "f"}) // from 5 to 10
					}
				})
			}
			cmd.Process.Kill()
			cmd.Wait()
			switch {
			case rerr != nil:
				t.Fatalf("the test program did not start: %v", rerr)
			case g.lower:
				t.Fatal("an unprivileged thread could take its nice level back down")
			case g.Mechanism() != "nice":
				t.Fatalf("slice %v, try %d: a bundle's threads raising their own levels turned the weights off (%s)", slice, try, g.whyOff())
			}
		}
	}
}

// notNiced skips a test whose levels (5, 10) are read from level 0 where
// the test runs above it: there the server's levels start higher.
func notNiced(t *testing.T) {
	t.Helper()
	if raw, err := syscall.Getpriority(syscall.PRIO_PROCESS, 0); err == nil && 20-raw > 0 {
		t.Skipf("the test runs at nice %d; its levels are counted from 0", 20-raw)
	}
}

// hookBetweenReadAndSet puts f between a thread's reading and setting
// (betweenReadAndSet) until the test ends.
func hookBetweenReadAndSet(t *testing.T, f func(tid int)) {
	old := betweenReadAndSet
	betweenReadAndSet = f
	t.Cleanup(func() { betweenReadAndSet = old })
}

// The race TestThreadsRaisingThemselvesAsTheyAreSetFailNothing tries, made
// certain: a bundle's thread raises its own level between the server's
// reading and setting it (betweenReadAndSet), where levels only rise. The
// set fails (lowering 19 to 10 takes a privilege), and that is no failure:
// the thread keeps the level it chose, on the setpriority path and on the
// sched_setattr one.
func TestAThreadRaisedBetweenReadingAndSettingFailsNothing(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("tried from root, on a thread made unprivileged")
	}
	notNiced(t)
	const nobody = 65534
	for _, tt := range []struct {
		name string
		sl   slicing
	}{
		{"setpriority", slicing{}},
		{"sched_setattr", slicing{light: 200 * time.Microsecond}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.sl.light != 0 && nicelevel.DefaultSlice() == 0 {
				t.Skip("no slices on this kernel")
			}
			pid := sleepAsNobodyAt(t, 5).Process.Pid
			raised := 0
			hookBetweenReadAndSet(t, func(tid int) {
				if err := syscall.Setpriority(syscall.PRIO_PROCESS, tid, 19); err != nil {
					t.Errorf("raising thread %d: %v", tid, err)
				}
				raised++
			})
			var err error
			onThreadAs(t, nobody, func() { _, err = renice(pid, 10, tt.sl, true) })
			if raised == 0 {
				t.Fatal("no thread was set: the race was not run")
			}
			if err != nil {
				t.Errorf("a thread that raised its own level failed the set: %v", err)
			}
			if n := niceOf(t, pid); n != 19 {
				t.Errorf("the thread at %d, want 19 (its own)", n)
			}
		})
	}
}

// A window's catch-up takes the group's lock a process at a time and
// reads the worker's level again for each: a change of level while it
// works (a boost's start or end) stops it, as the change sets the whole
// tree itself, where one lock over the whole list would have set the rest
// at the old level after the change.
func TestACatchUpStopsWhenTheLevelChanges(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a level taken back down takes CAP_SYS_NICE")
	}
	notNiced(t)
	cmd := exec.Command("sh", "-c", "sleep 60 & sleep 60 & wait")
	startInGroup(t, cmd)
	var kids []kin
	waitFor(t, "the worker's two children", func() bool {
		kids = procTree(cmd.Process.Pid)[1:]
		return len(kids) == 2
	})
	g := &CPUGroups{nice: true, lower: true, log: slog.New(slog.DiscardHandler)}
	c := g.Place(cmd.Process.Pid, 1)
	c.Weigh(&abi.Manifest{Name: "f"})
	for _, k := range kids {
		if err := unix.Setpriority(unix.PRIO_PROCESS, k.pid, 1); err != nil {
			t.Fatal(err)
		}
	}
	calls := 0
	hookBetweenReadAndSet(t, func(int) {
		if calls++; calls == 1 {
			c.level = 12 // under c.mu, which the catch-up holds here
		}
	})
	c.catchUp(kids, 10)
	if calls == 0 {
		t.Fatal("nothing was set")
	}
	if n := niceOf(t, kids[0].pid); n != 10 {
		t.Errorf("the first process at %d, want 10 (set before the change)", n)
	}
	if n := niceOf(t, kids[1].pid); n != 1 {
		t.Errorf("the second process at %d after the level changed, want 1 (left for the change to set)", n)
	}
}

// A process of a worker's tree found at a level other than the worker's
// is set to it at the next window's reading (use): one forked as its
// parent was set copies the old level as the fork begins and shows in
// /proc only as it ends, after a walk's last pass (tens of
// milliseconds for a large address space: at a boost's end, one child in
// each of 5 was left at the boosted level, for good). Where levels only
// rise, one above the worker's raised its own and is left there.
func TestEachWindowCatchesUpAProcessAtAnotherLevel(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a level taken back down takes CAP_SYS_NICE")
	}
	notNiced(t)
	for _, tt := range []struct {
		name  string
		lower bool // levels come back down
		at    int  // the child's level, the worker's being 10
		want  int
	}{
		{"boosted", true, 1, 10},
		{"raised", true, 15, 10},
		{"below, levels only rising", false, 5, 10},
		{"raised, levels only rising", false, 15, 15},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command("sh", "-c", "sleep 60 & wait")
			startInGroup(t, cmd)
			child := firstChild(t, cmd.Process.Pid, "sleep")
			g := &CPUGroups{nice: true, lower: tt.lower, log: slog.New(slog.DiscardHandler)}
			c := g.Place(cmd.Process.Pid, 1)
			c.Weigh(&abi.Manifest{Name: "f"})
			if n := niceOf(t, child); n != 10 {
				t.Fatalf("the child at %d after the worker was weighed, want 10", n)
			}
			if err := unix.Setpriority(unix.PRIO_PROCESS, child, tt.at); err != nil {
				t.Fatal(err)
			}
			c.use(time.Now())
			if n := niceOf(t, child); n != tt.want {
				t.Fatalf("a child at %d after a window's reading: %d, want %d", tt.at, n, tt.want)
			}
		})
	}
}
