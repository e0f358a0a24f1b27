package cli

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/plover-run/plover/fileutil"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/bundle"
)

// The compilers' fixed flags; plover init's Makefile and docs/author-loop.md
// spell the same lines. --exclude-libs keeps a statically linked C++ runtime
// (some toolchains link it so) from being exported by the bundle. -Wall
// -Wextra, as the repository's own Makefile builds its samples: a warning
// is often the bug (an unsigned loop counter tested >= 0 never ends).
var (
	hostFlags = []string{"-x", "c++", "-std=c++17", "-O2", "-shared", "-fPIC", "-Wl,--exclude-libs,libstdc++.a:libsupc++.a:libgcc_eh.a", "-Wall", "-Wextra"}
	cudaFlags = []string{"-x", "cu", "-shared", "-Xcompiler", "-fPIC", "-Xcompiler", "-Wall,-Wextra", "-O3"}
)

// Build section defaults (see abi.Build).
var (
	defaultInclude  = []string{"include"}
	defaultCUDAArch = []string{"80", "90"}
)

// minCUDA is the first CUDA release whose nvcc compiles for an SM version.
// SM versions not listed are left to nvcc.
var minCUDA = map[string]version{
	"70": {9, 0}, "75": {10, 0},
	"80": {11, 0}, "86": {11, 1}, "87": {11, 4}, "89": {11, 8}, "90": {11, 8}, "90a": {12, 0},
	"100": {12, 8}, "100a": {12, 8}, "101": {12, 8}, "101a": {12, 8}, "120": {12, 8}, "120a": {12, 8},
}

// version is a major.minor release number; the zero value is unknown.
type version struct{ Major, Minor int }

func (v version) String() string { return fmt.Sprintf("%d.%d", v.Major, v.Minor) }
func (v version) less(w version) bool {
	return v.Major < w.Major || v.Major == w.Major && v.Minor < w.Minor
}
func (v version) known() bool { return v.Major > 0 }

// maxHostGCC is the newest g++ major an nvcc release accepts as its host
// compiler, 0 when Plover does not know (then nvcc itself decides).
func maxHostGCC(cuda version) int {
	if cuda.Major == 11 {
		return 11
	}
	return 0
}

// nvccInfo is what a CUDA build needs to know about the toolchain.
type nvccInfo struct {
	Path    string  // nvcc to run
	Version version // CUDA release; zero when nvcc --version did not say
	// HostGCC is the major version of the g++ nvcc uses by default (the
	// first on PATH), 0 when there is none or it did not say.
	HostGCC int
	// Fallback is a g++ nvcc accepts (for CUDA 11.x: g++-11, else g++-10 or
	// g++-9) when HostGCC is too new, or "" when there is none.
	Fallback string
}

var releaseRE = regexp.MustCompile(`release (\d+)\.(\d+)`)

// parseNVCCVersion reads the CUDA release from `nvcc --version`.
func parseNVCCVersion(out string) version {
	m := releaseRE.FindStringSubmatch(out)
	if m == nil {
		return version{}
	}
	maj, _ := strconv.Atoi(m[1])
	min, _ := strconv.Atoi(m[2])
	return version{maj, min}
}

// gccMajor reads the major version from `g++ -dumpfullversion -dumpversion`.
func gccMajor(out string) int {
	out = strings.TrimSpace(out)
	if i := strings.IndexByte(out, '.'); i >= 0 {
		out = out[:i]
	}
	n, _ := strconv.Atoi(out)
	return n
}

// hostCompiler is the C++ compiler for host builds: $CXX, else g++.
func hostCompiler() (string, error) {
	cxx := os.Getenv("CXX")
	if cxx == "" {
		cxx = "g++"
	}
	path, err := exec.LookPath(cxx)
	if err != nil {
		return "", fmt.Errorf("%s not found: the host build needs a C++ compiler: install g++ (Debian/Ubuntu: apt-get install g++; Fedora: dnf install gcc-c++), or set $CXX to one", cxx)
	}
	if cxx == "g++" {
		return cxx, nil // shown by name in the printed command line
	}
	return path, nil
}

