package worker

import (
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/nicelevel"
)

// u is a known use of a group: its weight, CPUs used and boost.
func u(weight, used float64, boosted bool) groupUse {
	return groupUse{weight: weight, used: used, boosted: boosted, known: true}
}

// flood is u of a group whose function flooded in the window.
func flood(weight, used float64, boosted bool) groupUse {
	g := u(weight, used, boosted)
	g.flooding = true
	return g
}

func TestLightBoosts(t *testing.T) {
	for _, tc := range []struct {
		name string
		cpus float64
		uses []groupUse
		want []bool
	}{
		// The CNN at one client (0.3 CPU) beside a 4 MB flood, equal
		// weights, 2 CPUs: each's part is one CPU.
		{"a light function beside a flood", 2, []groupUse{u(1, 0.3, false), u(1, 1.4, false)}, []bool{true, false}},
		// Shares decide between groups that all want more.
		{"two floods at 3:1", 2, []groupUse{u(3, 1.4, false), u(1, 0.55, false)}, []bool{false, false}},
		{"an idle function beside two floods", 2, []groupUse{u(1, 0, false), u(1, 1, false), u(1, 1, false)}, []bool{true, false, false}},
		// Boosted, it keeps the boost up to three quarters of its part.
		{"boosted, at 0.6 of its part", 2, []groupUse{u(1, 0.6, true), u(1, 1.4, false)}, []bool{true, false}},
		{"not boosted, at 0.6 of its part", 2, []groupUse{u(1, 0.6, false), u(1, 1.4, false)}, []bool{false, false}},
		{"boosted, turned heavy", 2, []groupUse{u(1, 0.8, true), u(1, 1.2, false)}, []bool{false, false}},
		// A flood boosted while idle took 8/9 of the CPUs from the other:
		// that one reads light, and is not boosted for it.
		{"held back by a boosted flood", 2, []groupUse{u(1, 1.78, true), u(1, 0.22, false)}, []bool{false, false}},
		{"held back, and an idle one", 2, []groupUse{u(1, 1.78, true), u(1, 0.22, false), u(1, 0, false)}, []bool{false, false, false}},
		// A standby (no weight) is never boosted, nor weighed in.
		{"a standby", 2, []groupUse{u(0, 0, false), u(1, 0.3, false), u(1, 1.5, false)}, []bool{false, true, false}},
		{"alone and busy", 2, []groupUse{u(1, 1.9, false)}, []bool{false}},
		{"nothing busy", 2, []groupUse{u(1, 0, false), u(2, 0, false)}, []bool{true, true}},
		// A use that could not be read (a count gone down) is no boost.
		// A flood (two runs at once on a device in the window) is never
		// boosted, whatever its use: with the server's time on its bytes
		// and the rest of the CPUs its clients' and the server's, the 4 MB
		// vecadd flood used 0.5-0.7 CPUs of its part of 1 on 2 cores.
		{"a flood that used under half its part", 2, []groupUse{u(1, 0.3, false), flood(1, 0.45, false)}, []bool{true, false}},
		{"a boosted flood under three quarters of its part", 2, []groupUse{u(1, 0.3, true), flood(1, 0.6, true)}, []bool{true, false}},
		{"a flood alone, idle for the window", 2, []groupUse{flood(1, 0, false)}, []bool{false}},
		{"unknown", 2, []groupUse{{weight: 1, boosted: true}, {weight: 1}, u(1, 1.5, false)}, []bool{false, false, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _ := lightBoosts(tc.uses, tc.cpus)
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("boosts %v, want %v", got, tc.want)
			}
		})
	}
}

// share is how cpus go to groups that each want demand CPUs, in proportion
// to the weights in force (boosted ones times LightBoost), a group's
// leftover to the others: what CFS gives them.
func share(cpus float64, demand, weight []float64, boosted []bool) []float64 {
	got := make([]float64, len(demand))
	left := cpus
	open := map[int]bool{}
	for i, d := range demand {
		if d > 0 {
			open[i] = true
		}
	}
	for len(open) > 0 && left > 1e-9 {
		var sum float64
		for i := range open {
			w := weight[i]
			if boosted[i] {
				w *= LightBoost
			}
			sum += w
		}
		spent := 0.0
		for i := range open {
			w := weight[i]
			if boosted[i] {
				w *= LightBoost
			}
			give := min(left*w/sum, demand[i]-got[i])
			got[i] += give
			spent += give
			if demand[i]-got[i] < 1e-9 {
				delete(open, i)
			}
		}
		left -= spent
		if spent < 1e-9 {
			break
		}
	}
	return got
}

