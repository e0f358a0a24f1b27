package contain

import (
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

type threadCheck struct {
	TID    int
	New    bool   // the thread did not exist when RestrictFS was called
	Result string // outcome of reading the forbidden file on that thread
}

type landlockThreadsReport struct {
	Applied    bool
	MainTID    int
	PreTID     int
	CTID       int // thread started by C; 0 without cgo
	Checks     map[string]string
	NewThreads []threadCheck
}

// childLandlockThreads restricts itself to two directories (one named by
// path, one by /proc/self/fd/N) and probes the restriction from the
// thread that called RestrictFS, from a thread that existed before the
// call, and from threads created after it.
func childLandlockThreads() {
	allowed := os.Getenv("CT_ALLOWED")
	fdDir := os.Getenv("CT_FD_DIR")
	forbidden := os.Getenv("CT_FORBIDDEN")
	rep := landlockThreadsReport{MainTID: unix.Gettid(), Checks: map[string]string{}}

	// Root ignores file modes, so anything refused below was refused by
	// Landlock; this shows the file was readable to begin with.
	rep.Checks["before/forbidden"] = tryRead(forbidden)

	// A thread that exists before RestrictFS and does not take part in
	// it: a goroutine locked to its own thread, parked until told to
	// probe.
	preTID := make(chan int)
	probe := make(chan struct{})
	preResult := make(chan string)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		preTID <- unix.Gettid()
		<-probe
		preResult <- tryRead(forbidden)
	}()
	rep.PreTID = <-preTID

	if startCThread != nil {
		var err error
		if rep.CTID, err = startCThread(); err != nil {
			die("starting C thread: %v", err)
		}
	}

	before, err := taskIDs()
	if err != nil {
		die("listing threads: %v", err)
	}

	dir, err := os.Open(fdDir)
	if err != nil {
		die("%v", err)
	}
	procPath := fmt.Sprintf("/proc/self/fd/%d", dir.Fd())

	applied, err := RestrictFS(FSRules{RODirs: []string{allowed, procPath}})
	if err != nil {
		die("RestrictFS: %v", err)
	}
	rep.Applied = applied

	rep.Checks["main/forbidden"] = tryRead(forbidden)
	rep.Checks["main/allowed"] = tryRead(filepath.Join(allowed, "file"))
	rep.Checks["main/allowed-list"] = outcome(func() error { _, err := os.ReadDir(allowed); return err }())
	rep.Checks["main/allowed-create"] = tryCreate(filepath.Join(allowed, "new"))
	rep.Checks["main/fd-dir-real-path"] = tryRead(filepath.Join(fdDir, "file"))
	rep.Checks["main/fd-dir-openat"] = tryOpenat(int(dir.Fd()), "file")
	rep.Checks["main/fd-dir-proc-path"] = tryRead(procPath + "/file")
	rep.Checks["main/parent-of-allowed-list"] = outcome(func() error { _, err := os.ReadDir(filepath.Dir(allowed)); return err }())

	close(probe)
	rep.Checks["pre-thread/forbidden"] = <-preResult
	if openOnCThread != nil {
		rep.Checks["c-thread/forbidden"] = outcome(openOnCThread(forbidden))
		rep.Checks["c-thread/allowed"] = outcome(openOnCThread(filepath.Join(allowed, "file")))
	}

	// Threads after the call. Locking more goroutines at once than there
	// were threads before forces the runtime to create at least one new
	// thread; every one of them, new or reused, must be confined.
	n := len(before) + 1
	results := make(chan threadCheck)
	release := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			runtime.LockOSThread()
			// Exiting while locked ends the thread, so later
			// goroutines cannot reuse it.
			tid := unix.Gettid()
			results <- threadCheck{TID: tid, New: !before[tid], Result: tryRead(forbidden)}
			<-release
		})
	}
	for range n {
		rep.NewThreads = append(rep.NewThreads, <-results)
	}
	close(release)
	wg.Wait()
	report(rep)
}

