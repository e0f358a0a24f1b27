package abi

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

// The CUDA target: NVIDIA GPUs, built with nvcc (or $NVCC). Its libraries
// stay mapped once loaded (see Target.Unloads).
func init() {
	RegisterTarget(Target{Name: TargetCUDA, Flags: cudaFlags, CheckBuild: checkCUDAArch,
		Command: func(b *Build, out, deps string) ([]string, error) {
			nv, err := findNVCC()
			if err != nil {
				return nil, err
			}
			return cudaCommand(nv, b, out, deps)
		}})
}

// cudaFlags are nvcc's fixed flags, -Wall -Wextra passed to its host
// compiler as hostFlags has them.
var cudaFlags = []string{"-x", "cu", "-shared", "-Xcompiler", "-fPIC", "-Xcompiler", "-Wall,-Wextra", "-O3"}

// defaultCUDAArch is build.cuda_arch when it names none.
var defaultCUDAArch = []string{"80", "90"}

var archRE = regexp.MustCompile(`^[0-9]{2,3}[a-z]?$`)

// checkCUDAArch checks build.cuda_arch: SM versions, as nvcc's -gencode
// takes them.
func checkCUDAArch(b *Build) error {
	for i, a := range b.CUDAArch {
		if !archRE.MatchString(a) {
			return &FieldError{fmt.Sprintf("build.cuda_arch[%d]", i), fmt.Sprintf("%q must be an SM version such as \"80\" or \"90\"", a)}
		}
	}
	return nil
}

// minCUDA is the first CUDA release whose nvcc compiles for an SM version.
// SM versions not listed are left to nvcc.
var minCUDA = map[string]release{
	"70": {9, 0}, "75": {10, 0},
	"80": {11, 0}, "86": {11, 1}, "87": {11, 4}, "89": {11, 8}, "90": {11, 8}, "90a": {12, 0},
	"100": {12, 8}, "100a": {12, 8}, "101": {12, 8}, "101a": {12, 8}, "120": {12, 8}, "120a": {12, 8},
}

// release is a major.minor release number; the zero value is unknown.
type release struct{ Major, Minor int }

func (v release) String() string { return fmt.Sprintf("%d.%d", v.Major, v.Minor) }
func (v release) less(w release) bool {
	return v.Major < w.Major || v.Major == w.Major && v.Minor < w.Minor
}
func (v release) known() bool { return v.Major > 0 }

// maxHostGCC is the newest g++ major an nvcc release accepts as its host
// compiler, 0 when Plover does not know (then nvcc itself decides).
func maxHostGCC(cuda release) int {
	if cuda.Major == 11 {
		return 11
	}
	return 0
}

// nvccInfo is what a CUDA build needs to know about the toolchain.
type nvccInfo struct {
	Path    string  // nvcc to run
	Version release // CUDA release; zero when nvcc --version did not say
	// HostGCC is the major version of the g++ nvcc uses by default (the
	// first on PATH), 0 when there is none or it did not say.
	HostGCC int
	// Fallback is a g++ nvcc accepts (for CUDA 11.x: g++-11, else g++-10 or
	// g++-9) when HostGCC is too new, or "" when there is none.
	Fallback string
}

var releaseRE = regexp.MustCompile(`release (\d+)\.(\d+)`)

// parseNVCCVersion reads the CUDA release from `nvcc --version`.
func parseNVCCVersion(out string) release {
	m := releaseRE.FindStringSubmatch(out)
	if m == nil {
		return release{}
	}
	maj, _ := strconv.Atoi(m[1])
	min, _ := strconv.Atoi(m[2])
	return release{maj, min}
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

// nvccDeps is the first CUDA release whose nvcc writes a dependency file
// while it compiles (-MMD); an older one, or one of a release unknown,
// is asked for none.
var nvccDeps = release{10, 2}

// nvccPhonyDeps is the first CUDA release whose nvcc is known to take -MP
// (11.8, the one checked here; it may be older): one between this and
// nvccDeps writes the list without the empty rules, since an option it
// does not know fails the build.
var nvccPhonyDeps = release{11, 8}

// cudaCommand is the CUDA build's command line, or why nvcc cannot build
// what the build section asks for.
func cudaCommand(nv *nvccInfo, b *Build, out, deps string) ([]string, error) {
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
	argv = append(argv, includeFlags(b)...)
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
	argv = append(argv, b.Sources...)
	if !nv.Version.known() || nv.Version.less(nvccDeps) {
		deps = ""
	}
	return append(argv, depFlags(b, deps, !nv.Version.less(nvccPhonyDeps))...), nil
}

func hasCCBin(flags []string) bool {
	for _, f := range flags {
		if f == "-ccbin" || f == "--compiler-bindir" || strings.HasPrefix(f, "-ccbin=") || strings.HasPrefix(f, "--compiler-bindir=") {
			return true
		}
	}
	return false
}
