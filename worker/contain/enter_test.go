package contain

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

const nobody = 65534

type enterReport struct {
	Err          string
	ParentGone   bool
	Resuid       [3]int
	Resgid       [3]int
	Groups       []int
	Threads      []threadStatus
	PdeathMain   int
	PdeathPre    int
	PreTID       int
	MainTID      int
	CTID         int
	Checks       map[string]string
	RTPrioRaised bool // RLIMIT_RTPRIO was raised above 0 before Enter
	SysResource  bool // CAP_SYS_RESOURCE was held before Enter
	Applied      bool
	LandlockTest bool
	// EarlyBnd is the main thread's bounding set before Enter: empty
	// when the early constructor ran (a child started as "worker").
	EarlyBnd uint64
}

// startProbeThread parks a goroutine on a thread of its own that exists
// before Enter; ask returns that thread's parent-death signal.
func startProbeThread() (tid int, ask func() int) {
	tids := make(chan int)
	req := make(chan struct{})
	res := make(chan int)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tids <- unix.Gettid()
		for range req {
			sig, err := parentDeathSignal()
			if err != nil {
				sig = -1
			}
			res <- sig
		}
	}()
	return <-tids, func() int { req <- struct{}{}; return <-res }
}

func fillIdentity(rep *enterReport) {
	r, e, s := getresuid()
	rep.Resuid = [3]int{r, e, s}
	r, e, s = getresgid()
	rep.Resgid = [3]int{r, e, s}
	rep.Groups, _ = unix.Getgroups()
	var err error
	if rep.Threads, err = threadStatuses(); err != nil {
		die("thread status: %v", err)
	}
	if rep.PdeathMain, err = parentDeathSignal(); err != nil {
		die("PR_GET_PDEATHSIG: %v", err)
	}
}

// childEnterDrop runs as root, enters with Drop=nobody and reports its
// identity and capabilities on every thread, then goes on to the
// worker's next step, RestrictFS with the bundle given as an fd.
func childEnterDrop() {
	rep := enterReport{MainTID: unix.Gettid(), Checks: map[string]string{}}
	for c := 0; c < 64; c++ {
		in, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0)
		if err != nil {
			break
		}
		rep.EarlyBnd |= uint64(in) << c
	}
	var ask func() int
	rep.PreTID, ask = startProbeThread()
	if startCThread != nil {
		var err error
		if rep.CTID, err = startCThread(); err != nil {
			die("starting C thread: %v", err)
		}
	}

	// The worker receives its bundle as an open directory; open both
	// directories while still root.
	bundle, err := os.Open(os.Getenv("CT_BUNDLE"))
	if err != nil {
		die("%v", err)
	}
	other, err := os.Open(os.Getenv("CT_OTHER"))
	if err != nil {
		die("%v", err)
	}

	// As a systemd unit's LimitRTPRIO or limits.conf's rtprio would give
	// the server, where this may raise it (CAP_SYS_RESOURCE).
	rep.RTPrioRaised = unix.Setrlimit(unix.RLIMIT_RTPRIO, &unix.Rlimit{Cur: 10, Max: 10}) == nil
	rep.SysResource, _ = hasEffectiveCap(unix.CAP_SYS_RESOURCE)
	if err := Enter(Policy{Drop: &Identity{UID: nobody, GID: nobody}, ParentPID: os.Getppid()}); err != nil {
		rep.Err = err.Error()
		report(rep)
		return
	}
	fillIdentity(&rep)
	rep.PdeathPre = ask()

	rep.Checks["setresuid-root"] = outcome(syscall.Setresuid(0, 0, 0))
	oomChecks(&rep)
	var nice unix.Rlimit
	unix.Getrlimit(unix.RLIMIT_NICE, &nice)
	rep.Checks["rlimit-nice"] = fmt.Sprintf("%d %d", nice.Cur, nice.Max)
	var rt unix.Rlimit
	unix.Getrlimit(unix.RLIMIT_RTPRIO, &rt)
	rep.Checks["rlimit-rtprio"] = fmt.Sprintf("%d %d", rt.Cur, rt.Max)
	var files unix.Rlimit
	unix.Getrlimit(unix.RLIMIT_NOFILE, &files)
	rep.Checks["rlimit-nofile-max"] = strconv.FormatUint(files.Max, 10)
	files.Max++
	rep.Checks["rlimit-nofile-raise"] = outcome(unix.Setrlimit(unix.RLIMIT_NOFILE, &files))
	prio := int32(1)
	_, _, e := unix.RawSyscall(unix.SYS_SCHED_SETSCHEDULER, 0, 1 /* SCHED_FIFO */, uintptr(unsafe.Pointer(&prio)))
	rep.Checks["sched-fifo"] = "ok"
	if e != 0 {
		rep.Checks["sched-fifo"] = outcome(e)
	}
	rep.Checks["secret"] = tryRead(os.Getenv("CT_SECRET"))
	rep.Checks["parent-environ"] = tryRead(fmt.Sprintf("/proc/%d/environ", os.Getppid()))
	rep.Checks["other-before-landlock"] = tryOpenat(int(other.Fd()), "file")
	rep.Checks["bundle-real-path"] = tryRead(filepath.Join(os.Getenv("CT_BUNDLE"), "file"))

	if LandlockABI() < 1 {
		report(rep)
		return
	}
	rep.LandlockTest = true
	rules := DefaultRules()
	rules.RODirs = append(rules.RODirs, fmt.Sprintf("/proc/self/fd/%d", bundle.Fd()))
	rep.Applied, err = RestrictFS(rules)
	if err != nil {
		die("RestrictFS after Enter: %v", err)
	}
	rep.Checks["bundle-openat"] = tryOpenat(int(bundle.Fd()), "file")
	rep.Checks["bundle-proc-path"] = tryRead(fmt.Sprintf("/proc/self/fd/%d/file", bundle.Fd()))
	rep.Checks["other-openat"] = tryOpenat(int(other.Fd()), "file")
	rep.Checks["oom-score-adj-landlocked"] = tryLowerOOMScore()
	report(rep)
}

