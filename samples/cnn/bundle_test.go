package cnn_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/loader"
	"github.com/plover-run/plover/samples/cnn/digits"
	"github.com/plover-run/plover/samples/cnn/model"
)

const (
	heldoutFile = "testdata/heldout.bin"
	weightsFile = "weights.bin"
	// tmp the split chain needs: c1, s1 and f pre-activations (cnn.cu TMP_SPLIT).
	splitTmpBytes = (3456 + 216 + 10) * 4
	// Sigmoid scores; the bundle and model.Forward add in the same order, so
	// only expf vs math.Exp rounding (and, for atomicAdd on a GPU, order)
	// separates them.
	scoreTolerance = 1e-5
	minAccuracy    = 0.90
)

// splitChain is CUDA-CNN's nine launches, at its <<<64,64>>>.
func splitChain(grid, block int) []abi.Launch {
	var c []abi.Launch
	for _, layer := range []string{"c1", "s1", "f"} {
		for _, stage := range []string{"preact", "bias", "sigmoid"} {
			c = append(c, abi.Launch{Kernel: "cnn_" + layer + "_" + stage, Grid: grid, Block: block})
		}
	}
	return c
}

func resized(chain []abi.Launch, grid, block int) []abi.Launch {
	out := make([]abi.Launch, len(chain))
	for i, l := range chain {
		out[i] = abi.Launch{Kernel: l.Kernel, Grid: grid, Block: block}
	}
	return out
}

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

func readHeldout(t testing.TB) ([]digits.Digit, *model.Params) {
	t.Helper()
	ds, err := digits.ReadFile(heldoutFile)
	if err != nil {
		t.Fatal(err)
	}
	p, err := model.Load(weightsFile)
	if err != nil {
		t.Fatal(err)
	}
	return ds, p
}

