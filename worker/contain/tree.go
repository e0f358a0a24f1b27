package contain

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Containment is how a Spawner keeps everything a worker starts from
// outliving the worker: a process that forks, calls setsid and forks
// again leaves the worker's process group, which is all KillGroup reaches.
type Containment int32

const (
	// ProcessGroup: the worker's process group and parent-death signal
	// only (NewSpawner's, until Contain).
	ProcessGroup Containment = iota
	// PIDNamespace: each worker runs in a PID namespace of its own,
	// whose init (a process of the Spawner's, "EXE worker-init") the
	// server kills once the worker ended; the kernel then kills every
	// process left in the namespace, whatever session or group it made.
	PIDNamespace
	// Subreaper: each worker is a child subreaper (Policy.Subreaper), so
	// what it starts stays under it while it runs, and the server is
	// one too, so that what a worker leaves when it ends is the server's
	// child; the server kills and reaps those (Tree.Release).
	Subreaper
)

func (c Containment) String() string {
	switch c {
	case PIDNamespace:
		return "pid namespace"
	case Subreaper:
		return "subreaper"
	}
	return "process group"
}

// initReady is how long a namespace's init may take to say it is ready.
const initReady = 10 * time.Second

// strayTime bounds one look for strays (strays.go), a last resort: a
// look converges once every process it killed has exited, which a
// process stuck in an uninterruptible sleep may delay.
const strayTime = 10 * time.Second

// strayLook is how often Tree.Release looks for strays while it waits
// for a namespace's init to end.
const strayLook = 100 * time.Millisecond

// ours is every child that a Spawner of this process started (inits
// too), until released: never a stray, whichever Spawner looks. Its lock
// is held across a start and a look for strays, so that a child being
// started is never taken for one. Each pid is kept with its Tree: a
// worker is reaped before its Release, and a new one may have its pid by
// then, which that Release must not forget (the next look killed it).
var ours = struct {
	sync.Mutex
	pids map[int]*Tree
}{pids: map[int]*Tree{}}

// Containment reports what Contain chose.
func (s *Spawner) Containment() Containment {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mode
}

// Contain chooses how the Spawner keeps each process it starts together
// with everything that process starts, and applies it to the processes
// started from then on: call it once, before the first Start. With
// namespaces it tries a PID namespace per process (it needs
// CAP_SYS_ADMIN, and a binary built with cgo, whose constructor is the
// namespace's init); where that cannot be had, or without namespaces, it
// makes this process a child subreaper (Subreaper). It returns what it
// chose and, when that is not PIDNamespace, why not.
//
// Either way Tree.Release also ends strays: children of this process
// that it did not start (what a worker left, adopted as a subreaper; a
// process a worker made this one's child with CLONE_PARENT, which a
// namespace's init would otherwise wait for, reaped by no one, for ever).
func (s *Spawner) Contain(namespaces bool) (Containment, error) {
	why := errors.New("PID namespaces not asked for")
	if namespaces {
		if err := s.onThread(func() { why = s.probeNamespace() }); err != nil {
			return s.Containment(), err
		}
		if errors.Is(why, unix.EPERM) {
			why = fmt.Errorf("%w (a PID namespace needs CAP_SYS_ADMIN)", why)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if why == nil {
		s.mode = PIDNamespace
	} else if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return s.mode, fmt.Errorf("%w; and cannot be a child subreaper: %w", why, err)
	} else {
		s.mode = Subreaper
	}
	strayLooks.start.Do(func() { go endStrays() })
	return s.mode, why
}

// probeNamespace makes a PID namespace and starts in it what a worker
// does first (a process that mounts its namespace's /proc), on the
// Spawner's thread, as a start there would.
func (s *Spawner) probeNamespace() error {
	if s.ownNS == nil {
		f, err := os.Open("/proc/thread-self/ns/pid")
		if err != nil {
			return fmt.Errorf("the server's own PID namespace: %w", err)
		}
		s.ownNS = f
	}
	init, ns, err := s.startInit(true)
	if err != nil {
		return err
	}
	defer endInit(init)
	defer ns.Close()
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWPID); err != nil {
		return fmt.Errorf("setns: %w", err)
	}
	probe := exec.Command("/proc/self/exe", "worker-probe")
	probe.Env = []string{}
	var said strings.Builder
	probe.Stderr = &said
	probe.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	err = probe.Start()
	if lerr := s.leaveNamespace(); lerr != nil {
		if err == nil {
			probe.Process.Kill()
			probe.Wait()
		}
		return lerr
	}
	if err == nil {
		err = probe.Wait()
	}
	if err != nil {
		return fmt.Errorf("a process in a PID namespace: %w (%s)", err, strings.TrimSpace(said.String()))
	}
	return nil
}

// leaveNamespace puts the Spawner's thread back into the server's PID
// namespace for the processes it starts. Should that ever fail, every
// later start on this thread would land in a dead namespace: the
// Spawner refuses them instead.
func (s *Spawner) leaveNamespace() error {
	if err := unix.Setns(int(s.ownNS.Fd()), unix.CLONE_NEWPID); err != nil {
		s.broken = fmt.Errorf("contain: cannot return to the server's PID namespace: %w", err)
		return s.broken
	}
	return nil
}