// oomChecks reports the OOM score adjustment Enter left and, where the
// process held CAP_SYS_RESOURCE before it (the kernel then makes the
// score the least it may set without), what lowering it again does.
func oomChecks(rep *enterReport) {
	score, err := OOMScore(os.Getpid())
	rep.Checks["oom-score-adj"] = strconv.Itoa(score)
	if err != nil {
		rep.Checks["oom-score-adj"] = outcome(err)
	}
	if rep.SysResource {
		rep.Checks["oom-score-adj-lower"] = tryLowerOOMScore()
	}
}

// tryLowerOOMScore tries to set the process's OOM score adjustment to 0
// as a program the bundle runs could: dumpable again (exec makes it so),
// its /proc files its own. It leaves the process non-dumpable.
func tryLowerOOMScore() string {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 1, 0, 0, 0); err != nil {
		return "PR_SET_DUMPABLE: " + outcome(err)
	}
	defer unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	return outcome(os.WriteFile(oomScoreAdjFile, []byte("0"), 0))
}

func TestEnterDropsPrivileges(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	// t.TempDir is 0700 and root's: nobody can reach inside by path,
	// only through descriptors opened before the drop.
	base := t.TempDir()
	secret := filepath.Join(base, "secret")
	if err := os.WriteFile(secret, []byte("key"), 0o600); err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, name := range []string{"bundle", "other"} {
		d := filepath.Join(base, name)
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o755); err != nil { // umask
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "file"), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(d, "file"), 0o644); err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, d)
	}

	// Started as the server starts workers, the early constructor has
	// emptied the bounding set before Enter; started otherwise, Enter
	// does it all. Either way the result is the same.
	for _, as := range []string{"", "worker"} {
		t.Run("argv1="+as, func(t *testing.T) { checkEnterDrop(t, as, secret, dirs) })
	}
}