// Window after window, with the CPUs split as the kernel would at the
// weights the boosts give: two floods settle unboosted, each at its part,
// wherever they started (one of them boosted while it was idle); a light
// function beside them is boosted and stays so.
func TestLightBoostsSettle(t *testing.T) {
	for _, tc := range []struct {
		name    string
		demand  []float64 // CPUs each would use (a flood: both CPUs, runs in flight on each)
		weight  []float64
		boosted []bool
		want    []bool // from the third window on
	}{
		{"two floods, one boosted while idle", []float64{2, 2}, []float64{1, 1}, []bool{true, false}, []bool{false, false}},
		{"three floods, two boosted", []float64{2, 2, 2}, []float64{1, 1, 1}, []bool{true, true, false}, []bool{false, false, false}},
		{"floods at 3:1, the light one boosted", []float64{2, 2}, []float64{3, 1}, []bool{false, true}, []bool{false, false}},
		{"a light function beside two floods", []float64{0.2, 2, 2}, []float64{1, 1, 1}, []bool{false, false, false}, []bool{true, false, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			used, boosts := simulate(12, tc.weight, tc.boosted, func([]bool) []float64 { return tc.demand })
			for w := 2; w < len(boosts); w++ {
				if fmt.Sprint(boosts[w]) != fmt.Sprint(tc.want) {
					t.Fatalf("window %d: boosts %v (the CPUs used %v), want %v", w+1, boosts[w], used[w], tc.want)
				}
			}
		})
	}
}

// window is one window's reading of a group beside a flood that uses 1.4
// of 2 CPUs at an equal weight (the group's part: 1 CPU): the CPUs it
// used, and whether it flooded or its use could not be read.
type window struct {
	used            float64
	flooding, blind bool
}

// boostsOver feeds lightBoosts the windows one by one, the group's boost
// and record carried from each to the next, and returns its boosts.
func boostsOver(ws []window) []bool {
	var boosted bool
	var rec lightRecord
	out := make([]bool, len(ws))
	for i, w := range ws {
		g := u(1, w.used, boosted)
		g.flooding, g.known, g.record = w.flooding, !w.blind, rec
		b, recs := lightBoosts([]groupUse{g, u(1, 1.4, false)}, 2)
		boosted, rec = b[0], recs[0]
		out[i] = boosted
	}
	return out
}

// repeat is n of v.
func repeat[T any](n int, v T) []T {
	vs := make([]T, n)
	for i := range vs {
		vs[i] = v
	}
	return vs
}

// A boost that ends makes the next one wait for 2, then 4, 8 and at most
// 16 light windows in a row, until 64 in a row forget it; whatever ended
// it (a burst, a flood, a use that could not be read).
func TestLightBoostsWaitAfterALoss(t *testing.T) {
	light, heavy := window{used: 0.3}, window{used: 0.9}
	cat := func(parts ...[]window) []window { return slices.Concat(parts...) }
	T, F := true, false
	for _, tc := range []struct {
		name    string
		windows []window
		want    []bool
	}{
		{"a light function stays boosted", repeat(4, light), []bool{T, T, T, T}},
		{"a burst, then two light windows", cat([]window{light, heavy}, repeat(3, light)), []bool{T, F, F, T, T}},
		{"two bursts: four light windows", cat([]window{light, heavy, light, light, heavy}, repeat(5, light)),
			[]bool{T, F, F, T, F, F, F, F, T, T}},
		{"a flood ends the boost as a burst does", cat([]window{light, {used: 0.1, flooding: true}}, repeat(2, light)), []bool{T, F, F, T}},
		{"a use that could not be read likewise", cat([]window{light, {blind: true}}, repeat(2, light)), []bool{T, F, F, T}},
		// The burst after 64 light windows in a row waits 2, not 4.
		{"forgotten after 64 light windows", cat([]window{light, heavy}, repeat(64, light), []window{heavy}, repeat(2, light)),
			slices.Concat([]bool{T, F, F}, repeat(63, T), []bool{F, F, T})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := boostsOver(tc.windows); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("boosts %v, want %v", got, tc.want)
			}
		})
	}
}

