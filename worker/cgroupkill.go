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

	"github.com/plover-run/plover/worker/contain"
)

// groupEmptyTime bounds how long emptyGroup waits for a group's processes
// to be gone.
const groupEmptyTime = 5 * time.Second

// emptyGroup kills every process in the cgroup at dir and returns once the
// group holds none: with cgroup v2's cgroup.kill where the kernel has it
// (5.14), else by killing each process cgroup.procs lists, again until it
// lists none (a process forking meanwhile adds one after the read; one on
// its way out is listed until its exit leaves the group: membersOf). The
// group reaches what a worker started however it left the worker's tree,
// all of it at once. A process that dies is out of the group before it is
// reaped, so this needs no reaper. Without cgroup.kill or pidfds it kills
// nothing (killMember).
func emptyGroup(dir string) error {
	if err := writeExisting(filepath.Join(dir, "cgroup.kill"), "1"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("kill cgroup %s: %w", dir, err)
	}
	ref, ok := groupRefOf(dir)
	if !ok || !contain.HavePidfds() {
		return nil // no cgroup; or no safe way to kill by cgroup.procs (killMember)
	}
	for end := time.Now().Add(groupEmptyTime); ; {
		pids, listed, err := membersOf(dir, ref)
		if err != nil || listed == 0 {
			return err
		}
		if time.Now().After(end) {
			return fmt.Errorf("cgroup %s: cgroup.procs still lists %d processes after %v of kills (those /proc places there: %v)", dir, listed, groupEmptyTime, pids)
		}
		for _, pid := range pids {
			killMember(pid, ref)
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

// membersOf lists the processes cgroup.procs names in the cgroup at dir
// that /proc confirms are in ref (a pid read there may have exited and
// been reused since), and how many it names in all; none where dir is
// gone. The two differ for a process on its way out: under cgroup v1 the
// kernel puts an exiting process in the root group in /proc/PID/cgroup
// while cgroup.procs still lists it and the group cannot be removed, for
// as long as its exit takes (milliseconds for a large address space).
func membersOf(dir string, ref groupRef) (pids []int, listed int, err error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("read cgroup %s: %w", dir, err)
	}
	for _, f := range strings.Fields(string(b)) {
		listed++
		if pid, err := strconv.Atoi(f); err == nil && ref.has(pid) {
			pids = append(pids, pid)
		}
	}
	return pids, listed, nil
}

// groupRef is a cgroup as /proc/PID/cgroup names it: its hierarchy (v2,
// or v1's mount options, which list its controllers) and its path there.
type groupRef struct {
	v2   bool
	opts []string
	path string
}

// groupRefOf finds the cgroup at dir among this process's mounts
// (groupRefIn).
func groupRefOf(dir string) (groupRef, bool) {
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return groupRef{}, false
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return groupRef{}, false
	}
	return groupRefIn(string(b), real)
}

// groupRefIn finds the cgroup at real (a path without symlinks) in the
// mountinfo text: the mount whose mount point is the longest above real
// (the last of equals: it hides the others). False where that is no
// cgroup mount.
func groupRefIn(mountinfo, real string) (groupRef, bool) {
	var ref groupRef
	ok, best := false, -1
	for _, line := range strings.Split(mountinfo, "\n") {
		pre, post, _ := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 3 {
			continue
		}
		mnt := unescapeMount(f[4])
		rel, in := strings.CutPrefix(real, strings.TrimSuffix(mnt, "/"))
		if !in || rel != "" && rel[0] != '/' || len(mnt) < best {
			continue
		}
		best = len(mnt)
		ref = groupRef{v2: g[0] == "cgroup2", opts: strings.Split(g[2], ","), path: filepath.Join("/", unescapeMount(f[3]), rel)}
		ok = g[0] == "cgroup2" || g[0] == "cgroup"
	}
	return ref, ok
}

// unescapeMount decodes the \ooo octal escapes the kernel writes in
// mountinfo's root and mount point fields (for space, tab, newline and
// backslash), as /proc/PID/cgroup and the file system name them unescaped.
func unescapeMount(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if c, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(c))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// has reports whether /proc/PID/cgroup puts pid in the group (listedIn).
func (r groupRef) has(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	return err == nil && r.listedIn(string(b))
}

// listedIn reports whether a /proc/PID/cgroup text puts its process in
// the group: the one line of its hierarchy (v2's "0::"; v1's, whose
// controllers the mount lists), its path exactly.
func (r groupRef) listedIn(text string) bool {
	path, ok := procGroup(text, func(v2 bool, ctls []string) bool {
		if v2 != r.v2 {
			return false
		}
		return v2 || len(ctls) > 0 && !slices.ContainsFunc(ctls, func(c string) bool { return !slices.Contains(r.opts, c) })
	})
	return ok && path == r.path
}

// procGroup is the path on the first line of a /proc/PID/cgroup text
// whose hierarchy is one want takes: v2's ("0::"), or a v1 one by the
// controllers its line lists (nil where it lists none). The kernel does
// not escape the path: one with a newline in it is on no line.
func procGroup(text string, want func(v2 bool, ctls []string) bool) (string, bool) {
	for _, line := range strings.Split(text, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		var ctls []string
		if parts[1] != "" {
			ctls = strings.Split(parts[1], ",")
		}
		if want(parts[0] == "0" && parts[1] == "", ctls) {
			return parts[2], true
		}
	}
	return "", false
}

// killMember kills pid through a pidfd, checking it is in the group once
// the pidfd holds it: a pid read from cgroup.procs may have been reaped
// and reused since. Without pidfds (before Linux 5.3) it does nothing: a
// check by pid then a kill by pid could kill a process that took the pid
// between them; what a worker left is still ended by its tree
// (contain.Tree.End).
func killMember(pid int, ref groupRef) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	if ref.has(pid) {
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