func TestRestrictFSAllThreads(t *testing.T) {
	t.Parallel()
	requireLandlock(t)
	if os.Geteuid() != 0 {
		// Fine either way; as root the "before" check proves that only
		// Landlock stands in the way.
		t.Log("not root: file modes, not only Landlock, may refuse access")
	}
	base := t.TempDir()
	allowed := filepath.Join(base, "allowed")
	fdDir := filepath.Join(base, "bundle")
	for _, d := range []string{allowed, fdDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "file"), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	forbidden := filepath.Join(base, "secret")
	if err := os.WriteFile(forbidden, []byte("secret"), 0o644); err != nil {
		t.Fatal(err)
	}

	var rep landlockThreadsReport
	runJSONChild(t, &rep, "landlock-threads",
		"CT_ALLOWED="+allowed, "CT_FD_DIR="+fdDir, "CT_FORBIDDEN="+forbidden)

	if !rep.Applied {
		t.Fatalf("RestrictFS reported not applied on a kernel with Landlock ABI %d", LandlockABI())
	}
	if rep.PreTID == rep.MainTID {
		t.Fatalf("pre-existing probe ran on the restricting thread %d", rep.MainTID)
	}
	want := map[string]string{
		"before/forbidden":            "ok",
		"main/forbidden":              "EACCES",
		"main/allowed":                "ok",
		"main/allowed-list":           "ok",
		"main/allowed-create":         "EACCES",
		"main/fd-dir-real-path":       "ok",
		"main/fd-dir-openat":          "ok",
		"main/fd-dir-proc-path":       "ok",
		"main/parent-of-allowed-list": "EACCES",
		"pre-thread/forbidden":        "EACCES",
	}
	if rep.CTID != 0 {
		want["c-thread/forbidden"] = "EACCES"
		want["c-thread/allowed"] = "ok"
		if rep.CTID == rep.MainTID || rep.CTID == rep.PreTID {
			t.Errorf("C thread %d is not a thread of its own", rep.CTID)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if got := rep.Checks[k]; got != want[k] {
			t.Errorf("%s: got %q, want %q", k, got, want[k])
		}
	}
	newThreads := 0
	for _, c := range rep.NewThreads {
		if c.New {
			newThreads++
		}
		if c.TID == rep.MainTID {
			t.Errorf("probe goroutine ran on the main thread %d", c.TID)
		}
		if c.Result != "EACCES" {
			t.Errorf("thread %d (new=%v): reading the forbidden file: got %q, want EACCES", c.TID, c.New, c.Result)
		}
	}
	if newThreads == 0 {
		t.Errorf("no probe ran on a thread created after RestrictFS: %+v", rep.NewThreads)
	}
	t.Logf("Landlock ABI %d; restricted on thread %d; probed pre-existing Go thread %d, C thread %d, %d threads after (%d new)",
		LandlockABI(), rep.MainTID, rep.PreTID, rep.CTID, len(rep.NewThreads), newThreads)
}

type landlockDefaultReport struct {
	Applied bool
	Checks  map[string]string
}

// childLandlockDefault applies DefaultRules plus one bundle directory and
// probes what a worker needs and what it must not reach.
func childLandlockDefault() {
	bundle := os.Getenv("CT_BUNDLE")
	rules := DefaultRules()
	rules.RODirs = append(rules.RODirs, bundle)
	rep := landlockDefaultReport{Checks: map[string]string{}}
	rep.Checks["before/etc-passwd"] = tryRead("/etc/passwd")
	applied, err := RestrictFS(rules)
	if err != nil {
		die("RestrictFS: %v", err)
	}
	rep.Applied = applied
	rep.Checks["ld.so.cache"] = tryRead("/etc/ld.so.cache")
	rep.Checks["proc-self-status"] = tryRead("/proc/self/status")
	rep.Checks["sys-devices"] = outcome(func() error { _, err := os.ReadDir("/sys/devices/system/cpu"); return err }())
	rep.Checks["bundle"] = tryRead(filepath.Join(bundle, "lib.so"))
	rep.Checks["etc-passwd"] = tryRead("/etc/passwd")
	rep.Checks["tmp-create"] = tryCreate(filepath.Join(os.TempDir(), fmt.Sprintf("contain-test-%d", os.Getpid())))
	rep.Checks["dev-null-write"] = outcome(os.WriteFile("/dev/null", []byte("x"), 0))
	rep.Checks["dev-urandom"] = outcome(func() error {
		f, err := os.Open("/dev/urandom")
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = f.Read(make([]byte, 8))
		return err
	}())
	rep.Checks["bundle-create"] = tryCreate(filepath.Join(bundle, "new"))
	// Executing programs is not granted outside the library dirs.
	rep.Checks["exec-true"] = outcome(exec.Command("/bin/true").Run())
	report(rep)
}

func TestRestrictFSDefaultRules(t *testing.T) {
	t.Parallel()
	requireLandlock(t)
	if _, err := os.Stat("/etc/ld.so.cache"); err != nil {
		t.Skip("host has no /etc/ld.so.cache")
	}
	bundle := t.TempDir()
	if err := os.WriteFile(filepath.Join(bundle, "lib.so"), []byte("ELF"), 0o644); err != nil {
		t.Fatal(err)
	}
	var rep landlockDefaultReport
	runJSONChild(t, &rep, "landlock-default", "CT_BUNDLE="+bundle)
	if !rep.Applied {
		t.Fatal("RestrictFS reported not applied")
	}
	want := map[string]string{
		"before/etc-passwd": "ok",
		"ld.so.cache":       "ok",
		"proc-self-status":  "ok",
		"sys-devices":       "ok",
		"bundle":            "ok",
		"etc-passwd":        "EACCES",
		"tmp-create":        "EACCES",
		"dev-null-write":    "ok",
		"dev-urandom":       "ok",
		"bundle-create":     "EACCES",
		"exec-true":         "EACCES",
	}
	for k, w := range want {
		if got := rep.Checks[k]; !strings.Contains(got, w) {
			t.Errorf("%s: got %q, want %q", k, got, w)
		}
	}
}

func TestRestrictFSRejectsBadRules(t *testing.T) {
	t.Parallel()
	// Every case holds a bad path, so RestrictFS fails before it
	// restricts anything and can run in the test process itself.
	dir := t.TempDir()
	tests := []struct {
		name  string
		rules FSRules
		want  string
	}{
		{"relative dir", FSRules{RODirs: []string{"lib"}}, `"lib" is not absolute`},
		{"relative file", FSRules{RWFiles: []string{"dev/null"}}, `"dev/null" is not absolute`},
		{"missing dir", FSRules{RODirs: []string{dir, filepath.Join(dir, "nope")}}, "no such file"},
		{"missing rw file", FSRules{ROFiles: []string{dir}, RWFiles: []string{filepath.Join(dir, "nope")}}, "read-write file"},
		{"bad fd", FSRules{RODirs: []string{"/proc/self/fd/987654"}}, "no such file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			applied, err := RestrictFS(tc.rules)
			if err == nil || applied {
				t.Fatalf("RestrictFS(%v) = %v, %v; want an error", tc.rules, applied, err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not mention %q", err, tc.want)
			}
		})
	}
}

func TestDefaultRules(t *testing.T) {
	t.Parallel()
	r := DefaultRules()
	t.Logf("default rules: %v", r)
	all := slices.Concat(r.RODirs, r.ROFiles, r.RWDirs, r.RWFiles)
	for _, p := range all {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("rule path %s: %v", p, err)
		}
	}
	for _, p := range r.RODirs {
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			t.Errorf("RODirs holds non-directory %s", p)
		}
	}
	for _, p := range r.ROFiles {
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			t.Errorf("ROFiles holds directory %s", p)
		}
	}
	mustHave := map[string][]string{"/proc": r.RODirs, "/sys": r.RODirs, "/dev/null": r.RWFiles, "/dev/urandom": r.RWFiles}
	for p, list := range mustHave {
		if _, err := os.Stat(p); err == nil && !slices.Contains(list, p) {
			t.Errorf("%s missing from %v", p, list)
		}
	}
	for _, p := range []string{"/etc/ld.so.cache", "/etc/ld.so.conf"} {
		if _, err := os.Stat(p); err == nil && !slices.Contains(r.ROFiles, p) {
			t.Errorf("%s missing from ROFiles %v", p, r.ROFiles)
		}
	}
	if nv, _ := filepath.Glob("/dev/nvidia*"); len(nv) > 0 {
		for _, p := range nv {
			if !slices.Contains(r.RWFiles, p) {
				t.Errorf("%s missing from RWFiles %v", p, r.RWFiles)
			}
		}
	}
	seen := map[string]bool{}
	for _, p := range all {
		if seen[p] {
			t.Errorf("%s listed twice", p)
		}
		seen[p] = true
	}
}