// simulate runs the boost for n windows over groups of weight that each
// want demand(boosted) CPUs of 2, split as the kernel would (share), each
// group's boost and record carried to the next window; it returns what
// each used and its boost, window by window.
func simulate(n int, weight []float64, boosted []bool, demand func(boosted []bool) []float64) (used [][]float64, boosts [][]bool) {
	boosted = slices.Clone(boosted)
	recs := make([]lightRecord, len(weight))
	for range n {
		got := share(2, demand(boosted), weight, boosted)
		uses := make([]groupUse, len(got))
		for i := range got {
			uses[i] = u(weight[i], got[i], boosted[i])
			uses[i].record = recs[i]
		}
		boosted, recs = lightBoosts(uses, 2)
		used, boosts = append(used, got), append(boosts, boosted)
	}
	return used, boosts
}

// A worker that spins only while boosted (it can read its own level), and
// otherwise idles or uses just under half its part, gets less than its
// part over time beside three floods, where an honest worker gets its
// part: before, it was boosted again after each light window and ran at
// 8 times its weight every other window (0.73 and 0.85 CPUs here; a
// review's probe measured 0.56-0.76 where an honest one took 0.45-0.49).
func TestLightBoostsBoundAWorkerThatSpinsOnlyWhileBoosted(t *testing.T) {
	for _, tc := range []struct {
		name      string
		unboosted float64 // the CPUs it wants while not boosted
		boostedAt []int   // the first windows it is boosted in
	}{
		{"idle unless boosted", 0, []int{1, 4, 9, 18, 35, 52}},
		{"just under half its part unless boosted", 0.24, []int{1, 4, 9, 18, 35, 52}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			weight := []float64{1, 1, 1, 1}
			used, boosts := simulate(400, weight, make([]bool, 4), func(boosted []bool) []float64 {
				if boosted[3] {
					return []float64{2, 2, 2, 2}
				}
				return []float64{2, 2, 2, tc.unboosted}
			})
			var at []int
			var total float64
			for w := range used {
				total += used[w][3]
				if boosts[w][3] && len(at) < len(tc.boostedAt) {
					at = append(at, w+1)
				}
			}
			if !slices.Equal(at, tc.boostedAt) {
				t.Errorf("boosted in windows %v, want %v", at, tc.boostedAt)
			}
			// Its part: 2 CPUs among 4 equal weights.
			mean := total / float64(len(used))
			if mean >= 0.5 {
				t.Errorf("it used %.2f CPUs over %d windows, at least its part of 0.5", mean, len(used))
			}
			t.Logf("it used %.2f CPUs over %d windows (its part: 0.5)", mean, len(used))
		})
	}
}

