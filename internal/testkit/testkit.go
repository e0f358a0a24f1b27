// Package testkit builds bundles for Plover's tests: it compiles C/C++
// sources into shared libraries with the system compiler and lays out bundle
// directories.
package testkit

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/plover-run/plover/abi"
)

// Root is the repository root.
func Root() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// KernelsSource is the test kernel source with entries echo, add_one,
// count, add_constants, fail and sleep_ms.
func KernelsSource() string { return filepath.Join(Root(), "internal", "testkit", "kernels.cu") }

// BuildLib compiles src (C++ unless args say otherwise) into dir/name as a
// host-target shared library. The test is skipped when no C++ compiler is
// installed; a compile error fails it.
func BuildLib(t testing.TB, src, dir, name string, args ...string) string {
	t.Helper()
	cxx := os.Getenv("CXX")
	if cxx == "" {
		cxx = "g++"
	}
	if _, err := exec.LookPath(cxx); err != nil {
		t.Skipf("no C++ compiler (%s) to build test bundles: %v", cxx, err)
	}
	out := filepath.Join(dir, name)
	// args first, so that an -I there (ABI1Include) wins over the ABI's.
	// --exclude-libs: a toolchain that links the C++ runtime statically (the
	// GPU machine's did) would otherwise export all of libsupc++ from the
	// bundle; the Makefile builds the samples the same way.
	cmd := append([]string{"-x", "c++", "-O2", "-shared", "-fPIC", "-Wl,--exclude-libs,libstdc++.a:libsupc++.a:libgcc_eh.a"}, args...)
	cmd = append(cmd, "-I"+filepath.Join(Root(), "abi"), "-o", out, src)
	if b, err := exec.Command(cxx, cmd...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", cxx, cmd, err, b)
	}
	return out
}

// BuildCUDALib compiles src with nvcc (or $NVCC) into dir/name as a CUDA
// bundle for sm_80 and sm_90 (+PTX), as the Makefile does, to check that a
// source builds for both targets: nothing runs it without a GPU. Skipped
// in -short mode and when nvcc is missing; a compile error fails the test.
func BuildCUDALib(t testing.TB, src, dir, name string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("nvcc build skipped in -short mode")
	}
	nvcc := os.Getenv("NVCC")
	if nvcc == "" {
		nvcc = "nvcc"
	}
	if _, err := exec.LookPath(nvcc); err != nil {
		t.Skipf("%s not found, cannot check the CUDA build: %v", nvcc, err)
	}
	out := filepath.Join(dir, name)
	cmd := exec.Command(nvcc, "-x", "cu", "-shared", "-Xcompiler", "-fPIC", "-O3", "-I"+filepath.Join(Root(), "abi"),
		"-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=[sm_90,compute_90]", "-o", out, src)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, b)
	}
	return out
}

// ABI1Include is the BuildLib argument that builds against the ABI 1 headers
// as released, to prove ABI 1 bundles keep working.
func ABI1Include() string { return "-I" + filepath.Join(Root(), "internal", "testkit", "abi1") }

// Manifest is a valid manifest for the test kernels, to adjust per test.
func Manifest(name string) *abi.Manifest {
	return &abi.Manifest{
		Name: name, ABI: abi.Major, Target: abi.TargetHost, Library: "kernels.so",
		MaxInputBytes: 1 << 16, TmpBytes: 64, OutBytes: 256,
		Chain: []abi.Launch{{Kernel: "echo", Grid: 1, Block: 64}},
	}
}

// Typed is Manifest (echo) declaring Open Inference Protocol tensors: x
// FP32 [2,2] and y INT16 [-1] in; z FP32 [2,2] and rest INT16 [-1] out of
// 32 bytes, so z is x and rest is y, zero-padded to 8 elements.
func Typed(name string) *abi.Manifest {
	m := Manifest(name)
	m.OutBytes = 32
	m.Tensors = &abi.Tensors{
		Inputs:  []abi.Tensor{{Name: "x", Datatype: "FP32", Shape: []int64{2, 2}}, {Name: "y", Datatype: "INT16", Shape: []int64{-1}}},
		Outputs: []abi.Tensor{{Name: "z", Datatype: "FP32", Shape: []int64{2, 2}}, {Name: "rest", Datatype: "INT16", Shape: []int64{-1}}},
	}
	return m
}

// Slow is Manifest with a chain that holds its instance for ms
// milliseconds, then echoes the input: for tests of queues and concurrency.
func Slow(name string, ms int) *abi.Manifest {
	m := Manifest(name)
	m.Chain = []abi.Launch{{Kernel: "sleep_ms", Grid: ms, Block: 1}, {Kernel: "echo", Grid: 1, Block: 8}}
	return m
}

// BatchSource is the batching test bundle (PLOVER_BATCHED(16)): 8-byte
// items, a uint32 value and a sleep in milliseconds, answered with value+1
// and the run's item count.
func BatchSource() string { return filepath.Join(Root(), "internal", "testkit", "batch.cu") }

// BatchManifest is a valid manifest for the batching test bundle, runs of at
// most maxItems.
func BatchManifest(name string, maxItems int, delay string) *abi.Manifest {
	return &abi.Manifest{
		Name: name, ABI: abi.Major, Target: abi.TargetHost, Library: "batch.so",
		MaxInputBytes: int64(maxItems) * 8, OutBytes: int64(maxItems) * 8,
		Chain: []abi.Launch{{Kernel: "bitem", Grid: 1, Block: 1}},
		Batch: &abi.Batch{MaxItems: maxItems, MaxDelay: delay, ItemInputBytes: 8, ItemOutputBytes: 8},
	}
}

