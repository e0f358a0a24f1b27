package worker

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/internal/racebuild"
	"github.com/plover-run/plover/internal/testkit"
)

// memDevice is a host device of options o whose workers get the node's
// memory groups, skipping the test where the memory controller cannot be
// written (no root, no hierarchy, v2 without CPU groups).
func memDevice(t *testing.T, o Options) *Device {
	t.Helper()
	if racebuild.Enabled {
		t.Skip("the race detector's memory passes the 64 MiB limits these tests give workers")
	}
	g := NewMemGroups(cgroupRoot, nil, o.Log)
	if m := g.Mechanism(); m != "cgroup v1" {
		t.Skipf("worker memory groups %s here: want a writable cgroup v1 memory hierarchy", m)
	}
	t.Cleanup(g.Close)
	o.Exe, o.Base, o.Landlock, o.StageDir, o.Spawner, o.Mem = os.Args[0], device.NewHost(0), true, t.TempDir(), spawner, g
	d := NewDevice(o)
	t.Cleanup(func() { d.Close() })
	return d
}

// loadCapped loads the hostile bundle as function name, its chain the
// kernel named, under a max_host_memory_mb of 64.
func loadCapped(t *testing.T, d *Device, name, kernel string) (device.Program, *abi.Manifest) {
	t.Helper()
	m := testkit.Manifest(name)
	m.Library = "hostile.so"
	m.Chain = []abi.Launch{{Kernel: kernel, Grid: 1, Block: 1}}
	m.MaxHostMemoryMB = 64
	return loadSource(t, d, testkit.HostileSource(), m), m
}

// procsNamed lists the processes whose comm is name, with their resident
// memory in MiB.
func procsNamed(name string) map[int]int64 {
	found := map[int]int64{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || strings.TrimSpace(readString(filepath.Join("/proc", e.Name(), "comm"))) != name {
			continue
		}
		rss, _, _, _ := procStatus(pid)
		found[pid] = rss >> 20
	}
	return found
}

// A bundle whose kernel forks a child that allocates and holds 256 MiB,
// under a max_host_memory_mb of 64: the worker's check samples the worker
// process alone, so the child kept its memory for as long as it liked
// (the run said "held", and the child stayed with 256 MiB resident
// through every sample). With a memory group per worker the kernel's OOM
// killer ends the child as it passes the group's limit (v1: the largest
// process in the group), said in the log; the worker, the other function's
// worker and the server (this test) go on.
func TestAForkedChildCannotHoldMemoryPastItsWorkersLimit(t *testing.T) {
	var logBuf lockedBuffer
	d := memDevice(t, Options{Log: slog.New(slog.NewTextHandler(&logBuf, nil))})
	p, m := loadCapped(t, d, "forkhog", "echo")
	bystander := load(t, d, testkit.Manifest("bystander"))
	in := newInst(t, p, m)
	hog, err := p.Entry("fork_hog")
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("hog%d", os.Getpid())
	out := make([]byte, m.OutBytes)
	err = in.Run(&device.Run{Input: []byte(name), Output: out, TmpLen: m.TmpBytes,
		Chain: []device.Step{{Entry: hog, Grid: 256, Block: 1}}})
	said := string(bytes.TrimRight(out, "\x00"))
	t.Logf("fork_hog: %q, %v", said, err)
	g := p.(*program)
	// The check sampled the worker every 100 ms meanwhile; give it ten
	// samples more, then the child must be gone.
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		held := procsNamed(name)
		if len(held) == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the forked child (pid: MiB resident %v) held its memory 10 s past the run (%q), beside a worker limited to %d MiB (its own resident memory: %d MiB, alive %v)",
				held, said, m.MaxHostMemoryMB, g.Process().RSSBytes>>20, g.Alive())
		}
	}
	if said != "killed by signal 9" {
		t.Errorf("fork_hog said %q (%v): want its child killed (SIGKILL) as it passed the group's limit", said, err)
	}
	for end := time.Now().Add(5 * time.Second); !strings.Contains(logBuf.String(), "OOM killer ended a process in a worker's memory group"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("no OOM kill logged within 5 s; the log:\n%s", logBuf.String())
		}
	}
	if !strings.Contains(logBuf.String(), "function="+m.Name) {
		t.Errorf("the OOM kill's line does not name the function: %s", logBuf.String())
	}
	// Under v1 the largest process went; the worker and its neighbour run on.
	echo, _ := p.Entry("echo")
	if err := in.Run(&device.Run{Input: []byte("ok"), Output: out, TmpLen: m.TmpBytes, Chain: []device.Step{{Entry: echo, Grid: 1, Block: 1}}}); err != nil || !g.Alive() {
		t.Fatalf("the worker after its child's OOM kill: %v (alive %v)", err, g.Alive())
	}
	bm := testkit.Manifest("bystander")
	bout := make([]byte, bm.OutBytes)
	if err := newInst(t, bystander, bm).Run(&device.Run{Input: []byte("x"), Output: bout, Chain: []device.Step{{Entry: 0, Grid: 1, Block: 64}}}); err != nil || bout[0] != 'x' {
		t.Fatalf("the other function's worker: %v, %q", err, bout[:1])
	}
	// Its group's OOM kill was logged; a SIGKILL from elsewhere later is
	// no death by its limit (the group's kill count still says 1).
	if err := syscall.Kill(g.p.pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-g.Exited():
	case <-time.After(10 * time.Second):
		t.Fatal("the worker outlived a SIGKILL by 10 s")
	}
	if d := g.Death(); d == nil || strings.Contains(d.Error(), "max_host_memory_mb") {
		t.Fatalf("the worker's death by a SIGKILL not its group's: %v; want it not blamed on its memory limit", d)
	}
}