func TestCPUTimeCountsEveryThread(t *testing.T) {
	before, err := cpuParts(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	for range 2 {
		go func() {
			for end := time.Now().Add(150 * time.Millisecond); time.Now().Before(end); {
			}
			done <- struct{}{}
		}()
	}
	<-done
	<-done
	after, err := cpuParts(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// Two threads spun 150 ms of wall time each; on a busy machine they
	// got less of a CPU, never none.
	if rose := after.total() - before.total(); rose < 50*time.Millisecond {
		t.Fatalf("cpu time rose %v across two threads' spins of 150 ms", rose)
	}
	if _, err := cpuParts(1 << 30); err == nil {
		t.Fatal("a pid that cannot exist was read")
	}
}

// Against a fake v1 hierarchy with real processes: a worker that sleeps
// beside one that spins, at equal weights, runs boosted (8x its cpu.shares)
// and the spinner does not, whether it spins itself or in short-lived
// children it reaps (their time is its, once reaped); a boost never
// outlives its process.
func TestLightWorkerIsBoosted(t *testing.T) {
	for _, tc := range []struct{ name, spin string }{
		{"spins itself", "while :; do :; done"},
		{"spins in children it reaps", "while :; do timeout 0.05 sh -c 'while :; do :; done'; done"},
	} {
		t.Run(tc.name, func(t *testing.T) { lightWorkerIsBoosted(t, tc.spin) })
	}
}

// fakeV1Groups is CPU groups on a fake v1 hierarchy in a temporary
// directory, boosting at LightBoost with the loop driven by hand (reboost),
// closed and the hierarchy's root restored when the test ends.
func fakeV1Groups(t *testing.T) *CPUGroups {
	t.Helper()
	root := t.TempDir()
	old := cgroupRoot
	cgroupRoot = root
	t.Cleanup(func() { cgroupRoot = old })
	os.MkdirAll(filepath.Join(root, "cpu"), 0o755)
	os.WriteFile(filepath.Join(root, "cpu", "cpu.shares"), []byte("1024"), 0o644)
	g := NewCPUGroups(nil)
	if g == nil {
		t.Fatal("no groups on a writable v1 hierarchy")
	}
	g.boost = LightBoost
	t.Cleanup(g.Close)
	return g
}

func lightWorkerIsBoosted(t *testing.T, script string) {
	g := fakeV1Groups(t)
	spin := exec.Command("sh", "-c", script)
	sleep := exec.Command("sleep", "60")
	startInGroup(t, spin)
	startInGroup(t, sleep)
	m := &abi.Manifest{Name: "f"}
	spinner, sleeper := g.Place(spin.Process.Pid, 0), g.Place(sleep.Process.Pid, 0)
	spinner.Weigh(m)
	sleeper.Weigh(m)
	shares := func(c *Group) string { return readString(filepath.Join(c.dir, "cpu.shares")) }
	// A fifth of a CPU to share: the spinner's part is all of it, the
	// sleeper's half, and the spinner uses more than that part on a
	// loaded machine too.
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		g.reboost([]*Group{spinner, sleeper}, time.Now(), 0.2)
		if shares(spinner) == "1024" && shares(sleeper) == "8192" {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("cpu.shares: spinner %s, sleeper %s; want 1024 and 8192", shares(spinner), shares(sleeper))
		}
	}
	// Its own weight changes keep the boost on top.
	sleeper.Weigh(&abi.Manifest{Name: "f", Share: 2})
	if got := shares(sleeper); got != "16384" {
		t.Fatalf("a boosted worker weighed at share 2: cpu.shares %s, want 16384", got)
	}
	sleeper.Exited()
	os.WriteFile(filepath.Join(sleeper.dir, "cpu.shares"), []byte("untouched"), 0o644)
	sleeper.Weigh(m)
	g.reboost([]*Group{spinner, sleeper}, time.Now(), 0.2)
	if got := shares(sleeper); got != "untouched" {
		t.Fatalf("a group written after its process exited: cpu.shares %s", got)
	}
	g.mu.Lock()
	_, live := g.live[sleeper]
	g.mu.Unlock()
	if live {
		t.Fatal("an exited group is still read by the boost loop")
	}
}

// startInGroup starts cmd in a process group of its own, which is killed,
// and cmd reaped, when the test ends.
func startInGroup(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	})
}

// firstChild waits up to 10 s for process pid's first child, what, to
// show in its tree (procTree), and returns its pid.
func firstChild(t *testing.T, pid int, what string) int {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if tree := procTree(pid); len(tree) > 1 {
			return tree[1].pid
		}
		if time.Now().After(end) {
			t.Fatalf("%s never showed under process %d", what, pid)
		}
	}
}

