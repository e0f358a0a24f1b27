package contain

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/landlock-lsm/go-landlock/landlock"
	llsys "github.com/landlock-lsm/go-landlock/landlock/syscall"
)

// FSRules lists what a worker may still reach once RestrictFS has run;
// everything else is denied whatever the file permissions say, including
// for root. Paths must be absolute and exist when RestrictFS runs. Each
// is resolved once, following symbolic links and /proc/self/fd/N, and
// the rule sticks to the directory or file it resolved to: moving or
// re-linking things afterwards neither widens nor narrows it.
type FSRules struct {
	// RODirs: read files, list directories and execute files beneath.
	// Shared libraries are mapped executable through read access, so
	// this is what dlopen needs. A file named here is treated as in
	// ROFiles.
	RODirs []string
	// ROFiles: read (and execute) the file, or every file beneath a
	// directory without being able to list it.
	ROFiles []string
	// RWDirs: full access beneath, including creating and removing
	// entries and ioctl on device files, but not linking or renaming
	// across directories. A file named here is treated as in RWFiles.
	RWDirs []string
	// RWFiles: read, write, truncate and ioctl (device files such as
	// /dev/nvidia* need it) on the file, or on every file beneath a
	// directory.
	RWFiles []string
	// OpenSignals and OpenAbstractSockets leave signals and abstract Unix
	// sockets to processes outside the domain as they were (Landlock ABI
	// 6 scopes both): for a client of a service that checks on it by
	// signal or reaches it through an abstract socket. Nothing in a worker
	// sets them: they are TestGPUContained's, to tell whether a CUDA
	// client of an MPS server needs either (on an H200 under MPS every
	// worker ended about 150 ms after it connected, 2026-12-04).
	OpenSignals, OpenAbstractSockets bool
}

// llConfig is the newest Landlock ABI whose filesystem rights the rules
// above were written for (V5 to V8 have the same ones). V9 adds the
// right to connect to pathname UNIX sockets; handling it would cut a
// worker off such sockets without anyone noticing until a kernel upgrade,
// so adopting it is left to a conscious bump here. (How all threads get
// restricted does not depend on this: go-landlock uses the kernel's
// LANDLOCK_RESTRICT_SELF_TSYNC whenever the kernel has ABI 8, psx before.)
var llConfig = landlock.V8.BestEffort()

// LandlockABI reports the Landlock ABI version of the running kernel, 0
// where Landlock is missing or disabled, for logs and for deciding how
// much to trust RestrictFS on this host.
func LandlockABI() int {
	v, err := llsys.LandlockGetABIVersion()
	if err != nil || v < 0 {
		return 0
	}
	return v
}

// DefaultRules is what a worker needs to load native libraries and talk
// to an NVIDIA GPU: the system library directories and the dynamic
// loader's cache and configuration, read-only; /proc and /sys read-only
// (the CUDA driver and glibc read them; the kernel's ptrace checks, and
// Landlock's own, still keep other processes' /proc entries out of
// reach); /dev/null, /dev/zero, /dev/random and /dev/urandom and every
// /dev/nvidia* device read-write. Paths that do not exist on this host
// are left out, so the result can be given to RestrictFS as is, with the
// bundle's directory added.
func DefaultRules() FSRules {
	var r FSRules
	for _, d := range []string{"/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib", "/proc", "/sys"} {
		addExisting(&r.RODirs, &r.ROFiles, d)
	}
	addExisting(&r.RODirs, &r.ROFiles, "/etc/ld.so.cache")
	confs, _ := filepath.Glob("/etc/ld.so.conf*") // ld.so.conf and ld.so.conf.d
	for _, p := range confs {
		addExisting(&r.RODirs, &r.ROFiles, p)
	}
	for _, d := range []string{"/dev/null", "/dev/zero", "/dev/random", "/dev/urandom"} {
		addExisting(&r.RWFiles, &r.RWFiles, d)
	}
	// nvidia0.., nvidiactl, nvidia-uvm, nvidia-uvm-tools, nvidia-modeset
	// and the nvidia-caps directory (its device files become RW; the
	// directory itself cannot be written through a file rule).
	nv, _ := filepath.Glob("/dev/nvidia*")
	for _, p := range nv {
		addExisting(&r.RWFiles, &r.RWFiles, p)
	}
	return r
}

// MPSPipeDefault is where an MPS control daemon keeps its named pipes and
// sockets when CUDA_MPS_PIPE_DIRECTORY is not set.
const MPSPipeDefault = "/tmp/nvidia-mps"

// MPSRunning reports whether an MPS control daemon is listening: its pipe
// directory ($CUDA_MPS_PIPE_DIRECTORY, default MPSPipeDefault) holds its
// control socket.
func MPSRunning() bool {
	dir := os.Getenv("CUDA_MPS_PIPE_DIRECTORY")
	if dir == "" {
		dir = MPSPipeDefault
	}
	fi, err := os.Stat(filepath.Join(dir, "control"))
	return err == nil && fi.Mode()&os.ModeSocket != 0
}

