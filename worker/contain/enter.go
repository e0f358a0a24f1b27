package contain

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
	"kernel.org/pub/linux/libs/security/libcap/psx"
)

// Identity is a numeric user and group. Workers switch to numbers, not
// names, so that the worker never has to consult NSS (which may need
// files or sockets it can no longer reach) after it starts.
type Identity struct{ UID, GID int }

// String gives the "UID:GID" form that LookupUser accepts, so the server
// can resolve a name once and hand the worker numbers on its command
// line.
func (id Identity) String() string { return fmt.Sprintf("%d:%d", id.UID, id.GID) }

// maxID is the largest valid id: (uid_t)-1 means "leave unchanged" to
// setresuid and friends, so accepting it would silently skip the switch.
const maxID = 1<<32 - 2

func validID(v int) bool { return v >= 0 && v <= maxID }

// LookupUser resolves the account a root server drops its workers to. It
// takes a user name ("nobody"), a numeric uid (its primary group comes
// from the user database), or explicit "UID:GID" numbers, which need no
// user database at all and suit minimal images. Errors name the user so a
// misconfigured flag is obvious.
func LookupUser(name string) (Identity, error) {
	fail := func(err error) (Identity, error) {
		return Identity{}, fmt.Errorf("contain: user %q: %w", name, err)
	}
	if name == "" {
		return fail(errors.New("empty user name"))
	}
	if us, gs, ok := strings.Cut(name, ":"); ok {
		uid, err := parseID(us)
		if err != nil {
			return fail(fmt.Errorf("uid: %w", err))
		}
		gid, err := parseID(gs)
		if err != nil {
			return fail(fmt.Errorf("gid: %w", err))
		}
		return Identity{UID: uid, GID: gid}, nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		if _, numErr := parseID(name); numErr == nil {
			u, err = user.LookupId(name)
		}
	}
	if err != nil {
		return fail(err)
	}
	uid, err := parseID(u.Uid)
	if err != nil {
		return fail(fmt.Errorf("uid %q: %w", u.Uid, err))
	}
	gid, err := parseID(u.Gid)
	if err != nil {
		return fail(fmt.Errorf("gid %q: %w", u.Gid, err))
	}
	return Identity{UID: uid, GID: gid}, nil
}

func parseID(s string) (int, error) {
	v, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("not a number in 0..%d: %q", maxID, s)
	}
	if !validID(int(v)) {
		return 0, fmt.Errorf("%d is reserved (it means 'unchanged' to the kernel)", v)
	}
	return int(v), nil
}

// MaxFiles is the most descriptors a worker's process may hold (its
// RLIMIT_NOFILE, hard): room for a function's instances (one socket each,
// max_instances at most 1,024) and a driver's device files. It bounds
// descriptors, not open files: a file mapped and closed stays open
// without one. A memory group (--worker-max-memory) charges each open
// file's kernel memory, which bounds them.
const MaxFiles = 4096

// Policy says what Enter does.
type Policy struct {
	// Drop is the identity a root worker switches to. Root bypasses the
	// kernel's ptrace-mode checks, so a root worker could read the
	// server's /proc/<pid>/environ and memory; nil keeps the current
	// identity, which is right when the server itself is not root.
	// Uid 0 is refused: it would drop nothing.
	Drop *Identity

	// ParentPID is the server's pid. Changing credentials clears the
	// parent-death signal, so Enter re-arms it and then checks the
	// parent is still this pid: if the server died before the re-arm the
	// worker has been reparented and would otherwise live on unwatched.
	// Zero skips the check.
	ParentPID int

	// Subreaper makes the worker a child subreaper: whatever its
	// descendants orphan (a daemon's double fork) is reparented to it
	// rather than to the machine's init, and so stays in its tree for the
	// server to end (Containment Subreaper).
	Subreaper bool
}

// ErrParentGone reports that the worker's parent is no longer the server
// it was started by; the worker must exit at once.
var ErrParentGone = errors.New("contain: parent process is gone")

