package abi

import (
	"slices"
	"strings"
	"testing"
)

// testTarget is a target only these tests know: that it is one
// registration, here, and the manifest check and plover build's compiler
// line take it, is what a new device kind's target needs.
const testTarget = "test-fpga"

func init() {
	RegisterTarget(Target{Name: testTarget, Flags: []string{"--bitstream"},
		Command: func(b *Build, out, _ string) ([]string, error) {
			argv := append([]string{"fpgacc", "--bitstream"}, includeFlags(b)...)
			return append(append(argv, "-o", out), b.Sources...), nil
		},
		CheckBuild: func(b *Build) error {
			if slices.Contains(b.CXXFlags, "-mno-fpga") {
				return &FieldError{"build.cxxflags", "-mno-fpga leaves nothing for " + testTarget}
			}
			return nil
		}})
}

// A target registered in one file is taken everywhere targets are asked
// about: the manifest check, its build check, the order and the messages,
// and plover build's compiler line.
func TestRegisteredTarget(t *testing.T) {
	if got, want := Targets(), []string{TargetHost, TargetCUDA, testTarget}; !slices.Equal(got, want) {
		t.Fatalf("Targets() = %v, want %v (the host first, then by name)", got, want)
	}
	const build = `"build":{"sources":["k.cc"],"cxxflags":["-O3"]},"chain"`
	for _, tc := range []struct {
		name     string
		from, to string // replace from with to in valid
		wantErr  string // "" means valid
	}{
		{"the test target", `"target":"host"`, `"target":"` + testTarget + `"`, ""},
		{"an unknown target's error lists the registered ones", `"target":"host"`, `"target":"gpu"`,
			`target: "gpu" must be "host", "cuda" or "test-fpga"`},
		{"its build check runs on every build section", `"chain"`, strings.Replace(build, `"-O3"`, `"-mno-fpga"`, 1),
			"build.cxxflags: -mno-fpga leaves nothing for test-fpga"},
		{"the cuda target's build check", `"chain"`, strings.Replace(build, `"cxxflags":["-O3"]`, `"cuda_arch":["sm_80"]`, 1),
			`build.cuda_arch[0]: "sm_80" must be an SM version such as "80" or "90"`},
		{"a build both checks pass", `"chain"`, build, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseManifest(strings.NewReader(strings.Replace(valid, tc.from, tc.to, 1)))
			if got := errString(err); got != tc.wantErr {
				t.Fatalf("ParseManifest: %q, want %q", got, tc.wantErr)
			}
		})
	}
	tg, ok := TargetOf(testTarget)
	if !ok {
		t.Fatal("TargetOf does not find the test target")
	}
	argv, err := tg.Command(&Build{Sources: []string{"k.cc"}}, "build/test-fpga/k.so", "build/test-fpga/k.d")
	if got, want := strings.Join(argv, " "), "fpgacc --bitstream -Iinclude -o build/test-fpga/k.so k.cc"; err != nil || got != want {
		t.Fatalf("Command = %q, %v; want %q", got, err, want)
	}
}