// AddMPS lets a worker reach an MPS control daemon: its pipe directory
// (pipeDir; "": MPSPipeDefault), whose named pipes the CUDA driver opens,
// and /dev/shm, read-write. Without them cuInit's connection to the daemon
// fails and the driver goes on without MPS, saying nothing: the worker
// would make a context of its own, time-sliced against the others. Paths
// that do not exist are left out, as in DefaultRules.
func (r *FSRules) AddMPS(pipeDir string) {
	if pipeDir == "" {
		pipeDir = MPSPipeDefault
	}
	for _, p := range []string{pipeDir, "/dev/shm"} {
		addExisting(&r.RWDirs, &r.RWFiles, p)
	}
}

// addExisting appends p to dirs or files according to what it is, and
// drops it when it does not exist or is already there.
func addExisting(dirs, files *[]string, p string) {
	fi, err := os.Stat(p)
	if err != nil {
		return
	}
	dst := files
	if fi.IsDir() {
		dst = dirs
	}
	for _, q := range *dst {
		if q == p {
			return
		}
	}
	*dst = append(*dst, p)
}

// RestrictFS confines every thread of the process, and everything it
// starts later, to r for the rest of its life: tenant code loaded after
// it cannot read the server's configuration, other tenants' bundles,
// credentials or keys, whatever the Unix permissions, even as root. Where
// the kernel supports it, it also takes away TCP (bind, connect) and
// signals and abstract sockets to processes outside the domain. Landlock
// has no UDP rule: RestrictReach's seccomp filter is what keeps a worker
// off the network, on any ABI.
//
// It is best effort by kernel: where the kernel has no Landlock (or it is
// disabled at boot) it returns applied=false and no error, so the caller
// can log the weaker sandbox and go on; on older ABIs the rights the
// kernel does not know (truncate before ABI 3, device ioctl before ABI 5)
// stay unrestricted. Rules that name a missing or relative path are an
// error even then, so mistakes show up on every host.
//
// It sets no_new_privs on every thread (Landlock requires it for an
// unprivileged process). Each call stacks a further layer; access is the
// intersection of all layers, so it can only narrow. Call it after
// Enter, which needs /proc. (Before Landlock ABI 8 the all-thread
// mechanism, psx, lists /proc/<pid>/task after the first thread is
// restricted; go-landlock adds a rule for exactly that directory, so it
// works even when the rules leave out /proc.)
//
// Call it before dlopen runs tenant constructors, with the bundle's
// directory in RODirs; "/proc/self/fd/N" naming an open directory is
// fine and binds the rule to that directory.
func RestrictFS(r FSRules) (applied bool, err error) {
	var rules []landlock.Rule
	add := func(kind string, paths []string, dirRule, fileRule func(...string) landlock.FSRule) error {
		for _, p := range paths {
			if !filepath.IsAbs(p) {
				return fmt.Errorf("contain: landlock %s: path %q is not absolute", kind, p)
			}
			fi, err := os.Stat(p)
			if err != nil {
				return fmt.Errorf("contain: landlock %s: %w", kind, err)
			}
			if fi.IsDir() {
				rules = append(rules, dirRule(p))
			} else {
				rules = append(rules, fileRule(p))
			}
		}
		return nil
	}
	rwDirs := func(p ...string) landlock.FSRule { return landlock.RWDirs(p...).WithIoctlDev() }
	rwFiles := func(p ...string) landlock.FSRule { return landlock.RWFiles(p...).WithIoctlDev() }
	if err := errors.Join(
		add("read-only directory", r.RODirs, landlock.RODirs, landlock.ROFiles),
		add("read-only file", r.ROFiles, landlock.ROFiles, landlock.ROFiles),
		add("read-write directory", r.RWDirs, rwDirs, rwFiles),
		add("read-write file", r.RWFiles, rwFiles, rwFiles),
	); err != nil {
		return false, err
	}
	if LandlockABI() < 1 {
		return false, nil
	}
	// Restrict, not RestrictPaths: with no network rules every TCP bind and
	// connect is refused (ABI 4), and signals and abstract Unix sockets are
	// scoped to the domain (ABI 6), so a worker can signal neither the
	// server nor another worker, even under the same uid.
	cfg := llConfig
	if r.OpenSignals {
		cfg.Scoped &^= llsys.ScopeSignal
	}
	if r.OpenAbstractSockets {
		cfg.Scoped &^= llsys.ScopeAbstractUnixSocket
	}
	if err := cfg.Restrict(rules...); err != nil {
		return false, fmt.Errorf("contain: landlock: %w", err)
	}
	return true, nil
}

// String lists the rules, for logs.
func (r FSRules) String() string {
	var b strings.Builder
	for _, g := range []struct {
		name  string
		paths []string
	}{{"ro-dirs", r.RODirs}, {"ro-files", r.ROFiles}, {"rw-dirs", r.RWDirs}, {"rw-files", r.RWFiles}} {
		if len(g.paths) == 0 {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%s", g.name, strings.Join(g.paths, ","))
	}
	return b.String()
}