// A worker that holds memory its check cannot see (a memfd it never maps,
// 256 MiB under a limit of 64) kept it, alive, for as long as it liked.
// With a memory group the kernel's OOM killer ends it (v1: the largest
// process in the group, the worker itself here), and its requests say why,
// as the check's kill does: a kill for its limit, by the server's rules.
func TestAWorkerOOMKilledInItsMemoryGroupSaysSo(t *testing.T) {
	p, m := loadCapped(t, memDevice(t, Options{}), "hider", "hide_memory")
	out := make([]byte, m.OutBytes)
	err := newInst(t, p, m).Run(&device.Run{Input: []byte("x"), Output: out, TmpLen: m.TmpBytes,
		Chain: []device.Step{{Entry: 0, Grid: 256, Block: 1}}})
	var pe *ProcessExit
	if !errors.As(err, &pe) {
		t.Fatalf("the run: %v, said %q; the worker (alive %v, %d MiB resident) kept 256 MiB in a memfd past its limit of %d MiB",
			err, bytes.TrimRight(out, "\x00"), p.(*program).Alive(), p.(*program).Process().RSSBytes>>20, m.MaxHostMemoryMB)
	}
	// The group's limit as written: max_host_memory_mb, the slots it
	// maps and headroom.
	want := regexp.MustCompile(`its process tree's memory passed its memory cgroup's limit of (\d+) MiB \(max_host_memory_mb 64 MiB, with the slots it maps and headroom; the kernel's OOM killer in its memory cgroup\)`)
	if !pe.Killed || !want.MatchString(pe.Reason) {
		t.Fatalf("the worker's end: %v (killed by the server's rules: %v); want it to say %q", err, pe.Killed, want)
	}
	if n, _ := strconv.ParseInt(want.FindStringSubmatch(pe.Reason)[1], 10, 64); n < memGroupLimit(64<<20, 0)>>20 {
		t.Errorf("the limit quoted, %d MiB, is not the group's (at least %d MiB)", n, memGroupLimit(64<<20, 0)>>20)
	}
}

// A tenant's worker's memory group whose limit cannot be written is
// logged naming the tenant, whose functions' limits it holds together.
func TestATenantWorkersMemoryGroupFailureNamesTheTenant(t *testing.T) {
	var logBuf lockedBuffer
	d := memDevice(t, Options{TenantScope: true, Log: slog.New(slog.NewTextHandler(&logBuf, nil))})
	m := testkit.Manifest("f")
	m.MaxHostMemoryMB = 64
	g := loadFor(t, d, "acme", "", m, nil).(*program)
	mg := g.p.mem.Load()
	if mg == nil {
		t.Fatal("the tenant's worker has no memory group")
	}
	mg.mu.Lock()
	dir := mg.dir
	mg.dir = filepath.Join(t.TempDir(), "gone") // its files unreadable: the lowering fails
	mg.set(memGroupLimit(32<<20, 0))
	mg.dir = dir
	mg.mu.Unlock()
	if l := logBuf.String(); !strings.Contains(l, "cannot set a worker's memory group's limit") || !strings.Contains(l, `function="tenant acme"`) {
		t.Fatalf("the failed write's log does not name the tenant:\n%s", l)
	}
}