// buildHost compiles cnn.cu for the host target the way cnn.mk does (plus
// -Werror: the sample should build cleanly) and returns the library path.
func buildHost(t testing.TB, dir string, defines ...string) string {
	t.Helper()
	cxx := os.Getenv("CXX")
	if cxx == "" {
		cxx = "g++"
	}
	if _, err := exec.LookPath(cxx); err != nil {
		t.Skipf("%s not found, cannot build the host bundle: %v", cxx, err)
	}
	so := filepath.Join(dir, "cnn.so")
	args := append([]string{"-x", "c++", "-O2", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror"}, defines...)
	cmd := exec.Command(cxx, append(args, "-I"+filepath.Join("..", "..", "abi"), "-o", so, "cnn.cu")...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
	}
	return so
}

// bundle is the host bundle loaded the way the runtime loads it.
type bundle struct {
	lib    *loader.Library
	ents   *device.Entries
	dev    *device.Host
	consts device.Constants
}

func openBundle(t testing.TB, so string, kernels []string) *bundle {
	t.Helper()
	lib, err := loader.Open(so, abi.TargetHost, kernels)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lib.Close() })
	dev := device.NewHost(0)
	f, err := os.Open(weightsFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	consts, err := dev.LoadConstants(f, st.Size())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(consts.Free)
	return &bundle{lib: lib, ents: device.NewEntries(lib), dev: dev, consts: consts}
}

func (b *bundle) instance(t testing.TB, tmp int64) device.Instance {
	t.Helper()
	inst, err := b.dev.NewInstance(device.InstanceConfig{
		MaxInput: model.InputBytes, Tmp: tmp, Out: model.OutBytes,
		Constants: b.consts, Entries: b.ents,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(inst.Close)
	return inst
}

func (b *bundle) steps(t testing.TB, chain []abi.Launch) []device.Step {
	t.Helper()
	steps := make([]device.Step, len(chain))
	for i, l := range chain {
		e, err := b.ents.Resolve(l.Kernel)
		if err != nil {
			t.Fatal(err)
		}
		steps[i] = device.Step{Entry: e, Grid: int32(l.Grid), Block: int32(l.Block)}
	}
	return steps
}

func scoresOf(out []byte) [model.Classes]float32 {
	var s [model.Classes]float32
	for i := range s {
		s[i] = math.Float32frombits(binary.LittleEndian.Uint32(out[4*i:]))
	}
	return s
}

// TestReferenceAccuracy: the committed weights classify the committed
// held-out digits (never trained on) with at least 90% accuracy in Go.
func TestReferenceAccuracy(t *testing.T) {
	ds, p := readHeldout(t)
	if len(ds) < 300 {
		t.Fatalf("%s has %d digits, want a few hundred", heldoutFile, len(ds))
	}
	var perClass [10]int
	for _, d := range ds {
		perClass[d.Label]++
	}
	for c, n := range perClass {
		if n == 0 {
			t.Errorf("held-out file has no %d", c)
		}
	}
	correct := digits.Accuracy(p, ds)
	acc := float64(correct) / float64(len(ds))
	t.Logf("reference accuracy %.2f%% (%d/%d)", 100*acc, correct, len(ds))
	if acc < minAccuracy {
		t.Errorf("reference accuracy %.2f%% < %.0f%%", 100*acc, 100*minAccuracy)
	}
}

// TestHostBundle builds cnn.cu for the host target, loads it with the
// loader, and runs chains through the host device for every held-out digit:
// every score must match model.Forward and the accuracy must hold.
func TestHostBundle(t *testing.T) {
	m := readManifest(t)
	ds, p := readHeldout(t)
	so := buildHost(t, t.TempDir())
	all := append(abi.Kernels(m.Chain), abi.Kernels(splitChain(1, 1))...)
	b := openBundle(t, so, all)

	for _, c := range []struct {
		name    string
		chain   []abi.Launch
		tmp     int64
		zeroTmp bool
	}{
		{"manifest", m.Chain, m.TmpBytes, m.ZeroTmp},
		{"fused grid 1 block 1", resized(m.Chain, 1, 1), m.TmpBytes, m.ZeroTmp},
		{"fused grid 3 block 7", resized(m.Chain, 3, 7), m.TmpBytes, m.ZeroTmp},
		{"fused grid 7 block 1000", resized(m.Chain, 7, 1000), m.TmpBytes, m.ZeroTmp},
		{"split 64x64", splitChain(64, 64), splitTmpBytes, true},
		{"split grid 1 block 1", splitChain(1, 1), splitTmpBytes, true},
		{"split grid 5 block 33", splitChain(5, 33), splitTmpBytes, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			inst := b.instance(t, c.tmp)
			run := &device.Run{Output: make([]byte, model.OutBytes), Chain: b.steps(t, c.chain), TmpLen: c.tmp, ZeroTmp: c.zeroTmp}
			correct, maxDiff := 0, 0.0
			for i := range ds {
				run.Input = ds[i].Input()
				if err := inst.Run(run); err != nil {
					t.Fatalf("digit %d: %v", i, err)
				}
				got, want := scoresOf(run.Output), p.Scores(ds[i].Image())
				for k := range got {
					d := math.Abs(float64(got[k]) - float64(want[k]))
					maxDiff = max(maxDiff, d)
					if !(d <= scoreTolerance) {
						t.Fatalf("digit %d score %d: bundle %v, reference %v", i, k, got[k], want[k])
					}
				}
				if model.Argmax(got) == int(ds[i].Label) {
					correct++
				}
			}
			acc := float64(correct) / float64(len(ds))
			t.Logf("%d digits, accuracy %.2f%%, max |bundle - reference| %.3g", len(ds), 100*acc, maxDiff)
			if acc < minAccuracy {
				t.Errorf("accuracy %.2f%% < %.0f%%", 100*acc, 100*minAccuracy)
			}
		})
	}

	// The split chain accumulates with atomicAdd, so without zero_tmp a
	// request starts from the previous one's sums. This is why a manifest
	// using it must set zero_tmp.
	t.Run("split without zero_tmp is wrong", func(t *testing.T) {
		inst := b.instance(t, splitTmpBytes)
		run := &device.Run{Output: make([]byte, model.OutBytes), Chain: b.steps(t, splitChain(64, 64)), TmpLen: splitTmpBytes}
		for req, d := range []*digits.Digit{&ds[0], &ds[len(ds)/2]} {
			run.Input = d.Input()
			if err := inst.Run(run); err != nil {
				t.Fatal(err)
			}
			got, want := scoresOf(run.Output), p.Scores(d.Image())
			worst := 0.0
			for k := range got {
				worst = max(worst, math.Abs(float64(got[k])-float64(want[k])))
			}
			t.Logf("request %d: max |bundle - reference| %.3g", req+1, worst)
			switch {
			case req == 0 && worst > scoreTolerance:
				t.Fatalf("first request (fresh tmp) differs from the reference by %g", worst)
			case req == 1 && worst < 10*scoreTolerance:
				t.Fatalf("second request without zero_tmp matches the reference (diff %g); does the split chain no longer need zero_tmp?", worst)
			}
		}
	})

	t.Run("errors", func(t *testing.T) {
		for _, c := range []struct {
			name  string
			chain []abi.Launch
			tmp   int64
			input []byte
			want  string
		}{
			{"short input", m.Chain, m.TmpBytes, ds[0].Input()[:model.InputBytes-4], "input must be 784"},
			{"empty input", m.Chain, m.TmpBytes, nil, "input must be 784"},
			{"split chain in fused tmp", splitChain(64, 64), m.TmpBytes, ds[0].Input(), "tmp_bytes is too small"},
			{"fused chain in no tmp", m.Chain, 0, ds[0].Input(), "tmp_bytes is too small"},
		} {
			t.Run(c.name, func(t *testing.T) {
				inst := b.instance(t, max(c.tmp, 1))
				run := &device.Run{Input: c.input, Output: make([]byte, model.OutBytes), Chain: b.steps(t, c.chain), TmpLen: c.tmp}
				err := inst.Run(run)
				var ke *device.KernelError
				if !errors.As(err, &ke) || !strings.Contains(ke.Msg, c.want) {
					t.Fatalf("Run: %v, want a kernel error containing %q", err, c.want)
				}
			})
		}
	})
}

// TestCUDABuild compiles cnn.cu with nvcc, as cnn.mk does, and checks
// statically (nothing runs without a GPU) that the library declares target
// "cuda" and exports every kernel of both chains.
// TestBatchedBuild: the CNN_BATCH build scores every digit of a batch as
// the reference does, for several batch sizes and for launch sizes other
// than the manifest's (the kernels are grid-stride loops over all items).
func TestBatchedBuild(t *testing.T) {
	m := readManifest(t)
	ds, p := readHeldout(t)
	const maxItems = 64
	so := buildHost(t, t.TempDir(), fmt.Sprintf("-DCNN_BATCH=%d", maxItems))
	b := openBundle(t, so, abi.Kernels(m.Chain))
	inst, err := b.dev.NewInstance(device.InstanceConfig{MaxInput: maxItems * model.InputBytes, Tmp: maxItems * m.TmpBytes,
		Out: maxItems * model.OutBytes, Constants: b.consts, Entries: b.ents})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(inst.Close)
	for _, c := range []struct {
		name  string
		items int
		chain []abi.Launch
	}{
		{"one digit", 1, m.Chain},
		{"7 digits", 7, m.Chain},
		{"64 digits", 64, m.Chain},
		{"64 digits, grid 1 block 1", 64, resized(m.Chain, 1, 1)},
		{"13 digits, grid 3 block 7", 13, resized(m.Chain, 3, 7)},
	} {
		t.Run(c.name, func(t *testing.T) {
			var in []byte
			for i := range c.items {
				in = append(in, ds[i*3].Input()...)
			}
			run := &device.Run{Input: in, Output: make([]byte, c.items*model.OutBytes), Chain: b.steps(t, c.chain),
				TmpLen: maxItems * m.TmpBytes, Items: uint32(c.items)}
			if err := inst.Run(run); err != nil {
				t.Fatal(err)
			}
			for i := range c.items {
				got, want := scoresOf(run.Output[i*model.OutBytes:]), p.Scores(ds[i*3].Image())
				for k := range got {
					if d := math.Abs(float64(got[k]) - float64(want[k])); !(d <= scoreTolerance) {
						t.Fatalf("item %d score %d: bundle %v, reference %v", i, k, got[k], want[k])
					}
				}
			}
		})
	}
}

func TestCUDABuild(t *testing.T) {
	so := testkit.BuildCUDALib(t, "cnn.cu", t.TempDir(), "cnn.so")
	info, err := loader.Inspect(so)
	if err != nil {
		t.Fatal(err)
	}
	m := readManifest(t)
	if err := info.Check(so, abi.TargetCUDA, append(abi.Kernels(m.Chain), abi.Kernels(splitChain(1, 1))...)); err != nil {
		t.Error(err)
	}
}

// TestManifest: plover.json parses and describes this sample.
func TestManifest(t *testing.T) {
	m := readManifest(t)
	for _, c := range []struct {
		field     string
		got, want any
	}{
		{"name", m.Name, "cnn"},
		{"target", m.Target, abi.TargetHost},
		{"library", m.Library, "cnn.so"},
		{"constants", m.Constants, weightsFile},
		{"max_input_bytes", m.MaxInputBytes, int64(model.InputBytes)},
		{"out_bytes", m.OutBytes, int64(model.OutBytes)},
		{"tmp_bytes", m.TmpBytes, int64((3456 + 216) * 4)},
		{"zero_tmp", m.ZeroTmp, false},
		{"kernels", fmt.Sprint(abi.Kernels(m.Chain)), "[cnn_c1 cnn_s1 cnn_f]"},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.field, c.got, c.want)
		}
	}
	st, err := os.Stat(weightsFile)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() != model.WeightsBytes {
		t.Errorf("%s is %d bytes, want %d", weightsFile, st.Size(), model.WeightsBytes)
	}
	// cnn.mk makes the CUDA manifest with sed on this exact text.
	raw, err := os.ReadFile(abi.ManifestFile)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(raw), `"target": "host"`); n != 1 {
		t.Errorf(`plover.json contains '"target": "host"' %d times; cnn.mk's sed needs exactly one`, n)
	}
}