// startInit starts the init of a new PID namespace and returns it with
// the namespace; with ready, once the init said it is ready (the probe:
// a binary without the init, built without cgo, would exit at once). The
// namespace is there from the clone on, so a worker's start need not
// wait for the init's exec.
func (s *Spawner) startInit(ready bool) (*exec.Cmd, *os.File, error) {
	// The server's own binary: it links this package, so its constructor
	// is the init (early.go), and it is there whatever the workers run.
	init := exec.Command("/proc/self/exe", "worker-init", "--parent", strconv.Itoa(os.Getpid()), "--server-tag", s.tag)
	if exe, err := os.Executable(); err == nil {
		init.Args[0] = exe // what ps shows
	}
	init.Env = []string{}
	init.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	var r *os.File
	if ready {
		var w *os.File
		var err error
		if r, w, err = os.Pipe(); err != nil {
			return nil, nil, err
		}
		defer r.Close()
		defer w.Close()
		init.Stdout = w
	}
	if err := init.Start(); err != nil {
		return nil, nil, fmt.Errorf("start a namespace's init: %w", err)
	}
	if ready {
		init.Stdout.(*os.File).Close()
		var b [1]byte
		r.SetReadDeadline(time.Now().Add(initReady))
		if n, err := r.Read(b[:]); n != 1 || b[0] != 'R' {
			endInit(init)
			return nil, nil, fmt.Errorf("a namespace's init did not start (a binary built without cgo has none): %v", err)
		}
	}
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/pid", init.Process.Pid))
	if err != nil {
		endInit(init)
		return nil, nil, fmt.Errorf("a namespace's init: %w", err)
	}
	return init, ns, nil
}

// endInit kills a namespace's init, and with it whatever is left in the
// namespace, and reaps it (the kernel lets it go once every process of
// the namespace is gone).
func endInit(init *exec.Cmd) {
	init.Process.Kill()
	init.Wait()
}

// start starts cmd as Containment says, on the Spawner's thread.
func (s *Spawner) start(cmd *exec.Cmd) (*Tree, error) {
	if s.broken != nil {
		return nil, s.broken
	}
	mode := s.Containment()
	ours.Lock()
	defer ours.Unlock()
	t := &Tree{s: s}
	if mode == PIDNamespace {
		init, err := s.startInNamespace(cmd)
		if err != nil {
			return nil, err
		}
		t.init = init
		ours.pids[init.Process.Pid] = t
	} else if err := cmd.Start(); err != nil {
		return nil, err
	}
	t.pid = cmd.Process.Pid
	ours.pids[t.pid] = t
	return t, nil
}

// startInNamespace starts cmd as the second process of a new PID
// namespace, whose init it returns: the worker is no init itself, so
// signals (its own abort(), a kill from the server) act on it as on any
// process, and the server sees it under the pid it always had. Its
// parent, the server, is outside the namespace, where getppid() gives 0.
func (s *Spawner) startInNamespace(cmd *exec.Cmd) (*exec.Cmd, error) {
	init, ns, err := s.startInit(false)
	if err != nil {
		return nil, fmt.Errorf("contain: %w", err)
	}
	defer ns.Close()
	// Go's own check after arming the parent-death signal compares
	// getppid() with the server's pid and kills the child when they
	// differ, as they always do here. The init's signal covers the
	// worker instead: the server's end kills the init and so the whole
	// namespace. Enter re-arms the worker's own once it runs.
	cmd.SysProcAttr.Pdeathsig = 0
	// A mount namespace of its own, for the /proc of its PID namespace
	// (early.go).
	cmd.SysProcAttr.Cloneflags |= syscall.CLONE_NEWNS
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWPID); err != nil {
		endInit(init)
		return nil, fmt.Errorf("contain: enter a PID namespace: %w", err)
	}
	err = cmd.Start()
	if lerr := s.leaveNamespace(); lerr != nil && err == nil {
		err = lerr
		cmd.Process.Kill()
		cmd.Wait()
	}
	if err != nil {
		endInit(init)
		return nil, err
	}
	return init, nil
}

// A Tree is a process a Spawner started together with everything it
// starts, as far as the Spawner's Containment reaches.
type Tree struct {
	s   *Spawner
	pid int

	mu       sync.Mutex
	init     *exec.Cmd // PIDNamespace: its namespace's init, ours until released
	released bool
}