func checkEnterDrop(t *testing.T, as, secret string, dirs []string) {
	var rep enterReport
	runJSONChildAs(t, &rep, as, "enter-drop", "CT_SECRET="+secret, "CT_BUNDLE="+dirs[0], "CT_OTHER="+dirs[1])
	if early := rep.EarlyBnd == 0; early != (as == "worker") {
		t.Errorf("started with argv[1] %q: bounding set %x before Enter", as, rep.EarlyBnd)
	}
	if rep.Err != "" {
		t.Fatalf("Enter: %s", rep.Err)
	}
	if !rep.RTPrioRaised {
		t.Log("RLIMIT_RTPRIO could not be raised here (no CAP_SYS_RESOURCE): its zero after Enter proves little")
	}
	if rep.Resuid != [3]int{nobody, nobody, nobody} || rep.Resgid != [3]int{nobody, nobody, nobody} {
		t.Errorf("resuid %v resgid %v, want all %d", rep.Resuid, rep.Resgid, nobody)
	}
	if len(rep.Groups) != 0 {
		t.Errorf("supplementary groups %v, want none", rep.Groups)
	}
	if len(rep.Threads) < 2 {
		t.Errorf("only %d threads seen; the check wants a multi-threaded process", len(rep.Threads))
	}
	sawPre, sawC := false, false
	for _, st := range rep.Threads {
		sawPre = sawPre || st.TID == rep.PreTID
		sawC = sawC || st.TID == rep.CTID
		if st.UID != [4]int{nobody, nobody, nobody, nobody} || st.GID != [4]int{nobody, nobody, nobody, nobody} {
			t.Errorf("thread %d: uid %v gid %v", st.TID, st.UID, st.GID)
		}
		if len(st.Groups) != 0 {
			t.Errorf("thread %d: groups %v", st.TID, st.Groups)
		}
		if st.CapInh|st.CapPrm|st.CapEff|st.CapAmb|st.CapBnd != 0 {
			t.Errorf("thread %d: CapInh %x CapPrm %x CapEff %x CapAmb %x CapBnd %x, want all 0",
				st.TID, st.CapInh, st.CapPrm, st.CapEff, st.CapAmb, st.CapBnd)
		}
		if !st.NoNewPrivs {
			t.Errorf("thread %d: NoNewPrivs 0", st.TID)
		}
	}
	if !sawPre {
		t.Errorf("pre-existing thread %d not among %d threads", rep.PreTID, len(rep.Threads))
	}
	if rep.CTID != 0 && !sawC {
		t.Errorf("C thread %d not among %d threads", rep.CTID, len(rep.Threads))
	}
	if rep.PdeathMain != int(unix.SIGKILL) || rep.PdeathPre != int(unix.SIGKILL) {
		t.Errorf("parent-death signal: main thread %d, other thread %d; want %d on both",
			rep.PdeathMain, rep.PdeathPre, unix.SIGKILL)
	}
	want := map[string]string{
		"setresuid-root":        "EPERM",
		"rlimit-nice":           "0 0",                  // it cannot take its own nice level below the server's
		"rlimit-rtprio":         "0 0",                  // nor put its threads above every CFS thread
		"rlimit-nofile-max":     strconv.Itoa(MaxFiles), // nor fill the node's file table
		"rlimit-nofile-raise":   "EPERM",
		"sched-fifo":            "EPERM",
		"secret":                "EACCES",
		"parent-environ":        "EACCES",
		"other-before-landlock": "ok",
		"bundle-real-path":      "EACCES",
		// The OOM killer takes it before the server.
		"oom-score-adj": strconv.Itoa(OOMScoreAdj),
	}
	// Nor can it take that back: the kernel keeps a score written with
	// CAP_SYS_RESOURCE as the least it may set without, and Landlock
	// keeps /proc read-only.
	if rep.SysResource {
		want["oom-score-adj-lower"] = "EACCES"
	} else {
		t.Log("no CAP_SYS_RESOURCE here: the kernel's floor under the OOM score is not tested")
	}
	if rep.LandlockTest {
		if !rep.Applied {
			t.Error("RestrictFS after Enter reported not applied")
		}
		want["bundle-openat"] = "ok"
		want["bundle-proc-path"] = "ok"
		want["other-openat"] = "EACCES"
		want["oom-score-adj-landlocked"] = "EACCES"
	}
	for k, w := range want {
		if got := rep.Checks[k]; got != w {
			t.Errorf("%s: got %q, want %q", k, got, w)
		}
	}
}