// A worker's slots are the server's: the pages of them it touches (the
// outputs it writes, here 128 MiB of out zeroed in place) are charged to
// its memory group, under a limit of 64. The group's limit counts the
// slots it maps: a limit of 64 MiB and headroom alone had the kernel kill
// the worker at its first request.
func TestSlotPagesAWorkerTouchesFitItsMemoryGroup(t *testing.T) {
	const big = 128 << 20
	for _, tc := range []struct {
		name    string
		in, out int64
	}{{"out", 1 << 16, big}, {"both", big, big}} {
		t.Run(tc.name, func(t *testing.T) {
			m := testkit.Manifest("big")
			m.MaxInputBytes, m.OutBytes, m.MaxHostMemoryMB = tc.in, tc.out, 64
			p := load(t, memDevice(t, Options{}), m)
			if err := firstRequest(t, p, m); err != nil {
				t.Fatal(err)
			}
			mg := p.(*program).p.mem.Load()
			if mg == nil {
				t.Fatal("the worker has no memory group")
			}
			mg.mu.Lock()
			used, err := mg.usage()
			mg.mu.Unlock()
			if err != nil || used < m.MaxHostMemoryMB<<20+memHeadroom {
				t.Fatalf("the group holds %d MiB (%v): the test wants more than the limit and headroom, the slot's pages", used>>20, err)
			}
		})
	}
}

// An instance's slot whose out the worker zeroed (128 MiB charged to its
// group) is let go at the instance's close, while the worker's own unmap
// of it is still to come: the group's limit falls to the worker's limit
// and headroom as the charge goes, never below what the group holds (the
// worker lives), within the watch loop's settles.
func TestAMemoryGroupsLimitFallsOnceASlotIsLetGo(t *testing.T) {
	m := testkit.Manifest("big")
	m.OutBytes, m.MaxHostMemoryMB = 128<<20, 64
	p := load(t, memDevice(t, Options{}), m)
	g := p.(*program)
	mg := g.p.mem.Load()
	in := newInst(t, p, m)
	if err := in.Run(&device.Run{Input: []byte("x"), Output: make([]byte, m.OutBytes), ZeroOut: true, TmpLen: m.TmpBytes,
		Chain: []device.Step{{Entry: 0, Grid: 1, Block: 64}}}); err != nil {
		t.Fatal(err)
	}
	look := func() (limit, want, used int64) {
		mg.mu.Lock()
		defer mg.mu.Unlock()
		used, _ = mg.usage()
		return mg.limit, memGroupLimit(g.p.memLimit.Load(), g.p.mappedSlots()), used
	}
	if limit, _, used := look(); used < m.MaxHostMemoryMB<<20+memHeadroom || limit < used {
		t.Fatalf("before the close: limit %d MiB, %d MiB held; want the slot's out held, within the limit", limit>>20, used>>20)
	}
	in.Close()
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		limit, want, used := look()
		if !g.Alive() {
			t.Fatalf("the worker died as its slot went: %v", g.Death())
		}
		if limit == want && want == memGroupLimit(m.MaxHostMemoryMB<<20, 0) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the group's limit %d MiB 5 s after the slot went (%d MiB held), want %d MiB", limit>>20, used>>20, want>>20)
		}
	}
}

// A tenant's worker's limit is its functions' together (retune): its
// memory group's follows it, as each function loads, and goes to none
// with a function that has none.
func TestATenantWorkersMemoryGroupFollowsItsFunctions(t *testing.T) {
	d := memDevice(t, Options{TenantScope: true})
	var g *program
	sum := int64(0) // MiB; -1 once one has none
	for i, lim := range []int64{64, 32, 0} {
		m := testkit.Manifest(fmt.Sprintf("f%d", i))
		m.MaxHostMemoryMB = lim
		g = loadFor(t, d, "t", "", m, nil).(*program)
		mg := g.p.mem.Load()
		if mg == nil {
			t.Fatal("the tenant's worker has no memory group")
		}
		mg.mu.Lock()
		limit := mg.limit
		mg.mu.Unlock()
		if sum += lim; lim == 0 {
			sum = -1
		}
		want := memGroupLimit(max(sum, 0)<<20, g.p.mappedSlots())
		if got := strings.TrimSpace(readString(filepath.Join(mg.dir, "memory.limit_in_bytes"))); limit != want || want >= 0 && got != strconv.FormatInt(want, 10) {
			t.Fatalf("after %s (max_host_memory_mb %d): the group's limit %d (its file %q), want %d", m.Name, lim, limit, got, want)
		}
	}
}