// findNVCC locates nvcc ($NVCC, else nvcc on PATH) and probes its release
// and the host compiler it would use.
func findNVCC() (*nvccInfo, error) {
	nvcc := os.Getenv("NVCC")
	if nvcc == "" {
		nvcc = "nvcc"
	}
	path, err := exec.LookPath(nvcc)
	if err != nil {
		hint := ""
		if _, err := os.Stat("/usr/local/cuda/bin/nvcc"); err == nil {
			hint = " (/usr/local/cuda/bin/nvcc exists: add /usr/local/cuda/bin to PATH)"
		}
		return nil, fmt.Errorf("%s not found%s: the cuda build needs the CUDA toolkit's nvcc: install the CUDA toolkit (https://developer.nvidia.com/cuda-downloads), "+
			"or on Debian 12 run `make install-nvcc` in the Plover repository (Debian's nvidia-cuda-toolkit, CUDA 11.8); or set $NVCC", nvcc, hint)
	}
	info := &nvccInfo{Path: nvcc}
	if nvcc != "nvcc" {
		info.Path = path
	}
	if out, err := exec.Command(path, "--version").Output(); err == nil {
		info.Version = parseNVCCVersion(string(out))
	}
	if out, err := exec.Command("g++", "-dumpfullversion", "-dumpversion").Output(); err == nil {
		info.HostGCC = gccMajor(string(out))
	}
	if max := maxHostGCC(info.Version); max > 0 {
		for v := max; v >= max-2 && info.Fallback == ""; v-- {
			if _, err := exec.LookPath(fmt.Sprintf("g++-%d", v)); err == nil {
				info.Fallback = fmt.Sprintf("g++-%d", v)
			}
		}
	}
	return info, nil
}

// hostCommand is the host build's command line, run in the function
// directory: sources and include directories are relative to it.
func hostCommand(cxx string, b *abi.Build, out string) []string {
	argv := append([]string{cxx}, hostFlags...)
	argv = append(argv, includes(b)...)
	argv = append(argv, b.CXXFlags...)
	argv = append(argv, "-o", out)
	return append(argv, b.Sources...)
}

// cudaCommand is the CUDA build's command line, or why nvcc cannot build
// what the build section asks for.
func cudaCommand(nv *nvccInfo, b *abi.Build, out string) ([]string, error) {
	archs := b.CUDAArch
	if len(archs) == 0 {
		archs = defaultCUDAArch
	}
	if nv.Version.known() {
		for _, a := range archs {
			if min, ok := minCUDA[a]; ok && nv.Version.less(min) {
				return nil, fmt.Errorf("build.cuda_arch %q: sm_%s needs CUDA %s or newer, and %s is CUDA %s: install a newer CUDA toolkit, or drop %q from build.cuda_arch in plover.json",
					a, a, min, nv.Path, nv.Version, a)
			}
		}
	}
	argv := append([]string{nv.Path}, cudaFlags...)
	argv = append(argv, includes(b)...)
	if max := maxHostGCC(nv.Version); max > 0 && !hasCCBin(b.NVCCFlags) && (nv.HostGCC == 0 || nv.HostGCC > max) {
		if nv.Fallback == "" {
			have := "there is no g++ on PATH"
			if nv.HostGCC > 0 {
				have = fmt.Sprintf("the default g++ is version %d", nv.HostGCC)
			}
			return nil, fmt.Errorf("nvcc %s (CUDA %s) accepts g++ up to version %d as its host compiler, %s, and there is no g++-%d: install g++-%d (Debian/Ubuntu: apt-get install g++-%d), or name a host compiler in plover.json: \"nvccflags\": [\"-ccbin\", \"/path/to/g++\"]",
				nv.Path, nv.Version, max, have, max, max, max)
		}
		argv = append(argv, "-ccbin", nv.Fallback)
	}
	for i, a := range archs {
		code := "sm_" + a
		if i == len(archs)-1 {
			code = "[sm_" + a + ",compute_" + a + "]" // PTX too: newer GPUs JIT it
		}
		argv = append(argv, "-gencode", "arch=compute_"+a+",code="+code)
	}
	argv = append(argv, b.NVCCFlags...)
	argv = append(argv, "-o", out)
	return append(argv, b.Sources...), nil
}

func includes(b *abi.Build) []string {
	inc := includeDirs(b)
	flags := make([]string, len(inc))
	for i, d := range inc {
		flags[i] = "-I" + d
	}
	return flags
}