// childEnterKeep enters without dropping and with a parent pid that is
// not its parent's.
func childEnterKeep() {
	rep := enterReport{MainTID: unix.Gettid()}
	err := Enter(Policy{ParentPID: os.Getppid() + 1})
	if err != nil {
		rep.Err = err.Error()
		rep.ParentGone = errors.Is(err, ErrParentGone)
	}
	fillIdentity(&rep)
	report(rep)
}

func TestEnterKeepIdentityWrongParent(t *testing.T) {
	t.Parallel()
	var rep enterReport
	runJSONChild(t, &rep, "enter-keep")
	if !rep.ParentGone {
		t.Fatalf("Enter with a wrong ParentPID: error %q, want ErrParentGone", rep.Err)
	}
	uid, gid := os.Getuid(), os.Getgid()
	if rep.Resuid != [3]int{uid, uid, uid} || rep.Resgid != [3]int{gid, gid, gid} {
		t.Errorf("identity changed without Drop: resuid %v resgid %v", rep.Resuid, rep.Resgid)
	}
	for _, st := range rep.Threads {
		if st.CapInh|st.CapPrm|st.CapEff|st.CapAmb != 0 {
			t.Errorf("thread %d: capabilities left: inh %x prm %x eff %x amb %x", st.TID, st.CapInh, st.CapPrm, st.CapEff, st.CapAmb)
		}
		if os.Geteuid() == 0 && st.CapBnd != 0 {
			t.Errorf("thread %d: bounding set %x left although root could drop it", st.TID, st.CapBnd)
		}
		if !st.NoNewPrivs {
			t.Errorf("thread %d: NoNewPrivs 0", st.TID)
		}
	}
	if rep.PdeathMain != int(unix.SIGKILL) {
		t.Errorf("parent-death signal %d, want %d", rep.PdeathMain, unix.SIGKILL)
	}
}

func TestEnterRejectsBadIdentity(t *testing.T) {
	t.Parallel()
	// These fail validation before Enter changes anything, so they can
	// run in the test process.
	for _, id := range []Identity{{0, 0}, {0, nobody}, {-1, nobody}, {nobody, -1}, {1 << 32, nobody}, {1<<32 - 1, nobody}} {
		if err := Enter(Policy{Drop: &id}); err == nil {
			t.Fatalf("Enter(Drop=%v) succeeded", id)
		} else if !strings.Contains(err.Error(), "uid 0") && !strings.Contains(err.Error(), "invalid identity") {
			t.Errorf("Enter(Drop=%v): unexpected error %v", id, err)
		}
	}
}

