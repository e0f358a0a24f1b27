package worker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// groupEmptyTime bounds how long emptyGroup waits for a group's processes
// to be gone.
const groupEmptyTime = 5 * time.Second

// emptyGroup kills every process in the cgroup at dir but keep (0: none)
// and returns once the group holds none but keep: with cgroup v2's
// cgroup.kill where the kernel has it (5.14) and there is no keep, else by
// killing each process cgroup.procs lists, again until it lists none (a
// process forking meanwhile adds one after the read). The group reaches
// what a worker started however it left the worker's tree, all of it at
// once. A process that dies is out of the group before it is reaped, so
// this needs no reaper.
func emptyGroup(dir string, keep int) error {
	if keep == 0 {
		if err := writeExisting(filepath.Join(dir, "cgroup.kill"), "1"); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("kill cgroup %s: %w", dir, err)
		}
	}
	for end := time.Now().Add(groupEmptyTime); ; {
		pids, err := groupMembers(dir)
		pids = slices.DeleteFunc(pids, func(pid int) bool { return pid == keep })
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

// makeGroup makes the cgroup at dir for worker pid. One already there (a
// group of an earlier worker of the same pid, of this server or of one
// killed before it could remove it) is emptied first, of all but pid
// itself (which another controller's placement, in a hierarchy they share,
// may have put there already): whatever that earlier worker left must not
// join the new one's group, and the group is named by pid only.
func makeGroup(dir string, pid int) error {
	err := os.Mkdir(dir, 0o755)
	if errors.Is(err, os.ErrExist) {
		return emptyGroup(dir, pid)
	}
	return err
}