// Registering a target with no name, no compiler line, or a name taken
// is a programming error.
func TestRegisterTargetRefuses(t *testing.T) {
	command := func(*Build, string, string) ([]string, error) { return nil, nil }
	for _, tc := range []struct {
		name string
		t    Target
	}{
		{"taken", Target{Name: TargetHost, Command: command}},
		{"no name", Target{Command: command}},
		{"no command", Target{Name: "tpu"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			RegisterTarget(tc.t)
		})
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func TestHostCommand(t *testing.T) {
	const fixed = "g++ -x c++ -std=c++17 -O2 -shared -fPIC -Wl,--exclude-libs,libstdc++.a:libsupc++.a:libgcc_eh.a -Wall -Wextra"
	tests := []struct {
		name string
		b    Build
		deps string
		want string
	}{
		{"defaults", Build{Sources: []string{"k.cu"}}, "", fixed + " -Iinclude -o build/host/k.so k.cu"},
		{"includes, flags, two sources", Build{Sources: []string{"a.cu", "src/b.cu"}, Include: []string{"inc", "third_party/x"}, CXXFlags: []string{"-march=native", "-DN=4"}}, "",
			fixed + " -Iinc -Ithird_party/x -march=native -DN=4 -o build/host/k.so a.cu src/b.cu"},
		// -MP: the generated Makefile includes the file, and a header deleted
		// since must not stop make.
		{"a dependency file", Build{Sources: []string{"k.cu"}}, "build/host/k.d", fixed + " -Iinclude -o build/host/k.so k.cu -MMD -MP -MF build/host/k.d"},
		// Each source's compilation would write the file again.
		{"no dependency file for two sources", Build{Sources: []string{"a.cu", "b.cu"}}, "build/host/k.d", fixed + " -Iinclude -o build/host/k.so a.cu b.cu"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := strings.Join(hostCommand("g++", &tt.b, "build/host/k.so", tt.deps), " "); got != tt.want {
				t.Fatalf("got  %s\nwant %s", got, tt.want)
			}
		})
	}
}

func TestCUDACommand(t *testing.T) {
	const fixed = "nvcc -x cu -shared -Xcompiler -fPIC -Xcompiler -Wall,-Wextra -O3 -Iinclude"
	const gencode = "-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=[sm_90,compute_90]"
	const tail = "-o out/k.so k.cu"
	src := []string{"k.cu"}
	cuda118 := nvccInfo{Path: "nvcc", Version: release{11, 8}, HostGCC: 11}
	withGCC := func(nv nvccInfo, gcc int, fallback string) *nvccInfo {
		nv.HostGCC, nv.Fallback = gcc, fallback
		return &nv
	}
	tests := []struct {
		name string
		nv   *nvccInfo
		b    Build
		want string // the command line, or with err: a part of the error
		err  bool
	}{
		{"defaults, CUDA 11.8, g++ 11", &cuda118, Build{Sources: src}, fixed + " " + gencode + " " + tail, false},
		{"CUDA 12.4, g++ 13: no -ccbin", &nvccInfo{Path: "nvcc", Version: release{12, 4}, HostGCC: 13}, Build{Sources: src}, fixed + " " + gencode + " " + tail, false},
		{"unknown release: no checks", &nvccInfo{Path: "/opt/nvcc", HostGCC: 14}, Build{Sources: src},
			"/opt/nvcc -x cu -shared -Xcompiler -fPIC -Xcompiler -Wall,-Wextra -O3 -Iinclude " + gencode + " " + tail, false},
		{"g++ 12 with g++-11 present", withGCC(cuda118, 12, "g++-11"), Build{Sources: src}, fixed + " -ccbin g++-11 " + gencode + " " + tail, false},
		{"no g++ on PATH, g++-11 present", withGCC(cuda118, 0, "g++-11"), Build{Sources: src}, fixed + " -ccbin g++-11 " + gencode + " " + tail, false},
		{"g++ 12 and no g++-11", withGCC(cuda118, 12, ""), Build{Sources: src}, "accepts g++ up to version 11 as its host compiler, the default g++ is version 12, and there is no g++-11", true},
		{"the author's -ccbin wins", withGCC(cuda118, 12, ""), Build{Sources: src, NVCCFlags: []string{"-ccbin", "/usr/bin/g++-10"}},
			fixed + " " + gencode + " -ccbin /usr/bin/g++-10 " + tail, false},
		{"one arch gets PTX", &cuda118, Build{Sources: src, CUDAArch: []string{"86"}},
			fixed + " -gencode arch=compute_86,code=[sm_86,compute_86] " + tail, false},
		{"three archs, includes, flags", &cuda118, Build{Sources: []string{"a.cu", "b.cu"}, Include: []string{"inc"}, CUDAArch: []string{"75", "80", "90"}, NVCCFlags: []string{"-lineinfo"}},
			"nvcc -x cu -shared -Xcompiler -fPIC -Xcompiler -Wall,-Wextra -O3 -Iinc -gencode arch=compute_75,code=sm_75 " + gencode + " -lineinfo -o out/k.so a.cu b.cu", false},
		{"sm_90 on CUDA 11.7", &nvccInfo{Path: "nvcc", Version: release{11, 7}, HostGCC: 11}, Build{Sources: src}, `sm_90 needs CUDA 11.8 or newer, and nvcc is CUDA 11.7`, true},
		{"sm_80 on CUDA 10.2", &nvccInfo{Path: "nvcc", Version: release{10, 2}, HostGCC: 8}, Build{Sources: src}, `sm_80 needs CUDA 11.0 or newer`, true},
		{"sm_100 on CUDA 12.4", &nvccInfo{Path: "nvcc", Version: release{12, 4}}, Build{Sources: src, CUDAArch: []string{"90", "100"}}, `sm_100 needs CUDA 12.8 or newer`, true},
		{"an arch Plover does not know goes to nvcc", &nvccInfo{Path: "nvcc", Version: release{12, 4}}, Build{Sources: src, CUDAArch: []string{"110"}},
			fixed + " -gencode arch=compute_110,code=[sm_110,compute_110] " + tail, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			argv, err := cudaCommand(tt.nv, &tt.b, "out/k.so", "")
			switch {
			case tt.err && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("err %v, argv %v; want an error with %q", err, argv, tt.want)
			case !tt.err && err != nil:
				t.Fatal(err)
			case !tt.err && strings.Join(argv, " ") != tt.want:
				t.Fatalf("got  %s\nwant %s", strings.Join(argv, " "), tt.want)
			}
		})
	}
}