// niceOf is process pid's nice level (its main thread's).
func niceOf(t *testing.T, pid int) int {
	t.Helper()
	f, err := statFields(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(f[16])
	return n
}

// With nice levels a worker is its process and the processes under it: a
// worker whose child spins is not light (its own threads idle), and the
// child takes its worker's level, boosted or not, rather than keep the one
// it was forked at.
func TestLightBoostByNiceLevelCountsTheWorkersChildren(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("lowering a nice level takes CAP_SYS_NICE")
	}
	g := &CPUGroups{nice: true, lower: true, log: slog.New(slog.DiscardHandler), boost: LightBoost}
	parent := exec.Command("sh", "-c", "sh -c 'while :; do :; done' & wait")
	sleep := exec.Command("sleep", "60")
	for _, c := range []*exec.Cmd{parent, sleep} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		defer c.Wait()
		defer syscall.Kill(c.Process.Pid, syscall.SIGKILL)
	}
	child := firstChild(t, parent.Process.Pid, "the spinning child")
	defer syscall.Kill(child, syscall.SIGKILL)
	m := &abi.Manifest{Name: "f"}
	spinner, sleeper := g.Place(parent.Process.Pid, 0), g.Place(sleep.Process.Pid, 0)
	spinner.Weigh(m)
	sleeper.Weigh(m)
	if n := niceOf(t, child); n != 10 {
		t.Fatalf("the worker's child at nice %d once its worker took a default function, want 10", n)
	}
	// 0.02 of a CPU to share: a spinner starved at nice 10 on a loaded
	// machine (CI's two cores) still uses more than half its part, and the
	// sleeper less; at 1, the starved spinner read as light.
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		g.reboost([]*Group{spinner, sleeper}, time.Now(), 0.02)
		if !spinner.boosted && sleeper.boosted && niceOf(t, child) == 10 && niceOf(t, sleep.Process.Pid) == 1 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("boosted: spinner's worker %v (child at nice %d), sleeper %v (nice %d); want false (10), true (1)",
				spinner.boosted, niceOf(t, child), sleeper.boosted, niceOf(t, sleep.Process.Pid))
		}
	}
}

// onThreadAs runs f on a thread of its own whose user is uid (and so,
// from root, without capabilities: credentials are a thread's on Linux,
// and a raw system call changes only the caller's); the thread ends with
// it. It is how an unprivileged server is tried from a root test.
func onThreadAs(t *testing.T, uid int, f func()) {
	t.Helper()
	done := make(chan error)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESUID, uintptr(uid), uintptr(uid), uintptr(uid)); e != 0 {
			done <- e
			return
		}
		f()
		done <- nil
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// sleepAsNobodyAt starts a sleep as user nobody at nice level n (from the
// test's 0), killed and reaped when the test ends, once it is at n.
func sleepAsNobodyAt(t *testing.T, n int) *exec.Cmd {
	t.Helper()
	const nobody = 65534
	cmd := exec.Command("nice", "-n", strconv.Itoa(n), "sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	waitFor(t, fmt.Sprintf("nice -n %d to take", n), func() bool { return niceOf(t, cmd.Process.Pid) == n })
	return cmd
}

// An unprivileged server (a pod's) cannot take a nice level back down: its
// workers' levels only rise. A standby stays at the server's level, so
// that the function it takes gets its own level (from 19 it could not come
// back to 10, and the failure turned every worker's weight off); a worker
// whose weight grows keeps its level; nothing fails, and no boost starts.
func TestNiceLevelsOnlyRiseWithoutPrivilege(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("tried from root, on a thread made unprivileged")
	}
	const nobody = 65534
	sleep := exec.Command("sleep", "60")
	sleep.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	defer sleep.Wait()
	defer sleep.Process.Kill()
	pid := sleep.Process.Pid
	var g *CPUGroups
	var levels []int
	onThreadAs(t, nobody, func() {
		g = &CPUGroups{nice: true, log: slog.New(slog.DiscardHandler)}
		g.base, g.lower = nicelevel.Try() // Probe's, on this thread
		if g.lower {
			return
		}
		g.StartBoost(LightBoost, float64(runtime.GOMAXPROCS(0)))
		c := g.Place(pid, 0) // a standby
		levels = append(levels, niceOf(t, pid))
		c.Weigh(&abi.Manifest{Name: "f"})
		levels = append(levels, niceOf(t, pid))
		c.setWeight(3, []string{"f", "g"}) // a tenant's worker with a second function busy
		levels = append(levels, niceOf(t, pid))
		c.setWeight(1.0/8, []string{"h"}) // a batch function alone
		levels = append(levels, niceOf(t, pid))
	})
	if g.lower {
		t.Fatal("an unprivileged thread could take its nice level back down")
	}
	if want := []int{0, 10, 10, 19}; fmt.Sprint(levels) != fmt.Sprint(want) {
		t.Fatalf("the worker's levels as a standby, a default function, heavier, a batch one: %v, want %v", levels, want)
	}
	if g.Mechanism() != "nice" {
		t.Fatalf("mechanism %q after the writes, want nice (nothing failed)", g.Mechanism())
	}
	if g.stopBoost != nil {
		t.Fatal("a boost started where levels cannot be taken back")
	}

	// A worker whose thread raised its own level past its function's is
	// left there: the level cannot be taken back, and trying failed the
	// weights of every worker.
	niced := sleepAsNobodyAt(t, 19)
	onThreadAs(t, nobody, func() {
		c := g.Place(niced.Process.Pid, 0)
		c.Weigh(&abi.Manifest{Name: "f"})
	})
	if n := niceOf(t, niced.Process.Pid); n != 19 || g.Mechanism() != "nice" {
		t.Fatalf("a worker at nice 19 of its own, weighed at 10 unprivileged: nice %d, weights %q; want 19, nice", n, g.Mechanism())
	}
}

