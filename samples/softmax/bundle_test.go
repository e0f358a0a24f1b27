package softmax_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/loader"
	"github.com/plover-run/plover/samples/softmax/model"
)

// The bundle's probabilities against model.Forward (float64 softmax of the
// same float32 logits): expf's rounding and the reductions' order separate
// them, by about 1e-7.
const probTolerance = 2e-6

func readManifest(t testing.TB) *abi.Manifest {
	t.Helper()
	f, err := os.Open(abi.ManifestFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := abi.ParseManifest(f)
	if err != nil {
		t.Fatalf("plover.json: %v", err)
	}
	return m
}

// bundleDir builds softmax.cu for the host target as softmax.mk does (plus
// -Werror) and lays out a bundle directory: plover.json, softmax.so and
// weights.bin from model.NewParams(1), as gen writes it.
func bundleDir(t testing.TB) string {
	t.Helper()
	cxx := os.Getenv("CXX")
	if cxx == "" {
		cxx = "g++"
	}
	if _, err := exec.LookPath(cxx); err != nil {
		t.Skipf("%s not found, cannot build the host bundle: %v", cxx, err)
	}
	dir := t.TempDir()
	cmd := exec.Command(cxx, "-x", "c++", "-O2", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror",
		"-I"+filepath.Join("..", "..", "abi"), "-o", filepath.Join(dir, "softmax.so"), "softmax.cu")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
	}
	raw, err := os.ReadFile(abi.ManifestFile)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{abi.ManifestFile: raw, "weights.bin": model.NewParams(1).Bytes()} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

type bundle struct {
	prog device.Program
	m    *abi.Manifest
}

func load(t testing.TB) *bundle {
	t.Helper()
	m := readManifest(t)
	prog, err := device.NewHost(0).Load(context.Background(), device.ProgramSpec{Dir: bundleDir(t), Manifest: m})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prog.Close() })
	return &bundle{prog: prog, m: m}
}

func (b *bundle) instance(t testing.TB) device.Instance {
	t.Helper()
	inst, err := b.prog.NewInstance(device.InstanceConfig{MaxInput: b.m.MaxInputBytes, Tmp: b.m.TmpBytes, Out: b.m.OutBytes})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(inst.Close)
	return inst
}

// steps is the manifest chain with softmax's block set (0: the manifest's).
func (b *bundle) steps(t testing.TB, softmaxBlock int) []device.Step {
	t.Helper()
	var steps []device.Step
	for _, l := range b.m.Chain {
		e, err := b.prog.Entry(l.Kernel)
		if err != nil {
			t.Fatal(err)
		}
		s := device.Step{Entry: e, Grid: int32(l.Grid), Block: int32(l.Block)}
		if l.Kernel == "softmax" && softmaxBlock > 0 {
			s.Block = int32(softmaxBlock)
		}
		steps = append(steps, s)
	}
	return steps
}

func (b *bundle) run(inst device.Instance, steps []device.Step, input []byte) ([]byte, error) {
	r := &device.Run{Input: input, Output: make([]byte, b.m.OutBytes), Chain: steps,
		TmpLen: b.m.TmpBytes, ZeroTmp: b.m.ZeroTmp, ZeroOut: b.m.ZeroesOut()}
	if err := inst.Run(r); err != nil {
		return nil, err
	}
	return r.Output[:r.OutLen], nil
}

