package contain

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// MakeNonDumpable marks the server process non-dumpable. Workers run as
// the server's user when the server is not root, and the kernel lets a
// same-user process read /proc/<pid>/mem, /proc/<pid>/environ and friends
// (where secrets such as object-store credentials live) and ptrace it; a
// non-dumpable process's /proc files belong to root and ptrace access
// needs CAP_SYS_PTRACE. It also keeps those secrets out of core dumps.
//
// The flag is process-wide, survives until the next execve or credential
// change, and must be set by the server before it starts any worker.
func MakeNonDumpable() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("contain: prctl(PR_SET_DUMPABLE, 0): %w", err)
	}
	return nil
}

// ErrSpawnerClosed is returned by Spawner.Start after Close.
var ErrSpawnerClosed = errors.New("contain: spawner is closed")

// Spawner starts worker processes from one OS thread that lives as long
// as the Spawner.
//
// The kernel delivers a child's parent-death signal when the *thread*
// that forked it exits, not when the process does. Go retires OS threads
// whenever a goroutine that locked one exits, so a worker started from
// an arbitrary goroutine with Pdeathsig set could be SIGKILLed at a
// random moment while the server is alive and well. Funnelling every
// start through a goroutine that stays locked to its thread makes the
// parent-death signal mean what we want: the server is gone. The same
// thread is the one that may enter a worker's PID namespace to start it
// there (Contain): no other thread of the server ever does.
//
// A Spawner is safe for concurrent use; starts are serialised, which is
// cheap next to the fork/exec itself.
type Spawner struct {
	reqs      chan func()
	quit      chan struct{}
	exited    chan struct{}
	closeOnce sync.Once
	// tag names this Spawner's processes in their argv (--server-tag),
	// so that a later server can find what this one left (EndLeftovers).
	tag string

	mu   sync.Mutex
	mode Containment
	// On the Spawner's thread alone: its own PID namespace, to return to
	// after starting a worker in another; broken once that failed.
	ownNS  *os.File
	broken error
}

// NewSpawner starts the Spawner's thread. Call it once per server and
// keep the result for the server's lifetime. Its processes are contained
// as process groups until Contain says otherwise.
func NewSpawner() *Spawner {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("contain: no randomness for a server tag: %v", err))
	}
	s := &Spawner{
		reqs:   make(chan func()),
		quit:   make(chan struct{}),
		exited: make(chan struct{}),
		tag:    hex.EncodeToString(b[:]),
	}
	started := make(chan struct{})
	go s.loop(started)
	<-started
	return s
}

func (s *Spawner) loop(started chan<- struct{}) {
	// Never unlocked on purpose: when this goroutine returns, the
	// runtime ends the thread instead of reusing it, and the kernel
	// sends SIGKILL to every worker still running that was started here.
	// Locked, it also never clones a thread itself (the runtime asks its
	// template thread to), which it could not do inside another PID
	// namespace.
	runtime.LockOSThread()
	defer close(s.exited)
	close(started)
	for {
		select {
		case fn := <-s.reqs:
			fn()
		case <-s.quit:
			return
		}
	}
}

// onThread runs fn on the Spawner's thread.
func (s *Spawner) onThread(fn func()) error {
	done := make(chan struct{})
	select {
	case s.reqs <- func() { fn(); close(done) }:
		<-done
		return nil
	case <-s.quit:
		return ErrSpawnerClosed
	}
}

// WorkerArgs are the flags a worker it starts is given: the tag, and
// what its Containment asks of the worker (--pid-namespace: mount its
// namespace's /proc; --subreaper: keep what it starts under it).
func (s *Spawner) WorkerArgs() []string {
	args := []string{"--server-tag", s.tag}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch s.mode {
	case Subreaper:
		args = append(args, "--subreaper")
	case PIDNamespace:
		args = append(args, "--pid-namespace")
	}
	return args
}

// Start starts cmd from the Spawner's thread. It puts the worker in a
// session of its own, and so a process group of its own, so that
// KillGroup reaches whatever the tenant code forks, and arms SIGKILL as
// its parent-death signal, so that a server crash does not leave workers
// holding GPUs. A session, not only a group: setpgid joins only a group
// of the caller's session, so tenant code cannot join another worker's
// group or the server's and then renice or signal it as its own
// (setpriority PRIO_PGRP 0, which RestrictReach allows). Any other
// SysProcAttr field the caller set is kept; the caller's SysProcAttr
// value itself is not modified (it is copied).
//
// What it returns ends everything the process starts, whatever the
// Spawner's Containment: the caller kills it with the process and
// releases it once it reaped the process. As with exec.Cmd.Start, the
// caller must Wait for the process.
func (s *Spawner) Start(cmd *exec.Cmd) (*Tree, error) {
	if cmd == nil {
		return nil, errors.New("contain: Spawner.Start: nil command")
	}
	var attr syscall.SysProcAttr
	if cmd.SysProcAttr != nil {
		attr = *cmd.SysProcAttr
	}
	attr.Setsid, attr.Setpgid, attr.Pgid = true, false, 0 // setpgid on a session leader fails
	attr.Pdeathsig = syscall.SIGKILL
	cmd.SysProcAttr = &attr

	var t *Tree
	var err error
	if qerr := s.onThread(func() { t, err = s.start(cmd) }); qerr != nil {
		return nil, qerr
	}
	return t, err
}

// Close stops the Spawner and ends its thread. Workers it started that
// are still running then normally receive SIGKILL from the kernel (their
// parent thread died); the exception is the rare case where the
// goroutine happened to lock the process's main thread, which Go parks
// instead of ending. A server should therefore kill its workers with
// KillGroup before calling Close and treat the signal as a backstop.
// Close is idempotent and returns once the thread is gone.
func (s *Spawner) Close() {
	s.closeOnce.Do(func() { close(s.quit) })
	<-s.exited
}

// KillGroup sends SIGKILL to the process group led by pid and to pid
// itself. Tenant code may fork helpers; they stay in the worker's group
// (Spawner.Start gave it one) unless they call setpgid/setsid, so killing
// the group takes them down too, and the direct kill covers a worker that
// moved itself out of its group. A group or process that no longer
// exists is not an error: the goal, nothing left running, is reached.
//
// Call it before the worker is reaped (before cmd.Wait returns): after
// that the kernel may hand the pid number to an unrelated process.
func KillGroup(pid int) error {
	// kill(0) and kill(-1) signal our own group or every process we may
	// signal; never let a zero or unset pid get there.
	if pid <= 1 {
		return fmt.Errorf("contain: KillGroup: refusing pid %d", pid)
	}
	var errs []error
	if err := unix.Kill(-pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
		errs = append(errs, fmt.Errorf("contain: kill process group %d: %w", pid, err))
	}
	if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
		errs = append(errs, fmt.Errorf("contain: kill process %d: %w", pid, err))
	}
	return errors.Join(errs...)
}