// With nice levels and a PID namespace, what a worker leaves behind goes
// to the namespace's init, not under the worker (which the server started
// into the namespace: the server's child, the init's sibling): the tree
// (Group.Tree) takes in the init's too, so a spinner the worker orphaned
// counts against it and takes its level.
func TestLightBoostByNiceLevelCountsTheNamespacesOrphans(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("lowering a nice level takes CAP_SYS_NICE")
	}
	// init stands for the namespace's init, its child for the orphan; the
	// worker (sleep) is the test's child, as the worker is the server's.
	init := exec.Command("sh", "-c", "(while :; do :; done) & wait")
	worker := exec.Command("sleep", "60")
	startInGroup(t, init)
	startInGroup(t, worker)
	orphan := firstChild(t, init.Process.Pid, "the orphan")
	g := &CPUGroups{nice: true, lower: true, log: slog.New(slog.DiscardHandler), boost: LightBoost}
	c := g.Place(worker.Process.Pid, 0)
	c.Tree(init.Process.Pid)
	c.Weigh(&abi.Manifest{Name: "f"})
	if n := niceOf(t, orphan); n != 10 {
		t.Fatalf("the orphan at nice %d once its worker took a default function, want 10", n)
	}
	// The group's part is 0.02 CPUs, so the orphan keeps it unboosted with
	// 0.01: at nice 10 it gets that even beside a loaded machine's nice-0
	// spinners (with 0.2, three of them on 2 CPUs left it 0.07 and a boost).
	for range 5 {
		time.Sleep(100 * time.Millisecond)
		g.reboost([]*Group{c}, time.Now(), 0.02)
		if c.boosted {
			t.Fatal("a worker whose orphan spins was boosted")
		}
	}
	if n := niceOf(t, worker.Process.Pid); n != 10 {
		t.Fatalf("the worker at nice %d, want 10", n)
	}
}

// fakeFunctions is what the engine tells the boost (Functions): the
// server's time on a function's bytes, growing at io CPUs from start, and
// which functions flood.
type fakeFunctions struct {
	start   time.Time
	io      map[string]float64
	flooded map[string]bool
}

func (f fakeFunctions) IOTime(name string) time.Duration {
	return time.Duration(float64(time.Since(f.start)) * f.io[name])
}

func (f fakeFunctions) Flooding(name string, _ time.Duration) bool { return f.flooded[name] }