// TestHostBundle runs the chain for every batch size shape (one row, a
// partial tile, whole tiles, the maximum) and several softmax block sizes,
// on one instance (so a short response after a long one shows no stale
// rows), against model.Forward.
func TestHostBundle(t *testing.T) {
	b := load(t)
	p := model.NewParams(1)
	inst := b.instance(t)
	worst := 0.0
	for _, block := range []int{0, 1, 32, 1024} {
		for _, rows := range []int{1, 2, 15, 16, 17, 63, model.MaxRows, 3} {
			input := model.Input(rows, uint64(100+rows))
			want, err := model.Forward(p, input)
			if err != nil {
				t.Fatal(err)
			}
			out, err := b.run(inst, b.steps(t, block), input)
			if err != nil {
				t.Fatalf("block %d, %d rows: %v", block, rows, err)
			}
			if len(out) != rows*model.OutRowBytes {
				t.Fatalf("block %d, %d rows: response is %d bytes, want %d", block, rows, len(out), rows*model.OutRowBytes)
			}
			got := model.Probabilities(out)
			for r := 0; r < rows; r++ {
				sum := 0.0
				for n := 0; n < model.Out; n++ {
					i := r*model.Out + n
					d := math.Abs(float64(got[i]) - want[i])
					worst = max(worst, d)
					if !(d <= probTolerance) {
						t.Fatalf("block %d, %d rows: p[%d][%d] = %v, reference %v", block, rows, r, n, got[i], want[i])
					}
					sum += float64(got[i])
				}
				if math.Abs(sum-1) > 1e-5 {
					t.Fatalf("block %d, %d rows: row %d sums to %v", block, rows, r, sum)
				}
			}
		}
	}
	t.Logf("max |bundle - reference| = %.3g", worst)

	t.Run("errors", func(t *testing.T) {
		for _, c := range []struct {
			name  string
			block int
			input []byte
			want  string
		}{
			{"not whole rows", 0, make([]byte, model.RowBytes+4), "input must be 1 to 64 rows"},
			{"empty input", 0, nil, "input must be 1 to 64 rows"},
			{"softmax block not a power of two", 96, model.Input(2, 1), "power of two"},
		} {
			t.Run(c.name, func(t *testing.T) {
				_, err := b.run(inst, b.steps(t, c.block), c.input)
				var ke *device.KernelError
				if !errors.As(err, &ke) || !strings.Contains(ke.Msg, c.want) {
					t.Fatalf("Run: %v, want a kernel error containing %q", err, c.want)
				}
			})
		}
	})
}

// TestCUDABuild compiles softmax.cu with nvcc, as softmax.mk does, and checks
// statically (nothing runs without a GPU) that the library declares target
// "cuda" and both entries.
func TestCUDABuild(t *testing.T) {
	so := testkit.BuildCUDALib(t, "softmax.cu", t.TempDir(), "softmax.so")
	info, err := loader.Inspect(so)
	if err != nil {
		t.Fatal(err)
	}
	if err := info.Check(so, abi.TargetCUDA, abi.Kernels(readManifest(t).Chain)); err != nil {
		t.Error(err)
	}
}

// TestManifest: plover.json parses and describes this sample and
// softmax.cu's shapes.
func TestManifest(t *testing.T) {
	m := readManifest(t)
	for _, c := range []struct {
		field     string
		got, want any
	}{
		{"name", m.Name, "softmax"},
		{"abi", m.ABI, abi.Major},
		{"target", m.Target, abi.TargetHost},
		{"library", m.Library, "softmax.so"},
		{"constants", m.Constants, "weights.bin"},
		{"max_input_bytes", m.MaxInputBytes, int64(model.MaxInputBytes)},
		{"tmp_bytes", m.TmpBytes, int64(model.MaxRows * model.OutRowBytes)},
		{"out_bytes", m.OutBytes, int64(model.MaxRows * model.OutRowBytes)},
		{"zero_out", m.ZeroesOut(), false},
		{"kernels", fmt.Sprint(abi.Kernels(m.Chain)), "[dense softmax]"},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.field, c.got, c.want)
		}
	}
	src, err := os.ReadFile("softmax.cu")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{
		fmt.Sprintf("#define K_IN %d\n", model.In),
		fmt.Sprintf("#define N_OUT %d\n", model.Out),
		fmt.Sprintf("#define MAX_ROWS %d\n", model.MaxRows),
	} {
		if !strings.Contains(string(src), d) {
			t.Errorf("softmax.cu lacks %q (package model's shape)", strings.TrimSpace(d))
		}
	}
	// softmax.mk makes the CUDA manifest with sed on this exact text.
	raw, err := os.ReadFile(abi.ManifestFile)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(raw), `"target": "host"`); n != 1 {
		t.Errorf(`plover.json contains '"target": "host"' %d times; softmax.mk's sed needs exactly one`, n)
	}
}

// BenchmarkChain: one request of 1 or 64 rows through the manifest chain on
// the host device; kernel-ns/op is the chain alone (both kernels run their
// blocks as fibers).
func BenchmarkChain(b *testing.B) {
	bd := load(b)
	inst := bd.instance(b)
	steps := bd.steps(b, 0)
	for _, rows := range []int{1, model.MaxRows} {
		b.Run(fmt.Sprintf("rows=%d", rows), func(b *testing.B) {
			input := model.Input(rows, 7)
			r := &device.Run{Input: input, Output: make([]byte, bd.m.OutBytes), Chain: steps, TmpLen: bd.m.TmpBytes}
			var kernels time.Duration
			for b.Loop() {
				if err := inst.Run(r); err != nil {
					b.Fatal(err)
				}
				kernels += r.Timing.Kernels
			}
			b.ReportMetric(float64(kernels.Nanoseconds())/float64(b.N), "kernel-ns/op")
		})
	}
}