// nvcc writes the dependency file from CUDA 10.2 on, one source at a time,
// with -MP's empty rules from the release known to take it.
func TestCUDACommandDeps(t *testing.T) {
	for _, tt := range []struct {
		name    string
		version release
		sources []string
		want    string // the command line's end; "": no -MMD
	}{
		{"CUDA 12.4", release{12, 4}, []string{"k.cu"}, " -o out/k.so k.cu -MMD -MP -MF out/k.d"},
		{"CUDA 11.8", release{11, 8}, []string{"k.cu"}, " -o out/k.so k.cu -MMD -MP -MF out/k.d"},
		{"CUDA 11.7 is not known to take -MP", release{11, 7}, []string{"k.cu"}, " -o out/k.so k.cu -MMD -MF out/k.d"},
		{"CUDA 10.2", release{10, 2}, []string{"k.cu"}, " -o out/k.so k.cu -MMD -MF out/k.d"},
		{"CUDA 10.1 has no -MMD", release{10, 1}, []string{"k.cu"}, ""},
		{"an unknown release may not", release{}, []string{"k.cu"}, ""},
		{"two sources", release{11, 8}, []string{"k.cu", "l.cu"}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			nv := &nvccInfo{Path: "nvcc", Version: tt.version, HostGCC: 8}
			argv, err := cudaCommand(nv, &Build{Sources: tt.sources, CUDAArch: []string{"70"}}, "out/k.so", "out/k.d")
			if err != nil {
				t.Fatal(err)
			}
			line := strings.Join(argv, " ")
			if tt.want == "" && strings.Contains(line, "-MMD") || tt.want != "" && !strings.HasSuffix(line, tt.want) {
				t.Fatalf("%s: want it to end %q", line, tt.want)
			}
		})
	}
}

func TestToolVersions(t *testing.T) {
	out := "nvcc: NVIDIA (R) Cuda compiler driver\nCopyright (c) 2005-2022 NVIDIA Corporation\nBuilt on Wed_Sep_21_10:33:58_PDT_2022\n" +
		"Cuda compilation tools, release 11.8, V11.8.89\nBuild cuda_11.8.r11.8/compiler.31833905_0\n"
	if v := parseNVCCVersion(out); v != (release{11, 8}) {
		t.Errorf("nvcc 11.8 read as %v", v)
	}
	if v := parseNVCCVersion("Cuda compilation tools, release 12.10, V12.10.3"); v != (release{12, 10}) || !(release{12, 9}).less(v) {
		t.Errorf("nvcc 12.10 read as %v", v)
	}
	if v := parseNVCCVersion("garbage"); v.known() {
		t.Errorf("garbage read as %v", v)
	}
	for in, want := range map[string]int{"12.2.0\n": 12, "11\n": 11, "9.4.0": 9, "": 0, "clang": 0} {
		if got := gccMajor(in); got != want {
			t.Errorf("gccMajor(%q) = %d, want %d", in, got, want)
		}
	}
}