func TestMemGroupLimitArithmetic(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		limit, mapped, want int64
	}{
		{0, 0, -1},                                   // no limit: none for the group
		{0, 512 * mib, -1},                           // slots alone make none
		{64 * mib, 0, 96*mib + 256<<10},              // a program loaded, no slot yet: 32 MiB and 1/256 of 64
		{64 * mib, 257 * mib, 353*mib + 321*mib/256}, // its slots counted whole, their page tables too
		{64 * mib, -mib, 96*mib + 256<<10},           // never less than its limit
		{8192 * mib, 0, 8256 * mib},                  // page tables of 8 GiB touched: 16 MiB, headroom 64
		{8192 * mib, 8192 * mib, 16384*mib + 96*mib}, // 16 GiB in all: 32 MiB and 64
		{math.MaxInt64 >> 20 << 20, 0, -1},           // --worker-max-memory's largest: the sum would pass an int64
		{math.MaxInt64 - mib, 2 * mib, -1},           // limit and slots passing an int64 together
	} {
		if got := memGroupLimit(tc.limit, tc.mapped); got != tc.want {
			t.Errorf("memGroupLimit(%d, %d) = %d, want %d", tc.limit, tc.mapped, got, tc.want)
		}
	}
	for _, tc := range []struct {
		name                 string
		want, cur, used, got int64
	}{
		{"down to the aim, usage below it", 100 * mib, 400 * mib, 50 * mib, 100 * mib},
		{"stops above usage", 100 * mib, 400 * mib, 300 * mib, 300*mib + memSlack},
		{"never above the limit now", 100 * mib, 400 * mib, 399 * mib, 400 * mib},
		{"from none, above usage", 100 * mib, -1, 300 * mib, 300*mib + memSlack},
		{"from none, usage below", 100 * mib, -1, 10 * mib, 100 * mib},
		{"16 MiB above usage: room for a sibling's growth", 100 * mib, 400 * mib, 300 * mib, 316 * mib},
	} {
		if got := memGroupLower(tc.want, tc.cur, tc.used); got != tc.got {
			t.Errorf("%s: memGroupLower(%d, %d, %d) = %d, want %d", tc.name, tc.want, tc.cur, tc.used, got, tc.got)
		}
	}
}