func TestAddMPS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, shm := os.Stat("/dev/shm")
	for _, tc := range []struct {
		name, pipeDir string
		want          []string
	}{
		{"its directory", dir, []string{dir}},
		{"a directory that is not there", filepath.Join(dir, "gone"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r FSRules
			r.AddMPS(tc.pipeDir)
			want := tc.want
			if shm == nil {
				want = append(want, "/dev/shm")
			}
			if !slices.Equal(r.RWDirs, want) || len(r.RODirs)+len(r.ROFiles)+len(r.RWFiles) != 0 {
				t.Errorf("rules %v, want read-write directories %v and nothing else", r, want)
			}
		})
	}
	var r FSRules
	r.AddMPS("")
	if _, err := os.Stat(MPSPipeDefault); (err == nil) != slices.Contains(r.RWDirs, MPSPipeDefault) {
		t.Errorf("no pipe directory given: rules %v; %s exists: %v", r, MPSPipeDefault, err == nil)
	}
}

// childLandlockIPC restricts itself (CT_OPEN: "signals", "sockets", both
// or neither open) and reports whether it may still signal its parent,
// outside its domain, and connect to the abstract Unix socket CT_ABSTRACT
// its parent listens on.
func childLandlockIPC() {
	open := os.Getenv("CT_OPEN")
	applied, err := RestrictFS(FSRules{RODirs: []string{"/proc"},
		OpenSignals: strings.Contains(open, "signals"), OpenAbstractSockets: strings.Contains(open, "sockets")})
	if err != nil {
		die("RestrictFS: %v", err)
	}
	checks := map[string]string{"signal": outcome(unix.Kill(os.Getppid(), 0))}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		die("socket: %v", err)
	}
	checks["abstract"] = outcome(unix.Connect(fd, &unix.SockaddrUnix{Name: "@" + os.Getenv("CT_ABSTRACT")}))
	unix.Close(fd)
	report(map[string]any{"Applied": applied, "Checks": checks})
}