// Root is the process everything the tree's process starts stays under
// while it runs: its PID namespace's init (which its orphans go to), else
// the process itself. Valid until Release.
func (t *Tree) Root() int {
	if t == nil {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.init != nil && !t.released {
		return t.init.Process.Pid
	}
	return t.pid
}

// Kill kills every process of the tree's PID namespace, the one Start
// started included (PIDNamespace); with other Containments it does
// nothing, and the caller's KillGroup is all there is until Release.
func (t *Tree) Kill() {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.init != nil && !t.released {
		t.init.Process.Kill()
	}
}

// End ends what the process left, once it exited and before the caller
// reaps it: with PIDNamespace it kills the namespace's init (the kernel
// then kills every process left in the namespace as the init exits, which
// End does not wait for); with Subreaper it ends the strays (Contain) with
// everything under them, and returns once each was sent SIGKILL and,
// unless strayTime ran out for it, in this look or an earlier one, exited
// (killStrays). The process's zombie holds its pid and process group until then: the seccomp reach
// filter lets what it started set limits and nice levels on it by those
// numbers, which must not be another process's while one of them runs.
// Release remains to be called after the reap.
func (t *Tree) End() {
	if t == nil {
		return
	}
	t.Kill()
	if t.s.Containment() == Subreaper {
		lookForStrays()
	}
}

// Release ends what the process left, once the caller reaped it: with
// PIDNamespace it kills the namespace's init (the kernel then kills every
// process left in the namespace) and reaps it; with Subreaper it ends the
// strays (Contain), among them whatever the process left. It returns once
// the init is reaped (the namespace is empty), or, with Subreaper, as End.
func (t *Tree) Release() {
	if t == nil {
		return
	}
	t.mu.Lock()
	if t.released {
		t.mu.Unlock()
		return
	}
	t.released = true
	t.mu.Unlock()
	s := t.s
	forget(t.pid, t)
	switch {
	case t.init != nil:
		t.init.Process.Kill()
		// The init ends once every process of its namespace is reaped,
		// a stray among them only by us.
		ended := make(chan struct{})
		go func() { t.init.Wait(); close(ended) }()
		for look := time.NewTicker(strayLook); ; {
			select {
			case <-ended:
				look.Stop()
				forget(t.init.Process.Pid, t)
				return
			case <-look.C:
				lookForStrays()
			}
		}
	case s.Containment() == Subreaper:
		lookForStrays()
	}
}

// forget drops t's reaped child pid from ours, unless a later start made
// the pid another tree's.
func forget(pid int, t *Tree) {
	ours.Lock()
	defer ours.Unlock()
	if ours.pids[pid] == t {
		delete(ours.pids, pid)
	}
}

// strayLooks asks endStrays, the one goroutine of the process that ends
// strays (so that no two reap the same pid), for a look.
var strayLooks = struct {
	start sync.Once
	ask   chan chan struct{}
}{ask: make(chan chan struct{})}

// lookForStrays has endStrays end the strays, and returns once it did.
func lookForStrays() {
	done := make(chan struct{})
	strayLooks.ask <- done
	<-done
}

func endStrays() {
	for done := range strayLooks.ask {
		killStrays()
		close(done)
	}
}

// childrenOf lists pid's children: from /proc/PID/task/*/children where
// the kernel has them, else by the parent pid of every process.
func childrenOf(pid int) []int {
	if haveChildrenFiles() {
		tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		var kids []int
		for _, t := range tasks {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, t.Name()))
			for _, f := range strings.Fields(string(b)) {
				if c, err := strconv.Atoi(f); err == nil {
					kids = append(kids, c)
				}
			}
		}
		return kids
	}
	var kids []int
	forEachProcess(func(c int) {
		if ppid, _, ok := statOf(c); ok && ppid == pid {
			kids = append(kids, c)
		}
	})
	return kids
}

var haveChildrenFiles = sync.OnceValue(func() bool {
	_, err := os.Stat(fmt.Sprintf("/proc/self/task/%d/children", os.Getpid()))
	return err == nil
})

// forEachProcess calls fn with the pid of every process in /proc.
func forEachProcess(fn func(pid int)) {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil && pid > 0 {
			fn(pid)
		}
	}
}

// statOf is the parent pid and start time (clock ticks after boot) of
// /proc/PID/stat.
func statOf(pid int) (ppid int, start uint64, ok bool) {
	f := statFields(pid)
	// f[0] is field 3 (state), so field N is f[N-3].
	if len(f) < 20 {
		return 0, 0, false
	}
	ppid, err1 := strconv.Atoi(f[1])
	start, err2 := strconv.ParseUint(f[19], 10, 64)
	return ppid, start, err1 == nil && err2 == nil
}

// statFields are the fields of /proc/PID/stat after the name (StatFields),
// or nil.
func statFields(pid int) []string {
	f, _ := StatFields(fmt.Sprintf("/proc/%d/stat", pid))
	return f
}

// StatFields are the fields of a /proc stat file (a process's or a
// thread's) from the third on, the state first: the command name, the
// second, is in parentheses and may hold anything, so they are those after
// its last ')'.
func StatFields(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return nil, fmt.Errorf("%s: no command name", path)
	}
	return strings.Fields(string(b[i+1:])), nil
}

// noNewPrivs reports whether /proc/PID/status says no_new_privs is set.
func noNewPrivs(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "NoNewPrivs:"); ok {
			return strings.TrimSpace(v) == "1"
		}
	}
	return false
}
