package contain

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// A server's parent-death signal ends its workers when it dies, and with
// them (PIDNamespace) everything they started; what a worker started
// outlives a server that was killed where there is no namespace
// (Subreaper: the server adopts nothing once it is gone), and a namespace's
// init whose server died before it armed its signal lives on. A server
// leaves a record in its data directory (Spawner.Record) so that the next
// one finds them by the tag in their argv (EndLeftovers).

// leftoverWait bounds how long EndLeftovers waits for what it killed to
// be gone (a worker holding a GPU's memory, say).
const leftoverWait = 5 * time.Second

// Record writes path, the record EndLeftovers reads: this process's pid,
// its start time and the Spawner's tag.
func (s *Spawner) Record(path string) error {
	self := os.Getpid()
	_, start, ok := statOf(self)
	if !ok {
		return fmt.Errorf("contain: record %s: cannot read this process's start time", path)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".server-record-*")
	if err != nil {
		return fmt.Errorf("contain: record: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, err = fmt.Fprintf(tmp, "%d %d %s\n", self, start, s.tag)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("contain: record %s: %w", path, err)
	}
	return nil
}

// Exited reports whether process pid has ended: no such process, or one
// dead and not yet reaped (a zombie keeps its /proc entry and its start
// time until its parent waits for it, and a supervisor may reap late).
func Exited(pid int) bool {
	f := statFields(pid)
	return len(f) == 0 || f[0] == "Z" || f[0] == "X"
}

// ErrServerRunning is EndLeftovers's answer when the server that wrote
// the record still runs: nothing of its is touched.
var ErrServerRunning = errors.New("the server that wrote it still runs")

// EndLeftovers kills what the server that wrote the record at path left
// running: every process whose argv names it a worker or a namespace's
// init ("EXE worker ..." or "EXE worker-init ...") with that server's
// tag, which includes what a worker forked without exec. A random tag of
// 128 bits is in no other process's argv; each process is read and
// signalled through a pidfd, so a pid reused meanwhile is not signalled.
// It waits (a few seconds at most) for them to be gone and returns how
// many it killed. No record: nothing to do.
func EndLeftovers(path string) (int, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("contain: leftovers: %w", err)
	}
	var pid int
	var start uint64
	var tag string
	if n, _ := fmt.Sscanf(string(b), "%d %d %s", &pid, &start, &tag); n != 3 || len(tag) < 32 {
		return 0, fmt.Errorf("contain: leftovers: %s: not a server record: %.80q", path, b)
	}
	if _, now, ok := statOf(pid); ok && now == start && !Exited(pid) {
		return 0, fmt.Errorf("contain: leftovers: %s: %w (pid %d)", path, ErrServerRunning, pid)
	}
	var killed []int // pidfds, -1 where the kernel has none
	self := os.Getpid()
	forEachProcess(func(p int) {
		if p == self {
			return
		}
		if fd, ok := killTagged(p, tag); ok {
			killed = append(killed, fd)
		}
	})
	deadline := time.Now().Add(leftoverWait)
	for _, fd := range killed {
		if fd < 0 {
			continue
		}
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			ms := int(time.Until(deadline).Milliseconds())
			if _, err := unix.Poll(pfd, max(ms, 0)); err != unix.EINTR {
				break
			}
		}
		unix.Close(fd)
	}
	return len(killed), nil
}

// killTagged kills process pid if its argv is a worker's or a namespace
// init's with tag; it returns the pidfd it used (-1: none) and whether it
// killed.
func killTagged(pid int, tag string) (int, bool) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil && !errors.Is(err, unix.ENOSYS) {
		return -1, false // gone already
	}
	if err != nil {
		fd = -1
	}
	_, start, _ := statOf(pid)
	argv, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if !taggedArgv(argv, tag) {
		if fd >= 0 {
			unix.Close(fd)
		}
		return -1, false
	}
	if fd >= 0 {
		// The pidfd names the process whose argv was read (or one that
		// ended: ESRCH), never one that took its pid later.
		if unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) != nil {
			unix.Close(fd)
			return -1, false
		}
		return fd, true
	}
	// No pidfds (before Linux 5.3): the start time narrows the window.
	if _, again, ok := statOf(pid); !ok || again != start {
		return -1, false
	}
	return -1, unix.Kill(pid, unix.SIGKILL) == nil
}

// taggedArgv reports whether a NUL-separated argv is "EXE worker ..." or
// "EXE worker-init ..." with "--server-tag TAG".
func taggedArgv(cmdline []byte, tag string) bool {
	argv := strings.Split(string(bytes.TrimRight(cmdline, "\x00")), "\x00")
	if len(argv) < 2 || (argv[1] != "worker" && argv[1] != "worker-init") {
		return false
	}
	for i := 2; i < len(argv); i++ {
		if argv[i] == "--server-tag="+tag || (argv[i] == "--server-tag" && i+1 < len(argv) && argv[i+1] == tag) {
			return true
		}
	}
	return false
}