// What the server tells of a function counts in its group's use (Consult):
// a worker that sleeps while the server moves its function's bytes at a
// CPU's worth is no light worker, and stays at its weight beside a light
// one, which runs boosted; nor is a flood's worker (two runs at once on a
// device), however little it uses. Without them both sleepers read light
// and both ran boosted (on 2 cores the 4 MB vecadd flood's worker used
// 0.4 CPUs and was boosted beside the CNN).
func TestWhatTheServerTellsCountsInAGroupsUse(t *testing.T) {
	for _, tc := range []struct {
		name string
		fns  fakeFunctions
	}{
		// 1.5: well past the part (one CPU) under which the flood is
		// light; at exactly one, a window measured a hair short of it
		// boosted the flood (seen once in 40 runs).
		{"the server moves its bytes at one and a half CPUs' worth", fakeFunctions{io: map[string]float64{"flood": 1.5}}},
		{"it floods", fakeFunctions{flooded: map[string]bool{"flood": true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.fns.start = time.Now()
			serverTellsOfAFlood(t, tc.fns)
		})
	}
}

func serverTellsOfAFlood(t *testing.T, fns fakeFunctions) {
	g := fakeV1Groups(t)
	g.Consult(fns)
	flood, victim := exec.Command("sleep", "60"), exec.Command("sleep", "60")
	startInGroup(t, flood)
	startInGroup(t, victim)
	fc, vc := g.Place(flood.Process.Pid, 0), g.Place(victim.Process.Pid, 0)
	fc.Weigh(&abi.Manifest{Name: "flood"})
	vc.Weigh(&abi.Manifest{Name: "victim"})
	shares := func(c *Group) string { return readString(filepath.Join(c.dir, "cpu.shares")) }
	// Two CPUs to share: each part is one, and the flood's worker with the
	// server's time on its bytes uses more than that.
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		g.reboost([]*Group{fc, vc}, time.Now(), 2)
		if shares(fc) == "1024" && shares(vc) == "8192" {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("cpu.shares: the flood's worker %s, the victim's %s; want 1024 and 8192", shares(fc), shares(vc))
		}
	}
	// Told nothing: the flood's worker sleeps, and reads light.
	g.Consult(nil)
	for end := time.Now().Add(10 * time.Second); shares(fc) != "8192"; time.Sleep(100 * time.Millisecond) {
		g.reboost([]*Group{fc, vc}, time.Now(), 2)
		if time.Now().After(end) {
			t.Fatalf("cpu.shares of a sleeping worker with no count of its bytes: %s, want 8192 (boosted)", shares(fc))
		}
	}
}

func TestOutsideSince(t *testing.T) {
	c := &Group{}
	c.seen = map[string]time.Duration{"a": time.Second, "b": 3 * time.Second}
	for _, tc := range []struct {
		name string
		now  map[string]time.Duration
		want map[string]float64 // CPUs over a window of 2 s
	}{
		{"nothing told", nil, nil},
		{"both grew", map[string]time.Duration{"a": 2 * time.Second, "b": 3500 * time.Millisecond}, map[string]float64{"a": 0.5, "b": 0.25}},
		{"one went down (deployed anew), one grew", map[string]time.Duration{"a": 0, "b": 4 * time.Second}, map[string]float64{"b": 0.5}},
		{"a function new to the group counts from its next read", map[string]time.Duration{"c": 9 * time.Second, "a": time.Second}, nil},
	} {
		if got := c.outsideSince(tc.now, 2); fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A function's bytes are charged once, in equal parts among the groups
// that run it (one a device, or an older version draining beside the new
// one), not in full to each: two workers of f whose bytes the server moves
// at a CPU's worth read half a CPU each, where each read a whole one.
func TestSpreadIO(t *testing.T) {
	uses := []groupUse{
		{weight: 1, used: 0.1, known: true, io: map[string]float64{"f": 1}},
		{weight: 1, used: 0.2, known: true, io: map[string]float64{"f": 1}},
		{weight: 1, used: 0.3, known: true, io: map[string]float64{"g": 0.4, "f": 1}}, // a tenant's worker running f too
		{weight: 1, used: 0.05, known: true},
	}
	spreadIO(uses)
	for i, want := range []float64{0.1 + 1.0/3, 0.2 + 1.0/3, 0.3 + 0.4 + 1.0/3, 0.05} {
		if math.Abs(uses[i].used-want) > 1e-9 {
			t.Errorf("group %d: %v CPUs, want %v", i, uses[i].used, want)
		}
	}
}