// Enter strips the worker of every privilege before any tenant code can
// run: it makes the worker the OOM killer's first choice (OOMScoreAdj);
// with Drop set and running as root it leaves all supplementary
// groups and switches to Drop's gid and uid; in any case it empties the
// ambient, inheritable, permitted and effective capability sets and
// (where CAP_SETPCAP allows) the bounding set, so that neither this
// process nor anything it executes can regain capabilities; sets
// no_new_privs, which also lets RestrictFS install Landlock without
// privilege; re-arms SIGKILL as the parent-death signal, which the kernel
// cleared on the credential change; and verifies the parent. It then
// reads back the status of every thread, so a change that did not reach
// some thread is an error rather than a hole.
//
// All of this is irreversible, applies to every thread of the process,
// and must happen in the worker before any tenant library is loaded and
// before RestrictFS (Enter verifies through /proc/self/task/*/status,
// which a Landlock ruleset without /proc hides). On error the worker
// must exit (a partly applied Enter is not a state to continue in);
// ErrParentGone is wrapped when the parent died.
func Enter(p Policy) error {
	// Per-thread results below (capget, the parent-death signal) are
	// read on the thread that ran the broadcast calls first.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	if p.Drop != nil {
		if !validID(p.Drop.UID) || !validID(p.Drop.GID) {
			return fmt.Errorf("contain: enter: invalid identity %v", *p.Drop)
		}
		if p.Drop.UID == 0 {
			return errors.New("contain: enter: refusing to drop privileges to uid 0")
		}
	}

	// First, while a root worker still holds CAP_SYS_RESOURCE: written
	// with it, the score is also the least the process may later set
	// without it, so the bundle cannot take it back down.
	if err := beOOMVictim(); err != nil {
		return fmt.Errorf("contain: enter: %w", err)
	}

	// Ambient capabilities would survive the uid switch for programs we
	// execute; clearing them needs no privilege.
	if err := allThreadsPrctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0); err != nil {
		return fmt.Errorf("contain: enter: clear ambient capabilities: %w", err)
	}

	// The bounding set limits what an execve can ever grant (file
	// capabilities, setuid root). Dropping from it needs CAP_SETPCAP,
	// so it has to happen before the uid switch clears our capabilities.
	droppedBounding := false
	if has, err := hasEffectiveCap(unix.CAP_SETPCAP); err != nil {
		return fmt.Errorf("contain: enter: %w", err)
	} else if has {
		if err := dropBoundingSet(); err != nil {
			return fmt.Errorf("contain: enter: %w", err)
		}
		droppedBounding = true
	}

	switched := false
	if p.Drop != nil {
		var err error
		if switched, err = switchIdentity(*p.Drop); err != nil {
			return fmt.Errorf("contain: enter: %w", err)
		}
	}

	// setresuid away from root clears the capability sets by itself,
	// unless securebits say otherwise, and a non-root worker may still
	// hold file or inherited capabilities: clear them explicitly.
	if err := clearCapabilities(); err != nil {
		return fmt.Errorf("contain: enter: %w", err)
	}

	if err := lowerLimits(); err != nil {
		return fmt.Errorf("contain: enter: %w", err)
	}

	if err := allThreadsPrctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0); err != nil {
		return fmt.Errorf("contain: enter: prctl(PR_SET_NO_NEW_PRIVS): %w", err)
	}

	// Re-arm after the credential change, which cleared it. It is set
	// on every thread: the kernel signals the whole process if any
	// thread still carries it, so a thread ending later costs nothing.
	if err := allThreadsPrctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0); err != nil {
		return fmt.Errorf("contain: enter: prctl(PR_SET_PDEATHSIG): %w", err)
	}
	if sig, err := parentDeathSignal(); err != nil {
		return fmt.Errorf("contain: enter: prctl(PR_GET_PDEATHSIG): %w", err)
	} else if sig != int(unix.SIGKILL) {
		return fmt.Errorf("contain: enter: parent-death signal is %d after setting SIGKILL", sig)
	}

	if err := verifyThreads(p.Drop, switched, droppedBounding); err != nil {
		return fmt.Errorf("contain: enter: %w", err)
	}
	if p.Subreaper {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("contain: enter: prctl(PR_SET_CHILD_SUBREAPER): %w", err)
		}
	}

	// Only now, with the signal armed, does a parent check mean
	// anything: a parent dying from here on kills us.
	if p.ParentPID != 0 {
		if ppid := os.Getppid(); ppid != p.ParentPID {
			return fmt.Errorf("%w: parent is pid %d, expected %d", ErrParentGone, ppid, p.ParentPID)
		}
	}
	return nil
}

// switchIdentity changes groups and uids. The syscall package applies
// each call to every thread (through libc's setxid broadcast when cgo is
// linked, AllThreadsSyscall otherwise); golang.org/x/sys/unix is not
// guaranteed to, so it is not used here. It reports whether it switched
// (as opposed to finding a non-root process already at id).
func switchIdentity(id Identity) (bool, error) {
	if os.Geteuid() != 0 {
		// Without root we cannot switch; accept only the case where
		// there is nothing to switch.
		ruid, euid, suid := getresuid()
		rgid, egid, sgid := getresgid()
		if ruid == id.UID && euid == id.UID && suid == id.UID &&
			rgid == id.GID && egid == id.GID && sgid == id.GID {
			return false, nil
		}
		return false, fmt.Errorf("cannot switch to %v: not running as root (uid %d)", id, euid)
	}
	if err := syscall.Setgroups([]int{}); err != nil {
		return false, fmt.Errorf("setgroups([]): %w", err)
	}
	if err := syscall.Setresgid(id.GID, id.GID, id.GID); err != nil {
		return false, fmt.Errorf("setresgid(%d): %w", id.GID, err)
	}
	if err := syscall.Setresuid(id.UID, id.UID, id.UID); err != nil {
		return false, fmt.Errorf("setresuid(%d): %w", id.UID, err)
	}
	return true, nil
}