// PipelineDir writes a pipeline's directory: its manifest, name and steps
// (a function's name, or a {"function", "version"} object, or a parallel
// step's list of them), and nothing else.
func PipelineDir(t testing.TB, name string, steps ...any) string {
	t.Helper()
	dir := t.TempDir()
	b, err := json.Marshal(map[string]any{"name": name, "kind": "pipeline", "steps": steps})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, abi.ManifestFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Repeat is n pipeline steps naming step: PipelineDir(t, "p",
// Repeat(16, "f")...) runs f 16 times.
func Repeat(n int, step string) []any {
	out := make([]any, n)
	for i := range out {
		out[i] = step
	}
	return out
}

// BundleDir writes a bundle directory: the manifest, the test kernels
// library (built once per call) and, if consts is not nil, the constants.
func BundleDir(t testing.TB, m *abi.Manifest, consts []byte) string {
	t.Helper()
	dir := t.TempDir()
	BuildLib(t, KernelsSource(), dir, m.Library)
	WriteManifest(t, dir, m)
	if consts != nil {
		if m.Constants == "" {
			t.Fatal("testkit: constants given but the manifest names none")
		}
		if err := os.WriteFile(filepath.Join(dir, m.Constants), consts, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// FailingLoadBundleDir writes a bundle directory of function name whose
// plover_load always fails (HooksSource built with -DFAIL_LOAD): each
// load counts towards the version's back-off, which five bring on.
func FailingLoadBundleDir(t testing.TB, name string) string {
	t.Helper()
	m := &abi.Manifest{Name: name, ABI: abi.Major, Target: abi.TargetHost, Library: "hooks.so",
		MaxInputBytes: 1 << 10, OutBytes: 256, Chain: []abi.Launch{{Kernel: "report", Grid: 1, Block: 1}}}
	dir := t.TempDir()
	BuildLib(t, HooksSource(), dir, m.Library, "-DFAIL_LOAD")
	WriteManifest(t, dir, m)
	return dir
}

// UnloadableBundleDir writes a bundle directory for m whose library passes
// the static checks but cannot be loaded here: it needs a shared library
// (libploverdep.so) removed once the bundle's was built, as a dependency
// missing on a node is.
func UnloadableBundleDir(t testing.TB, m *abi.Manifest) string {
	t.Helper()
	dep := t.TempDir()
	src := filepath.Join(dep, "dep.c")
	if err := os.WriteFile(src, []byte("int plover_probe_dep(void) { return 1; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	BuildLib(t, src, dep, "libploverdep.so")
	dir := t.TempDir()
	BuildLib(t, KernelsSource(), dir, m.Library, "-L"+dep, "-Wl,--no-as-needed", "-lploverdep")
	WriteManifest(t, dir, m)
	if err := os.Remove(filepath.Join(dep, "libploverdep.so")); err != nil {
		t.Fatal(err)
	}
	return dir
}

// StaticTLSBundleDir writes a bundle directory for m whose library is the
// test kernels with tlsBytes of initial-exec thread-local storage, as
// -ftls-model=initial-exec or a statically linked runtime makes: dlopen
// places it in glibc's static TLS reserve, which every library a process
// loads shares (rtld.optional_static_tls, 512 bytes by default). Two of
// 300 bytes cannot both load into one process, though each loads alone.
func StaticTLSBundleDir(t testing.TB, m *abi.Manifest, tlsBytes int) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "tls.cu")
	body := "#include \"" + KernelsSource() + "\"\n" +
		"__attribute__((tls_model(\"initial-exec\"))) __thread char plover_test_tls[" + strconv.Itoa(tlsBytes) + "];\n" +
		"extern \"C\" char *test_tls_at(int i) { return &plover_test_tls[i]; }\n"
	if err := os.WriteFile(src, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	BuildLib(t, src, dir, m.Library)
	WriteManifest(t, dir, m)
	return dir
}

// WriteManifest writes m as dir/plover.json.
func WriteManifest(t testing.TB, dir string, m *abi.Manifest) {
	t.Helper()
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, abi.ManifestFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// Goroutines counts the goroutines whose stacks hold every one of frames:
// a function's frame ("pkg.(*T).method("), the ones a test waits to see
// end or begin to wait; with a test's name beside it ("TestX."), only the
// goroutines that test started, not ones an earlier test left waiting.
func Goroutines(frames ...string) int {
	buf := make([]byte, 1<<20)
	n := runtime.Stack(buf, true)
	for n == len(buf) {
		buf = make([]byte, 2*len(buf))
		n = runtime.Stack(buf, true)
	}
	count := 0
	for stack := range strings.SplitSeq(string(buf[:n]), "\n\n") { // a blank line ends each goroutine's
		all := true
		for _, f := range frames {
			all = all && strings.Contains(stack, f)
		}
		if all {
			count++
		}
	}
	return count
}

// UniqueSource writes a bundle source whose answer is a C++ inline
// function's static, model_TAG() (the pattern of a header library's
// singleton or a lazily loaded model): value*100 plus its own count of
// runs, 4 bytes. g++ makes the static a GNU unique symbol, which the
// dynamic linker binds once a process, whatever library asks; a tag of
// its own keeps one test's symbol apart from another's in one process.
func UniqueSource(t testing.TB, tag string, value int) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "unique.cu")
	model := "model_" + tag
	body := `#include <stdint.h>
#include <string.h>
#include "plover.h"
PLOVER_BUNDLE("host");
struct Model { int32_t value = ` + strconv.Itoa(value) + `, runs = 0; };
inline Model &` + model + `() { static Model m; return m; }
PLOVER_ENTRY(echo) {
  (void)grid; (void)block;
  int32_t v = ` + model + `().value * 100 + ++` + model + `().runs;
  memcpy(s->out.dat, &v, sizeof v);
  s->out.len = sizeof v;
}
`
	if err := os.WriteFile(src, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return src
}
