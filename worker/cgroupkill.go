package worker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// groupEmptyTime bounds how long emptyGroup waits for a group's processes
// to be gone.
const groupEmptyTime = 5 * time.Second

// emptyGroup kills every process in the cgroup at dir and returns once the
// group holds none: with cgroup v2's cgroup.kill where the kernel has it
// (5.14), else by killing each process cgroup.procs lists, again until it
// lists none (a process forking meanwhile adds one after the read). The
// group reaches what a worker started however it left the worker's tree,
// all of it at once. A process that dies is out of the group before it is
// reaped, so this needs no reaper.
func emptyGroup(dir string) error {
	if err := writeExisting(filepath.Join(dir, "cgroup.kill"), "1"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("kill cgroup %s: %w", dir, err)
	}
	for end := time.Now().Add(groupEmptyTime); ; {
		pids, err := groupMembers(dir)
		if err != nil || len(pids) == 0 {
			return err
		}
		if time.Now().After(end) {
			return fmt.Errorf("cgroup %s: processes %v left after %v of kills", dir, pids, groupEmptyTime)
		}
		for _, pid := range pids {
			killMember(pid, dir)
		}
		// The kernel takes a killed process out of the group as it exits:
		// a look a millisecond later, not a wait for a signal there is not.
		time.Sleep(time.Millisecond)
	}
}

// writeExisting writes text to the file at path, which it does not make:
// a cgroup file the kernel does not have is ErrNotExist, not a refused
// create.
func writeExisting(path, text string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(text)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// groupMembers lists the processes in the cgroup at dir that /proc places
// there too (in a test's fake hierarchy of plain files, none).
func groupMembers(dir string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read cgroup %s: %w", dir, err)
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil && inGroup(pid, dir) {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// inGroup reports whether /proc/PID/cgroup names the group at dir (a
// hierarchy's mount point, then the group's path).
func inGroup(pid int, dir string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && len(parts[2]) > 1 && strings.HasSuffix(dir, parts[2]) {
			return true
		}
	}
	return false
}

// killMember kills pid through a pidfd, checking it is in the group at dir
// once the pidfd holds it: a pid read from cgroup.procs may have been
// reaped and reused since.
func killMember(pid int, dir string) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		if errors.Is(err, unix.ENOSYS) && inGroup(pid, dir) {
			unix.Kill(pid, unix.SIGKILL) // before Linux 5.3: no better way
		}
		return
	}
	defer unix.Close(fd)
	if inGroup(pid, dir) {
		unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
	}
}

// groupNames bounds the names makeGroup tries for one worker.
const groupNames = 16

// errGroupsLeft: every name makeGroup tried for a worker was taken. It
// fails that worker's placement only.
var errGroupsLeft = errors.New("cgroups of earlier workers of the same pid left in the way")

// makeGroup makes a cgroup for a worker at base (its pid under the
// server's group) and returns where: a group of that name still there is
// one an earlier worker of the same pid left because Empty could not end
// a process in it (the groups of a worker that ended go before its reap),
// which emptying it again as the new worker starts would not end either,
// while the caller holds the worker's lock; so the group goes to the first
// free name of base-1, base-2, ....
func makeGroup(base string) (string, error) {
	dir := base
	for i := 1; i <= groupNames; i++ {
		err := os.Mkdir(dir, 0o755)
		if !errors.Is(err, os.ErrExist) {
			return dir, err
		}
		dir = fmt.Sprintf("%s-%d", base, i)
	}
	return "", fmt.Errorf("%s: %w", base, errGroupsLeft)
}