// TestLayoutMatchesKernels: cnn.cu's offsets are the Go model's.
func TestLayoutMatchesKernels(t *testing.T) {
	src, err := os.ReadFile("cnn.cu")
	if err != nil {
		t.Fatal(err)
	}
	defs := map[string]int{}
	for _, m := range regexp.MustCompile(`(?m)^#define (\w+) (\d+)`).FindAllStringSubmatch(string(src), -1) {
		defs[m[1]], _ = strconv.Atoi(m[2])
	}
	for name, want := range map[string]int{
		"W_C1": model.OffC1W, "B_C1": model.OffC1B, "W_S1": model.OffS1W, "B_S1": model.OffS1B,
		"W_F": model.OffFW, "B_F": model.OffFB, "N_WEIGHTS": model.NumWeights,
		"N_IN": model.Pixels, "N_C1": model.C1Maps * model.C1Side * model.C1Side, "N_S1": model.FCIn,
		"N_OUT": model.Classes, "TMP_DIGIT": (3456 + 216), "TMP_SPLIT": splitTmpBytes / 4,
	} {
		if got, ok := defs[name]; !ok || got != want {
			t.Errorf("cnn.cu #define %s = %d (found %v), want %d", name, got, ok, want)
		}
	}
}

// BenchmarkChain compares the fused chain (plover.json) with the split one
// (CUDA-CNN's nine launches at <<<64,64>>>, with zero_tmp) on the host
// device, in-process: one inference per op, cycling through the held-out
// digits, including the runtime's input/output copies and tmp zeroing.
// kernel-ns/op is the device's own kernel time alone.
func BenchmarkChain(b *testing.B) {
	m := readManifest(b)
	ds, _ := readHeldout(b)
	so := buildHost(b, b.TempDir())
	bd := openBundle(b, so, append(abi.Kernels(m.Chain), abi.Kernels(splitChain(1, 1))...))
	for _, c := range []struct {
		name    string
		chain   []abi.Launch
		tmp     int64
		zeroTmp bool
	}{
		{"fused", m.Chain, m.TmpBytes, false},
		{"split", splitChain(64, 64), splitTmpBytes, true},
		// One "thread" per launch separates the per-thread call cost of
		// the host target from the work each chain does.
		{"fused-1x1", resized(m.Chain, 1, 1), m.TmpBytes, false},
		{"split-1x1", splitChain(1, 1), splitTmpBytes, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			inst := bd.instance(b, c.tmp)
			run := &device.Run{Output: make([]byte, model.OutBytes), Chain: bd.steps(b, c.chain), TmpLen: c.tmp, ZeroTmp: c.zeroTmp}
			inputs := make([][]byte, len(ds))
			for i := range ds {
				inputs[i] = ds[i].Input()
			}
			var kernels time.Duration
			i := 0
			for b.Loop() {
				run.Input = inputs[i%len(inputs)]
				i++
				if err := inst.Run(run); err != nil {
					b.Fatal(err)
				}
				kernels += run.Timing.Kernels
			}
			b.ReportMetric(float64(kernels.Nanoseconds())/float64(b.N), "kernel-ns/op")
		})
	}
}