// includeDirs is the build's include directories: build.include, or
// include/ when it names none.
func includeDirs(b *abi.Build) []string {
	if len(b.Include) == 0 {
		return defaultInclude
	}
	return b.Include
}

func hasCCBin(flags []string) bool {
	for _, f := range flags {
		if f == "-ccbin" || f == "--compiler-bindir" || strings.HasPrefix(f, "-ccbin=") || strings.HasPrefix(f, "--compiler-bindir=") {
			return true
		}
	}
	return false
}

// buildTargets turns --target into the targets to build.
func buildTargets(flagValue, manifestTarget string) ([]string, bool) {
	switch flagValue {
	case "":
		return []string{manifestTarget}, true
	case abi.TargetHost, abi.TargetCUDA:
		return []string{flagValue}, true
	case "all":
		return []string{abi.TargetHost, abi.TargetCUDA}, true
	}
	return nil, false
}

func buildCmd() *command {
	var target, out string
	var asJSON bool
	return &command{
		nargs: 1,
		name:  "build", summary: "compile a function source directory into bundle directories (build/host, build/cuda)",
		usage: "DIR [--target host|cuda|all] [--out OUT]",
		example: "  plover build saxpy                 # saxpy/build/host (plover.json's target)\n" +
			"  plover build saxpy --target all    # and saxpy/build/cuda, with nvcc\n" +
			"Compilers: $CXX (default g++) for host, $NVCC (default nvcc) for cuda.",
		flags: func(fs *flag.FlagSet) {
			fs.StringVar(&target, "target", "", "host, cuda or all (default: plover.json's target)")
			fs.StringVar(&out, "out", "", "put the bundles in OUT/<target> (default DIR/"+BuildDir+")")
			fs.BoolVar(&asJSON, "json", false, `print {"bundles": [{"target","dir","library","library_bytes","constants","constants_bytes"}]} to stdout (compiler lines stay on stderr)`)
		},
		run: func(_ *flag.FlagSet, args []string, env *Env) error {
			dir := args[0]
			m, err := bundle.ReadManifest(dir)
			if err != nil {
				return err
			}
			if m.Build == nil {
				return fmt.Errorf("%s has no \"build\" section, so plover build does not know the sources: add one, e.g. \"build\": {\"sources\": [\"kernel.cu\"]} (plover init writes it); a directory holding a library built otherwise deploys as it is",
					filepath.Join(dir, abi.ManifestFile))
			}
			targets, ok := buildTargets(target, m.Target)
			if !ok {
				return usagef(env, "build", "--target %q: want host, cuda or all", target)
			}
			if out == "" {
				out = filepath.Join(dir, BuildDir)
			}
			var built []*builtBundle
			for _, t := range targets {
				b, err := buildTarget(dir, out, t, m, env)
				if err != nil {
					return err
				}
				if !asJSON {
					fmt.Fprintf(env.Stdout, "built %s: %s (%s), %s", b.Dir, b.Library, humanBytes(b.LibraryBytes), abi.ManifestFile)
					if b.Constants != "" {
						fmt.Fprintf(env.Stdout, ", %s (%s)", b.Constants, humanBytes(b.ConstantsBytes))
					}
					fmt.Fprintln(env.Stdout)
				}
				built = append(built, b)
			}
			if asJSON {
				return printJSON(env.Stdout, map[string]any{"bundles": built})
			}
			return nil
		},
	}
}

// builtBundle is one bundle plover build made.
type builtBundle struct {
	Target         string `json:"target"`
	Dir            string `json:"dir"`
	Library        string `json:"library"`
	LibraryBytes   int64  `json:"library_bytes"`
	Constants      string `json:"constants,omitempty"`
	ConstantsBytes int64  `json:"constants_bytes,omitempty"`
}

