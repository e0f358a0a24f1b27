package device

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/plover-run/plover/loader"
)

// GPU tests need a CUDA device and the test bundle built from
// testdata/kernels.cu: from $PLOVER_TEST_CUDA_BUNDLE_DIR/testkernels.so
// (for a `go test -c` binary on a machine without Go), else built with nvcc
// when it is on PATH. Without a device they skip, saying why.

const cudaBundleName = "testkernels.so"

var gpuT struct {
	once      sync.Once
	env       *bundleEnv
	skip      string
	err       error
	bundleDir string
}

func nvccArgs(out string) []string {
	return []string{"-x", "cu", "-shared", "-Xcompiler", "-fPIC", "-O3", "-I" + filepath.Join("..", "abi"),
		"-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=[sm_90,compute_90]",
		"-o", out, filepath.Join("testdata", "kernels.cu")}
}

func buildCUDABundle(dir string) (string, error) {
	nvcc, err := exec.LookPath("nvcc")
	if err != nil {
		return "", errors.New("set PLOVER_TEST_CUDA_BUNDLE_DIR or put nvcc on PATH")
	}
	out := filepath.Join(dir, cudaBundleName)
	if b, err := exec.Command(nvcc, nvccArgs(out)...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("nvcc: %v\n%s", err, b)
	}
	return out, nil
}

func cudaBundle() (string, error) {
	if dir := os.Getenv("PLOVER_TEST_CUDA_BUNDLE_DIR"); dir != "" {
		p, err := filepath.Abs(filepath.Join(dir, cudaBundleName))
		if err != nil {
			return "", err
		}
		if _, err := os.Stat(p); err != nil {
			return "", err
		}
		return p, nil
	}
	dir, err := os.MkdirTemp("", "plover-cudatest-")
	if err != nil {
		return "", err
	}
	removeLater(dir)
	return buildCUDABundle(dir)
}

func gpuEnv(t testing.TB) *bundleEnv {
	t.Helper()
	gpuT.once.Do(func() {
		gpus, err := OpenCUDA(0, nil)
		if err != nil {
			gpuT.skip = "no CUDA device: " + err.Error()
			return
		}
		for _, g := range gpus {
			g.Close()
		}
		path, err := cudaBundle()
		if err != nil {
			gpuT.skip = "no CUDA test bundle: " + err.Error()
			return
		}
		gpuT.bundleDir = filepath.Dir(path)
		lib, err := loader.Open(path, "cuda", testEntries)
		if err != nil {
			gpuT.err = err
			return
		}
		calls, err := lib.Symbol("pl_entry_calls")
		if err != nil {
			gpuT.err = err
			return
		}
		gpuT.env = &bundleEnv{name: "gpu", lib: lib, ents: NewEntries(lib), calls: (*int64)(calls)}
	})
	if gpuT.skip != "" {
		t.Skip(gpuT.skip)
	}
	if gpuT.err != nil {
		t.Fatal(gpuT.err)
	}
	e := *gpuT.env
	e.open = func(t testing.TB, limit int64, log *slog.Logger) *GPU {
		t.Helper()
		gpus, err := openGPUs(libcuda, limit, log)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			for _, g := range gpus {
				g.Close()
			}
		})
		return gpus[e.ordinal]
	}
	return &e
}

