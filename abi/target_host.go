package abi

import (
	"fmt"
	"os"
	"os/exec"
)

// The host target: the CPU, built with g++ (or $CXX); every node has it.
func init() {
	RegisterTarget(Target{Name: TargetHost, Flags: hostFlags, Unloads: true,
		Command: func(b *Build, out, deps string) ([]string, error) {
			cxx, err := hostCompiler()
			if err != nil {
				return nil, err
			}
			return hostCommand(cxx, b, out, deps), nil
		}})
}

// hostFlags are g++'s fixed flags. --exclude-libs keeps a statically
// linked C++ runtime (some toolchains link it so) from being exported by
// the bundle. -Wall -Wextra, as the repository's own Makefile builds its
// samples: a warning is often the bug (an unsigned loop counter tested >=
// 0 never ends).
var hostFlags = []string{"-x", "c++", "-std=c++17", "-O2", "-shared", "-fPIC", "-Wl,--exclude-libs,libstdc++.a:libsupc++.a:libgcc_eh.a", "-Wall", "-Wextra"}

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

// hostCommand is the host build's command line, run in the function
// directory: sources and include directories are relative to it.
func hostCommand(cxx string, b *Build, out, deps string) []string {
	argv := append([]string{cxx}, hostFlags...)
	argv = append(argv, includeFlags(b)...)
	argv = append(argv, b.CXXFlags...)
	argv = append(argv, "-o", out)
	argv = append(argv, b.Sources...)
	return append(argv, depFlags(b, deps, true)...)
}