func getresuid() (r, e, s int) {
	var ru, eu, su uint32
	// Cannot fail with valid pointers.
	_, _, _ = unix.RawSyscall(unix.SYS_GETRESUID, uintptr(unsafe.Pointer(&ru)), uintptr(unsafe.Pointer(&eu)), uintptr(unsafe.Pointer(&su)))
	return int(ru), int(eu), int(su)
}

func getresgid() (r, e, s int) {
	var rg, eg, sg uint32
	_, _, _ = unix.RawSyscall(unix.SYS_GETRESGID, uintptr(unsafe.Pointer(&rg)), uintptr(unsafe.Pointer(&eg)), uintptr(unsafe.Pointer(&sg)))
	return int(rg), int(eg), int(sg)
}

// allThreadsPrctl runs prctl on every thread: options like no_new_privs,
// the parent-death signal and the capability sets are per thread.
func allThreadsPrctl(option int, arg2, arg3 uintptr) error {
	_, _, e := psx.Syscall6(unix.SYS_PRCTL, uintptr(option), arg2, arg3, 0, 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

func hasEffectiveCap(c int) (bool, error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false, fmt.Errorf("capget: %w", err)
	}
	return data[c/32].Effective&(1<<(uint(c)%32)) != 0, nil
}

// lastCap is the highest capability number the running kernel knows;
// dropping only the ones this Go package knows would leave newer ones.
func lastCap() (int, error) {
	if b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n >= 0 && n < 64 {
			return n, nil
		}
	}
	// No /proc/sys: probe; PR_CAPBSET_READ fails with EINVAL past the end.
	n := -1
	for c := 0; c < 64; c++ {
		if _, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0); err != nil {
			break
		}
		n = c
	}
	if n < 0 {
		return 0, errors.New("cannot determine the last capability")
	}
	return n, nil
}

func dropBoundingSet() error {
	last, err := lastCap()
	if err != nil {
		return err
	}
	for c := 0; c <= last; c++ {
		// Already out of this thread's set (the early constructor): out
		// of every thread's, as they all descend from it; verifyThreads
		// checks.
		if in, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0); err == nil && in == 0 {
			continue
		}
		if err := allThreadsPrctl(unix.PR_CAPBSET_DROP, uintptr(c), 0); err != nil {
			return fmt.Errorf("prctl(PR_CAPBSET_DROP, %d): %w", c, err)
		}
	}
	return nil
}

// clearCapabilities empties the inheritable, permitted and effective sets
// of every thread; capset only ever acts on the calling thread.
func clearCapabilities() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	_, _, e := psx.Syscall3(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0)
	if e != 0 {
		return fmt.Errorf("capset(0): %w", e)
	}
	return nil
}

func parentDeathSignal() (int, error) {
	var sig int32
	_, _, e := unix.RawSyscall(unix.SYS_PRCTL, unix.PR_GET_PDEATHSIG, uintptr(unsafe.Pointer(&sig)), 0)
	if e != 0 {
		return 0, e
	}
	return int(sig), nil
}

// threadStatus is the part of /proc/<pid>/task/<tid>/status that Enter
// checks.
type threadStatus struct {
	TID        int
	UID        [4]int // real, effective, saved, filesystem
	GID        [4]int
	Groups     []int
	CapInh     uint64
	CapPrm     uint64
	CapEff     uint64
	CapBnd     uint64
	CapAmb     uint64
	NoNewPrivs bool
}