// buildTarget compiles source directory dir for target into out/<target>
// and checks the bundle as plover deploy would.
func buildTarget(dir, out, target string, m *abi.Manifest, env *Env) (*builtBundle, error) {
	for i, s := range m.Build.Sources {
		if _, err := os.Stat(filepath.Join(dir, s)); err != nil {
			return nil, fmt.Errorf("build.sources[%d]: %w", i, err)
		}
	}
	var constants os.FileInfo
	if m.Constants != "" {
		fi, err := os.Stat(filepath.Join(dir, m.Constants))
		if err != nil {
			return nil, fmt.Errorf("constants %q (plover.json): %w", m.Constants, err)
		}
		constants = fi
	}
	bdir := filepath.Join(out, target)
	if err := os.MkdirAll(bdir, 0o755); err != nil {
		return nil, err
	}
	lib, err := outputPath(dir, filepath.Join(bdir, m.Library))
	if err != nil {
		return nil, err
	}
	var argv []string
	switch target {
	case abi.TargetHost:
		cxx, err := hostCompiler()
		if err != nil {
			return nil, err
		}
		argv = hostCommand(cxx, m.Build, lib)
	case abi.TargetCUDA:
		nv, err := findNVCC()
		if err != nil {
			return nil, err
		}
		if argv, err = cudaCommand(nv, m.Build, lib); err != nil {
			return nil, err
		}
	}
	fmt.Fprintln(env.Stderr, shellLine(argv))
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	warnings := &warningCounter{}
	// One writer for both: exec then copies through one pipe, so writes to
	// env.Stderr never race.
	both := io.MultiWriter(env.Stderr, warnings)
	cmd.Stdout, cmd.Stderr = both, both
	err = cmd.Run()
	if n := warnings.count(); n > 0 && err == nil {
		what := "1 compiler warning above; read it"
		if n > 1 {
			what = fmt.Sprintf("%d compiler warnings above; read them", n)
		}
		fmt.Fprintf(env.Stderr, "%s build of %s: %s: a warning is often the bug (a loop that never ends, a value never set)\n", target, dir, what)
	}
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("%s build of %s failed (%s: %v; its messages are above)", target, dir, filepath.Base(argv[0]), ee.ProcessState)
		}
		return nil, fmt.Errorf("%s build: %w", target, err)
	}
	// The bundle's manifest: the target set, the build section dropped (the
	// bundle holds no sources).
	bm := *m
	bm.Target, bm.Build = target, nil
	mb, err := manifestJSON(&bm)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(bdir, abi.ManifestFile), mb, 0o644); err != nil {
		return nil, err
	}
	if constants != nil {
		if err := fileutil.LinkOrCopy(filepath.Join(dir, m.Constants), filepath.Join(bdir, m.Constants)); err != nil {
			return nil, fmt.Errorf("constants: %w", err)
		}
	}
	if _, err := checkDir(bdir); err != nil {
		return nil, fmt.Errorf("the built bundle %s fails deploy's check: %w", bdir, err)
	}
	fi, err := os.Stat(filepath.Join(bdir, m.Library))
	if err != nil {
		return nil, err
	}
	b := &builtBundle{Target: target, Dir: bdir, Library: m.Library, LibraryBytes: fi.Size()}
	if constants != nil {
		b.Constants, b.ConstantsBytes = m.Constants, constants.Size()
	}
	return b, nil
}

// outputPath is path as the compiler, run in dir, should see it: relative
// when it lies inside dir (so the printed command line stays short).
func outputPath(dir, path string) (string, error) {
	absDir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	if rel, err := filepath.Rel(absDir, abs); err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return rel, nil
	}
	return abs, nil
}

// warningCounter counts the compiler's warnings in what it writes: lines
// with "warning:" (g++'s "file:line:col: warning: ...") or "warning #"
// (nvcc's front end), each distinct line once (nvcc repeats its own for
// every compilation pass).
type warningCounter struct {
	seen    map[string]bool
	partial []byte // the line being written
}

func (w *warningCounter) Write(p []byte) (int, error) {
	w.partial = append(w.partial, p...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			break
		}
		w.line(w.partial[:i])
		w.partial = w.partial[i+1:]
	}
	return len(p), nil
}

func (w *warningCounter) line(l []byte) {
	if bytes.Contains(l, []byte("warning:")) || bytes.Contains(l, []byte("warning #")) {
		if w.seen == nil {
			w.seen = map[string]bool{}
		}
		w.seen[string(bytes.TrimSpace(l))] = true
	}
}

func (w *warningCounter) count() int {
	if len(w.partial) > 0 {
		w.line(w.partial)
		w.partial = nil
	}
	return len(w.seen)
}