// childPdeathMiddle starts a grandchild through a Spawner, hands it the
// report pipe and exits when its stdin closes.
func childPdeathMiddle() {
	sp := NewSpawner()
	gc := selfCommand("pdeath-grandchild", fmt.Sprintf("CT_PARENT=%d", os.Getpid()))
	report := os.NewFile(3, "report")
	gc.ExtraFiles = []*os.File{report}
	if _, err := sp.Start(gc); err != nil {
		die("start grandchild: %v", err)
	}
	report.Close()
	_, _ = io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// childPdeathGrandchild enters (dropping to nobody when root, which
// clears the parent-death signal the Spawner armed), says so, and waits
// to be killed.
func childPdeathGrandchild() {
	rep := os.NewFile(3, "report")
	ppid, err := strconv.Atoi(os.Getenv("CT_PARENT"))
	if err != nil {
		die("CT_PARENT: %v", err)
	}
	var drop *Identity
	if os.Geteuid() == 0 {
		drop = &Identity{UID: nobody, GID: nobody}
	}
	if err := Enter(Policy{Drop: drop, ParentPID: ppid}); err != nil {
		fmt.Fprintf(rep, "error: %v\n", err)
		os.Exit(1)
	}
	fmt.Fprintf(rep, "ready %d\n", os.Getpid())
	pauseForever()
}

// Three generations: test -> middle -> grandchild. The grandchild holds
// the only write end of a pipe; once the middle exits, the grandchild's
// re-armed parent-death signal must kill it, which closes the pipe.
func TestEnterRearmsParentDeathSignal(t *testing.T) {
	t.Parallel()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	middle := childCommand(t, "pdeath-middle")
	middle.ExtraFiles = []*os.File{w}
	middle.Stderr = os.Stderr
	stdin, err := middle.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := startChild(middle); err != nil {
		t.Fatal(err)
	}
	w.Close()

	line := readLine(t, r)
	if !strings.HasPrefix(line, "ready ") {
		stdin.Close()
		middle.Wait()
		t.Fatalf("grandchild: %s", line)
	}
	gpid, _ := strconv.Atoi(strings.TrimPrefix(line, "ready "))

	stdin.Close() // the middle exits
	if err := middle.Wait(); err != nil {
		t.Fatalf("middle: %v", err)
	}
	waitEOF(t, r, gpid, "grandchild after its parent exited")
}

func TestLookupUser(t *testing.T) {
	t.Parallel()
	type lookupCase struct {
		in      string
		want    Identity
		wantErr string
	}
	tests := []lookupCase{
		{in: "65534:65534", want: Identity{65534, 65534}},
		{in: "0:0", want: Identity{0, 0}},
		{in: "1000:100", want: Identity{1000, 100}},
		{in: "4294967294:1", want: Identity{4294967294, 1}},
		{in: "", wantErr: `user ""`},
		{in: "4294967295:0", wantErr: "reserved"},
		{in: "-1:0", wantErr: `user "-1:0": uid`},
		{in: "1:", wantErr: `user "1:": gid`},
		{in: ":1", wantErr: "uid"},
		{in: "1:2:3", wantErr: "gid"},
		{in: "no-such-user-plover", wantErr: `user "no-such-user-plover"`},
	}
	// Names depend on the host's user database; test them where it has
	// the usual entries.
	if b, err := os.ReadFile("/etc/passwd"); err == nil {
		if strings.Contains(string(b), "\nnobody:x:65534:65534:") {
			tests = append(tests, lookupCase{in: "nobody", want: Identity{65534, 65534}},
				lookupCase{in: "65534", want: Identity{65534, 65534}})
		}
		if strings.HasPrefix(string(b), "root:x:0:0:") {
			tests = append(tests, lookupCase{in: "root", want: Identity{0, 0}})
		}
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := LookupUser(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("LookupUser(%q) = %v, %v; want error containing %q", tc.in, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("LookupUser(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			}
			// The "UID:GID" form round-trips.
			if back, err := LookupUser(got.String()); err != nil || back != got {
				t.Errorf("LookupUser(%q) = %v, %v; want %v", got.String(), back, err, got)
			}
		})
	}
}

func TestParseStatus(t *testing.T) {
	t.Parallel()
	text := "Name:\tx\nUid:\t0\t1\t2\t3\nGid:\t4\t5\t6\t7\nGroups:\t10 20 \n" +
		"CapInh:\t0000000000000000\nCapPrm:\t000001ffffffffff\nCapEff:\t0000000000000001\n" +
		"CapBnd:\t000001ffffffffff\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t0\n"
	st, err := parseStatus(42, text)
	if err != nil {
		t.Fatal(err)
	}
	if st.TID != 42 || st.UID != [4]int{0, 1, 2, 3} || st.GID != [4]int{4, 5, 6, 7} ||
		len(st.Groups) != 2 || st.Groups[1] != 20 || st.CapPrm != 0x1ffffffffff || st.CapEff != 1 ||
		st.CapBnd != 0x1ffffffffff || st.CapAmb != 0 || !st.NoNewPrivs {
		t.Errorf("parseStatus: %+v", st)
	}
	if _, err := parseStatus(1, "Uid:\t0\t0\t0\t0\n"); err == nil {
		t.Error("parseStatus accepted a status without capability lines")
	}
}