func parseStatus(tid int, text string) (threadStatus, error) {
	st := threadStatus{TID: tid}
	seen := 0
	for _, line := range strings.Split(text, "\n") {
		key, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		fields := strings.Fields(val)
		var err error
		switch key {
		case "Uid", "Gid":
			if len(fields) != 4 {
				return st, fmt.Errorf("%s line %q", key, line)
			}
			dst := &st.UID
			if key == "Gid" {
				dst = &st.GID
			}
			for i, f := range fields {
				if dst[i], err = strconv.Atoi(f); err != nil {
					return st, fmt.Errorf("%s line %q", key, line)
				}
			}
			seen++
		case "Groups":
			for _, f := range fields {
				g, err := strconv.Atoi(f)
				if err != nil {
					return st, fmt.Errorf("Groups line %q", line)
				}
				st.Groups = append(st.Groups, g)
			}
			seen++
		case "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb":
			if len(fields) != 1 {
				return st, fmt.Errorf("%s line %q", key, line)
			}
			v, err := strconv.ParseUint(fields[0], 16, 64)
			if err != nil {
				return st, fmt.Errorf("%s line %q", key, line)
			}
			switch key {
			case "CapInh":
				st.CapInh = v
			case "CapPrm":
				st.CapPrm = v
			case "CapEff":
				st.CapEff = v
			case "CapBnd":
				st.CapBnd = v
			case "CapAmb":
				st.CapAmb = v
			}
			seen++
		case "NoNewPrivs":
			st.NoNewPrivs = len(fields) == 1 && fields[0] == "1"
			seen++
		}
	}
	if seen != 9 {
		return st, fmt.Errorf("status of thread %d lacks fields (found %d of 9)", tid, seen)
	}
	return st, nil
}

// threadStatuses reads the status of every thread of this process.
// Threads that end while we look are skipped.
func threadStatuses() ([]threadStatus, error) {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil, err
	}
	var out []threadStatus
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/self/task/" + e.Name() + "/status")
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) {
			continue
		}
		if err != nil {
			return nil, err
		}
		st, err := parseStatus(tid, string(b))
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	if len(out) == 0 {
		return nil, errors.New("no threads found in /proc/self/task")
	}
	return out, nil
}

func verifyThreads(drop *Identity, switched, droppedBounding bool) error {
	sts, err := threadStatuses()
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	for _, st := range sts {
		var bad []string
		if st.CapInh|st.CapPrm|st.CapEff|st.CapAmb != 0 {
			bad = append(bad, fmt.Sprintf("capabilities inh=%x prm=%x eff=%x amb=%x", st.CapInh, st.CapPrm, st.CapEff, st.CapAmb))
		}
		if droppedBounding && st.CapBnd != 0 {
			bad = append(bad, fmt.Sprintf("bounding set %x", st.CapBnd))
		}
		if !st.NoNewPrivs {
			bad = append(bad, "no_new_privs unset")
		}
		if drop != nil {
			for _, u := range st.UID {
				if u != drop.UID {
					bad = append(bad, fmt.Sprintf("uids %v", st.UID))
					break
				}
			}
			for _, g := range st.GID {
				if g != drop.GID {
					bad = append(bad, fmt.Sprintf("gids %v", st.GID))
					break
				}
			}
			// A non-root worker already at its identity keeps the
			// groups it was started with; one that switched has none.
			if switched && len(st.Groups) > 0 {
				bad = append(bad, fmt.Sprintf("supplementary groups %v", st.Groups))
			}
		}
		if len(bad) > 0 {
			return fmt.Errorf("verify: thread %d: %s", st.TID, strings.Join(bad, "; "))
		}
	}
	return nil
}

// lowerLimits lowers the worker's resource limits below what it inherits
// from the server, before tenant code runs (Enter).
func lowerLimits() error {
	// A worker may not take its own nice level below the one the server
	// gives it (its CPU weight): an RLIMIT_NICE above 0 would let it. The
	// server renices it by CAP_SYS_NICE, not by this limit. Nor may it
	// put its threads in a real-time class (SCHED_FIFO, SCHED_RR), above
	// every CFS thread and whatever weight it has, the server's included:
	// an RLIMIT_RTPRIO above 0, inherited from the server (a systemd
	// unit's LimitRTPRIO, limits.conf's rtprio), would let it.
	for _, r := range []struct {
		res  int
		name string
	}{{unix.RLIMIT_NICE, "RLIMIT_NICE"}, {unix.RLIMIT_RTPRIO, "RLIMIT_RTPRIO"}} {
		if err := unix.Setrlimit(r.res, &unix.Rlimit{}); err != nil {
			return fmt.Errorf("setrlimit(%s, 0): %w", r.name, err)
		}
	}
	// Nor hold more than MaxFiles descriptors a process: with the hard
	// limit it inherits (20,000 here; 524,288 or more under systemd) one
	// worker's processes filled the node's file table (a review's probe:
	// 2.46 million files; another function's cold start failed). Files
	// mapped and closed pass it: a memory group bounds those (MaxFiles).
	var files unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &files); err != nil {
		return fmt.Errorf("getrlimit(RLIMIT_NOFILE): %w", err)
	}
	files.Max = min(files.Max, MaxFiles)
	files.Cur = min(files.Cur, files.Max)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &files); err != nil {
		return fmt.Errorf("setrlimit(RLIMIT_NOFILE, %d): %w", files.Max, err)
	}
	return nil
}