// TestKernelsCompile checks the test kernels build with the flags the
// project uses for CUDA bundles, wherever nvcc is installed.
func TestKernelsCompile(t *testing.T) {
	if _, err := exec.LookPath("nvcc"); err != nil {
		t.Skip("nvcc not on PATH")
	}
	if testing.Short() {
		t.Skip("-short: nvcc is slow")
	}
	p, err := buildCUDABundle(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := loader.Inspect(p); err != nil {
		t.Fatal(err)
	}
}

func TestGPUSuite(t *testing.T) { runSuite(t, gpuEnv(t)) }

func TestGPUInfo(t *testing.T) {
	e := gpuEnv(t)
	g := e.gpu(t)
	m := g.MemInfo()
	t.Logf("%s, CUDA driver %s, memory %+v", g.Name(), g.DriverVersion(), m)
	if g.Target() != "cuda" || !strings.HasSuffix(g.Name(), "(GPU 0)") || m.Total <= 0 || m.Free <= 0 || m.Free > m.Total {
		t.Errorf("Target %q Name %q MemInfo %+v", g.Target(), g.Name(), m)
	}
	if err := g.Health(); err != nil {
		t.Error(err)
	}
	lim := e.fresh(t, 1<<30, nil)
	if m := lim.MemInfo(); m.Total != 1<<30 {
		t.Errorf("1 GiB budget: %+v", m)
	}
}

// TestGPUFault poisons its CUDA context, so it runs in a child process.
func TestGPUFault(t *testing.T) {
	e := gpuEnv(t)
	if os.Getenv("PLOVER_CUDA_FAULT_CHILD") == "1" {
		testFault(t, e)
		return
	}
	// Bounded inside this test's own deadline: a child that hangs in the
	// driver ends with its goroutines' stacks, and this test with it.
	limit := 2 * time.Minute
	if dl, ok := t.Deadline(); ok {
		limit = min(limit, time.Until(dl)-5*time.Second)
	}
	out, err := childTest(t, "TestGPUFault", limit, append(os.Environ(), "PLOVER_CUDA_FAULT_CHILD=1", "PLOVER_TEST_CUDA_BUNDLE_DIR="+gpuT.bundleDir))
	t.Logf("child process:\n%s", out)
	if err != nil {
		t.Fatalf("child: %v", err)
	}
}

// childTest runs the top-level test name again in a child process of this
// binary with env, for up to limit (at least 2 s), and returns its output;
// the error says why it did not pass (it skipped: errChildSkipped). The
// child dies with this process.
func childTest(t *testing.T, name string, limit time.Duration, env []string) (string, error) {
	limit = max(limit, 2*time.Second)
	ctx, cancel := context.WithTimeout(t.Context(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+name+"$", "-test.v", "-test.count=1",
		"-test.timeout="+(limit-time.Second).String())
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	b, err := cmd.CombinedOutput()
	out := string(b)
	switch {
	case err != nil:
		return out, err
	case strings.Contains(out, "--- SKIP: "+name):
		return out, errChildSkipped
	case !strings.Contains(out, "--- PASS: "+name):
		return out, fmt.Errorf("the child did not pass %s", name)
	}
	return out, nil
}

var errChildSkipped = errors.New("the child skipped")

// ---- benchmarks (scripts/gpu-check.sh reads their output) ----

func benchEnv(b *testing.B) *bundleEnv {
	if os.Getenv("PLOVER_BENCH_FAKE") == "1" { // to check the benchmarks themselves without a GPU
		return fakeEnv(b)
	}
	return gpuEnv(b)
}

// A 9-launch chain the size of the CNN sample's: per-launch overhead
// dominates, which is what graphs remove.
func BenchmarkChain9Graph(b *testing.B)  { benchChain9(b, 1) }
func BenchmarkChain9Direct(b *testing.B) { benchChain9(b, 0) }

func benchChain9(b *testing.B, key uint64) {
	e := benchEnv(b)
	g := e.gpu(b)
	inst := newInst(b, g, e, InstanceConfig{MaxInput: 3136, Tmp: 4096, Out: 40})
	chain := []Step{e.step(b, "pl_load", 64, 64)}
	for i := 0; i < 7; i++ {
		chain = append(chain, e.step(b, "pl_inc", 64, 64))
	}
	chain = append(chain, e.step(b, "pl_store", 64, 64))
	r := &Run{Input: make([]byte, 3136), Output: make([]byte, 40), Chain: chain, TmpLen: 4096, ZeroTmp: true, ChainKey: key}
	for i := 0; i < 5; i++ { // lazy module loading, capture
		mustRun(b, inst, r)
	}
	before := inst.stats.load()
	var n int
	var kernels, copies time.Duration
	for b.Loop() {
		if err := inst.Run(r); err != nil {
			b.Fatal(err)
		}
		n++
		kernels += r.Timing.Kernels
		copies += r.Timing.CopyIn + r.Timing.CopyOut
	}
	b.ReportMetric(float64(kernels.Nanoseconds())/float64(n), "kernel-ns/op")
	b.ReportMetric(float64(copies.Nanoseconds())/float64(n), "copy-ns/op")
	after := inst.stats.load()
	if key != 0 && after.Replayed-before.Replayed != uint64(n) {
		b.Errorf("%d of %d runs replayed a graph", after.Replayed-before.Replayed, n)
	}
	if key == 0 && after.Direct-before.Direct != uint64(n) {
		b.Errorf("%d of %d runs direct", after.Direct-before.Direct, n)
	}
}

// BenchmarkNewInstance measures what a warm start pays on a GPU beyond the
// request: a new instance of the CNN's sizes (device buffers, a stream and
// events, and pinned staging: its own, or a worker's shared slot page-locked
// in place), then its first run (direct) and second (captured into a graph).
// The first GPU run saw warm starts slower than cold ones (BENCHMARKS.md).
func BenchmarkNewInstance(b *testing.B) {
	for _, slot := range []bool{false, true} {
		name := "own-staging"
		if slot {
			name = "worker-slot"
		}
		b.Run(name, func(b *testing.B) {
			e := benchEnv(b)
			g := e.gpu(b)
			cfg := InstanceConfig{MaxInput: 3136, Tmp: 15 << 10, Out: 40, Entries: e.ents}
			if slot { // as the worker maps its instance's memfd
				mem, err := syscall.Mmap(-1, 0, 8192, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_ANONYMOUS)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { syscall.Munmap(mem) })
				cfg.Host = mem
			}
			r := &Run{Input: make([]byte, 3136), Output: make([]byte, 40), Chain: []Step{e.step(b, "pl_copy", 4, 64)}, ChainKey: 1}
			var create, first, second time.Duration
			for b.Loop() {
				t0 := time.Now()
				inst, err := g.NewInstance(cfg)
				if err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				mustRun(b, inst, r)
				t2 := time.Now()
				mustRun(b, inst, r)
				t3 := time.Now()
				inst.Close()
				create, first, second = create+t1.Sub(t0), first+t2.Sub(t1), second+t3.Sub(t2)
			}
			n := float64(b.N)
			b.ReportMetric(float64(create.Nanoseconds())/n, "create-ns/op")
			b.ReportMetric(float64(first.Nanoseconds())/n, "run1-ns/op")
			b.ReportMetric(float64(second.Nanoseconds())/n, "run2-ns/op")
		})
	}
}

// BenchmarkCopy measures the copies of a run three ways, per size:
//
//   - staged: Run on plain Go buffers, as a request was served before the
//     data path: a host memcpy into the instance's pinned staging, then
//     the DMA (and back); in-GB/s and out-GB/s are the two together.
//   - inplace: Run on buffers registered with RegisterHost (a worker's
//     slot, the served data path): the DMA alone, timed by the instance's
//     events; no byte is copied on the host (checked).
//   - pinned: plain synchronous cuMemcpyHtoD / cuMemcpyDtoHAsync+sync of
//     the same registered bytes to a device allocation, timed on the host:
//     the floor the inplace figures are read against.
func BenchmarkCopy(b *testing.B) {
	for _, size := range []int{64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20} {
		for _, mode := range []string{"staged", "inplace", "pinned"} {
			b.Run(fmt.Sprintf("%dKiB/%s", size>>10, mode), func(b *testing.B) {
				e := benchEnv(b)
				g := e.gpu(b)
				b.SetBytes(int64(2 * size))
				if mode == "pinned" {
					buf := pinnedBuf(b, g, size)
					if _, _, err := g.copyProbe(buf, 3); err != nil { // warm
						b.Fatal(err)
					}
					b.ResetTimer()
					in, out, err := g.copyProbe(buf, b.N)
					if err != nil {
						b.Fatal(err)
					}
					reportGBs(b, size, in, out)
					return
				}
				inst := newInst(b, g, e, InstanceConfig{MaxInput: int64(size), Tmp: 1, Out: int64(size)})
				r := &Run{Input: make([]byte, size), Output: make([]byte, size),
					Chain: []Step{e.step(b, "pl_copy", 1024, 256)}, ChainKey: 1}
				if mode == "inplace" {
					r.Input, r.Output, r.InPlace = pinnedBuf(b, g, size), pinnedBuf(b, g, size), true
				}
				for i := 0; i < 3; i++ {
					mustRun(b, inst, r)
				}
				var in, out time.Duration
				for b.Loop() {
					if err := inst.Run(r); err != nil {
						b.Fatal(err)
					}
					in += r.Timing.CopyIn
					out += r.Timing.CopyOut
					if mode == "inplace" && r.Timing.Copied != 0 {
						b.Fatalf("in place: %d bytes copied on the host, want 0", r.Timing.Copied)
					}
				}
				reportGBs(b, size, in, out)
			})
		}
	}
}

// reportGBs reports size bytes copied b.N times each way in in and out.
func reportGBs(b *testing.B, size int, in, out time.Duration) {
	if in > 0 && out > 0 {
		n := float64(b.N)
		b.ReportMetric(float64(size)*n/in.Seconds()/1e9, "in-GB/s")
		b.ReportMetric(float64(size)*n/out.Seconds()/1e9, "out-GB/s")
	}
}

// pinnedBuf is a page-aligned buffer of size bytes (mmap, as a worker's
// slot), registered with g until the benchmark's run ends: the framework
// runs a benchmark's function again for each b.N, each time on a GPU of its
// own, and every registration kept pins its memory (250 MiB a run before).
func pinnedBuf(b *testing.B, g *GPU, size int) []byte {
	buf, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
	if err != nil {
		b.Fatal(err)
	}
	if err := g.RegisterHost(buf); err != nil {
		syscall.Munmap(buf)
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := g.UnregisterHost(buf); err != nil {
			b.Errorf("unregister: %v", err)
		}
		syscall.Munmap(buf)
	})
	return buf
}