// Landlock scopes signals and abstract Unix sockets to the domain (ABI 6),
// so that a worker reaches neither the server nor another worker, even
// under their uid; FSRules.OpenSignals and OpenAbstractSockets leave one
// or the other open, for a client of a service outside (TestGPUContained's
// MPS question).
func TestRestrictFSScopesIPC(t *testing.T) {
	t.Parallel()
	if LandlockABI() < 6 {
		t.Skipf("Landlock ABI %d scopes no signals or abstract sockets (ABI 6, Linux 6.12)", LandlockABI())
	}
	name := fmt.Sprintf("plover-contain-test-%d", os.Getpid())
	ln, err := net.Listen("unix", "@"+name)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	for _, tc := range []struct {
		open             string
		signal, abstract string
	}{{"", "EPERM", "EPERM"}, {"signals", "ok", "EPERM"}, {"sockets", "EPERM", "ok"}, {"signals,sockets", "ok", "ok"}} {
		var rep struct {
			Applied bool
			Checks  map[string]string
		}
		runJSONChild(t, &rep, "landlock-ipc", "CT_OPEN="+tc.open, "CT_ABSTRACT="+name)
		if !rep.Applied {
			t.Fatal("RestrictFS reported not applied")
		}
		for what, want := range map[string]string{"signal": tc.signal, "abstract": tc.abstract} {
			if got := rep.Checks[what]; got != want {
				t.Errorf("open %q: %s to outside the domain: %q, want %q", tc.open, what, got, want)
			}
		}
	}
}

// MPSRunning looks for the control daemon's socket in
// $CUDA_MPS_PIPE_DIRECTORY: a socket there is a daemon, anything else or
// nothing is none.
func TestMPSRunning(t *testing.T) {
	for _, tc := range []struct {
		name    string
		make    func(path string) error
		running bool
	}{
		{"a socket", func(p string) error {
			ln, err := net.Listen("unix", p)
			if err == nil {
				t.Cleanup(func() { ln.Close() })
			}
			return err
		}, true},
		{"a plain file", func(p string) error { return os.WriteFile(p, nil, 0o644) }, false},
		{"nothing", func(string) error { return nil }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := tc.make(filepath.Join(dir, "control")); err != nil {
				t.Fatal(err)
			}
			t.Setenv("CUDA_MPS_PIPE_DIRECTORY", dir)
			if got := MPSRunning(); got != tc.running {
				t.Errorf("MPSRunning() = %v, want %v", got, tc.running)
			}
		})
	}
}