// The files a worker's memory group is written and read through, on fake
// v1 and v2 hierarchies: v1 a group of its own in the memory hierarchy
// (memory.limit_in_bytes, -1 none; memory.usage_in_bytes;
// memory.oom_control's oom_kill), v2 the worker's CPU group with the
// controller passed down (memory.max, "max" none; memory.current;
// memory.events' oom_kill; memory.oom.group 1).
func TestMemGroupFiles(t *testing.T) {
	for _, tc := range []struct {
		name, self                 string
		limit, usage, events, none string
	}{
		{"v1", "4:memory:/srv\n1:cpu:/\n0::/\n", "memory.limit_in_bytes", "memory.usage_in_bytes", "memory.oom_control", "-1"},
		{"v2", "0::/srv\n", "memory.max", "memory.current", "memory.events", "max"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := fakeCgroups(t, tc.self)
			var cpu *CPUGroups
			if tc.name == "v2" {
				os.MkdirAll(filepath.Join(root, "srv"), 0o755)
				os.WriteFile(filepath.Join(root, "cgroup.controllers"), []byte("cpu memory pids"), 0o644)
				cpu = NewCPUGroupsAt(root, nil)
			} else {
				os.MkdirAll(filepath.Join(root, "memory", "srv"), 0o755)
				os.WriteFile(filepath.Join(root, "memory", "srv", "cgroup.procs"), nil, 0o644)
			}
			g := NewMemGroups(root, cpu, nil)
			if got := g.Mechanism(); got != "cgroup "+tc.name {
				t.Fatalf("mechanism %q, want cgroup %s", got, tc.name)
			}
			var cg *Group
			dir := filepath.Join(g.dir, "1234")
			if cpu != nil {
				for _, d := range []string{cpu.home, cpu.dir} {
					if got := readString(filepath.Join(d, "cgroup.subtree_control")); got != "+memory" {
						t.Fatalf("%s's subtree_control was last written %q, want +memory", d, got)
					}
				}
				cg = cpu.Place(1234, 0)
				dir = cg.dir
				os.WriteFile(filepath.Join(dir, "memory.oom.group"), nil, 0o644) // the kernel's file
			}
			mg := g.Place(1234, cg)
			if mg == nil || mg.dir != dir {
				t.Fatalf("the worker's memory group %+v, want its files in %s", mg, dir)
			}
			if got := readString(filepath.Join(dir, tc.limit)); got != tc.none {
				t.Fatalf("a standby's %s %q, want %s", tc.limit, got, tc.none)
			}
			if cpu != nil {
				if got := readString(filepath.Join(dir, "memory.oom.group")); got != "1" {
					t.Fatalf("memory.oom.group %q, want 1", got)
				}
			} else if got := readString(filepath.Join(dir, "cgroup.procs")); got != "1234" {
				t.Fatalf("cgroup.procs %q, want the worker's pid", got)
			}
			// A raise is written at once; a lowering stops above usage,
			// then reaches its aim once usage is below it.
			set := func(v, used int64) string {
				os.WriteFile(filepath.Join(dir, tc.usage), []byte(strconv.FormatInt(used, 10)+"\n"), 0o644)
				mg.mu.Lock()
				mg.set(v)
				mg.mu.Unlock()
				return readString(filepath.Join(dir, tc.limit))
			}
			if got := set(400<<20, 0); got != strconv.Itoa(400<<20) {
				t.Fatalf("raised to %q, want %d", got, 400<<20)
			}
			if got := set(100<<20, 300<<20); got != strconv.Itoa(300<<20+memSlack) {
				t.Fatalf("lowered below usage to %q, want usage and slack %d", got, 300<<20+memSlack)
			}
			if got := set(100<<20, 10<<20); got != strconv.Itoa(100<<20) {
				t.Fatalf("lowered to %q once usage fell, want %d", got, 100<<20)
			}
			if got := set(-1, 0); got != tc.none {
				t.Fatalf("no limit written as %q, want %s", got, tc.none)
			}
			os.WriteFile(filepath.Join(dir, tc.events), []byte("oom 3\noom_kill 2\n"), 0o644)
			if n := mg.oomKills(); n != 2 {
				t.Fatalf("oom kills %d from %s, want 2", n, tc.events)
			}
			// The times it met its own limit: v1 memory.failcnt, v2
			// memory.events.local's max and oom.
			hits := "memory.failcnt"
			if cpu != nil {
				hits = "memory.events.local"
				os.WriteFile(filepath.Join(dir, hits), []byte("low 0\nhigh 1\nmax 4\noom 3\noom_kill 2\n"), 0o644)
			} else {
				os.WriteFile(filepath.Join(dir, hits), []byte("7\n"), 0o644)
			}
			if n := mg.limitHits(); n != 7 {
				t.Fatalf("limit hits %d from %s, want 7", n, hits)
			}
		})
	}
	// No hierarchy: none, and so no group.
	root := fakeCgroups(t, "0::/\n")
	if g := NewMemGroups(filepath.Join(root, "none"), nil, nil); g != nil || g.Mechanism() != "off" || g.Place(1, nil) != nil {
		t.Fatalf("memory groups without a hierarchy: %+v", g)
	}
}

// processEnding: a live process is not; a zombie (exited, not yet waited
// for) and a pid with no process are.
func TestMemGroupProcessEnding(t *testing.T) {
	if processEnding(os.Getpid()) {
		t.Fatal("this test's own process taken as ending")
	}
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	for end := time.Now().Add(5 * time.Second); !strings.HasPrefix(strings.Fields(readString(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid)) + " x x x")[2], "Z"); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("true never became a zombie")
		}
	}
	if !processEnding(cmd.Process.Pid) {
		t.Fatal("a zombie taken as alive")
	}
	cmd.Wait()
	if !processEnding(cmd.Process.Pid) {
		t.Fatal("a reaped pid taken as alive")
	}
}
