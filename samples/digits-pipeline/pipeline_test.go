package digitspipeline_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/loader"
	"github.com/plover-run/plover/samples/cnn/digits"
	"github.com/plover-run/plover/samples/cnn/model"
)

const (
	cnnDir      = "../cnn"
	heldoutFile = "../cnn/testdata/heldout.bin"
	weightsFile = "../cnn/weights.bin"
	builtDir    = "../../build/samples" // where make puts the bundles
	// digits-top1's response: int32 label, then float32 score.
	top1Bytes = 8
	// The cnn bundle's scores and model.Scores differ by expf vs math.Exp
	// rounding only (samples/cnn/bundle_test.go's tolerance).
	scoreTolerance = 1e-5
	minAccuracy    = 0.90
)

// source is one function of the pipeline: its directory (plover.json and,
// for cnn, weights.bin) and its kernel source.
type source struct{ dir, cu string }

var (
	normalizeSrc = source{"normalize", "normalize.cu"}
	cnnSrc       = source{cnnDir, "cnn.cu"}
	top1Src      = source{"top1", "top1.cu"}
)

func readManifest(t testing.TB, path string) *abi.Manifest {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := abi.ParseManifest(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return m
}

func readHeldout(t testing.TB) []digits.Digit {
	t.Helper()
	ds, err := digits.ReadFile(heldoutFile)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) < 300 {
		t.Fatalf("%s has %d digits, want a few hundred", heldoutFile, len(ds))
	}
	return ds
}

// build makes src's host bundle directory in a temporary directory as the
// .mk files do (the Makefile's host flags, plus -Werror: the samples build
// cleanly): the library compiled, plover.json and the constants copied.
// Skipped when there is no C++ compiler.
func build(t testing.TB, src source) (string, *abi.Manifest) {
	t.Helper()
	m := readManifest(t, filepath.Join(src.dir, abi.ManifestFile))
	dir := t.TempDir()
	testkit.BuildLib(t, filepath.Join(src.dir, src.cu), dir, m.Library, "-std=c++17", "-Wall", "-Wextra", "-Werror")
	for _, name := range []string{abi.ManifestFile, m.Constants} {
		if name == "" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src.dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir, m
}

// function is one bundle loaded the way the runtime loads it (static checks,
// dlopen, constants on the device), with one instance sized by its manifest.
type function struct {
	m    *abi.Manifest
	dev  *device.Host
	ents *device.Entries
	c    device.Constants
	inst device.Instance
	run  device.Run
}

func load(t testing.TB, dir string, m *abi.Manifest) *function {
	t.Helper()
	lib, err := loader.OpenBundle(dir, m, abi.TargetHost)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lib.Close() })
	f := &function{m: m, dev: device.NewHost(0), ents: device.NewEntries(lib)}
	if m.Constants != "" {
		c, err := os.Open(filepath.Join(dir, m.Constants))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		st, err := c.Stat()
		if err != nil {
			t.Fatal(err)
		}
		if f.c, err = f.dev.LoadConstants(c, st.Size()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(f.c.Free)
	}
	f.inst = f.instance(t, m.MaxInputBytes)
	f.run = device.Run{Output: make([]byte, m.OutBytes), Chain: f.chain(t, m.Chain), TmpLen: m.TmpBytes,
		ZeroTmp: m.ZeroTmp, ZeroOut: m.ZeroesOut()}
	return f
}

func (f *function) instance(t testing.TB, maxInput int64) device.Instance {
	t.Helper()
	inst, err := f.dev.NewInstance(device.InstanceConfig{MaxInput: maxInput, Tmp: f.m.TmpBytes, Out: f.m.OutBytes,
		Constants: f.c, Entries: f.ents})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(inst.Close)
	return inst
}

func (f *function) chain(t testing.TB, chain []abi.Launch) []device.Step {
	t.Helper()
	steps := make([]device.Step, len(chain))
	for i, l := range chain {
		e, err := f.ents.Resolve(l.Kernel)
		if err != nil {
			t.Fatal(err)
		}
		steps[i] = device.Step{Entry: e, Grid: int32(l.Grid), Block: int32(l.Block)}
	}
	return steps
}

// call runs the manifest's chain on in and returns a copy of the response.
func (f *function) call(in []byte) ([]byte, error) {
	f.run.Input = in
	if err := f.inst.Run(&f.run); err != nil {
		return nil, err
	}
	return bytes.Clone(f.run.Output[:f.run.OutLen]), nil
}

func (f *function) mustCall(t testing.TB, in []byte) []byte {
	t.Helper()
	out, err := f.call(in)
	if err != nil {
		t.Fatalf("%s: %v", f.m.Name, err)
	}
	return out
}

// pipeline is the three functions, each built and loaded.
type pipeline struct{ normalize, cnn, top1 *function }

func loadPipeline(t testing.TB) *pipeline {
	t.Helper()
	var p pipeline
	for _, c := range []struct {
		f   **function
		src source
	}{{&p.normalize, normalizeSrc}, {&p.cnn, cnnSrc}, {&p.top1, top1Src}} {
		dir, m := build(t, c.src)
		*c.f = load(t, dir, m)
	}
	return &p
}

func float32s(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

func bytesOf(v []float32) []byte {
	b := make([]byte, 0, 4*len(v))
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
	}
	return b
}

// decodeTop1 reads digits-top1's response.
func decodeTop1(t testing.TB, out []byte) (int32, float32) {
	t.Helper()
	if len(out) != top1Bytes {
		t.Fatalf("digits-top1 returned %d bytes, want %d", len(out), top1Bytes)
	}
	return int32(binary.LittleEndian.Uint32(out)), math.Float32frombits(binary.LittleEndian.Uint32(out[4:]))
}

// TestNormalizeMatchesGo: digits-normalize's output is, byte for byte, the
// input the cnn sample was trained and is tested on (digits.Digit.Input,
// digits.Value per pixel): for every byte value, and for every held-out digit.
func TestNormalizeMatchesGo(t *testing.T) {
	dir, m := build(t, normalizeSrc)
	f := load(t, dir, m)

	t.Run("every byte value", func(t *testing.T) {
		var in [model.Pixels]byte
		for i := range in {
			in[i] = byte(i * 7) // 7 is odd: every value 0..255 occurs, in a scrambled order
		}
		got := float32s(f.mustCall(t, in[:]))
		for i, k := range in {
			if want := digits.Value(k); math.Float32bits(got[i]) != math.Float32bits(want) {
				t.Errorf("pixel %d = %d: normalize gives %v (%#08x), digits.Value %v (%#08x)",
					i, k, got[i], math.Float32bits(got[i]), want, math.Float32bits(want))
			}
		}
	})

	t.Run("held-out digits", func(t *testing.T) {
		ds := readHeldout(t)
		for i := range ds {
			if got, want := f.mustCall(t, ds[i].Pixels[:]), ds[i].Input(); !bytes.Equal(got, want) {
				t.Fatalf("held-out digit %d: normalize's output differs from digits.Digit.Input", i)
			}
		}
		t.Logf("%d held-out digits: identical to digits.Digit.Input", len(ds))
	})

	// The kernel is a grid-stride loop: any launch shape gives the same bytes.
	t.Run("launch shapes", func(t *testing.T) {
		ds := readHeldout(t)
		for _, shape := range [][2]int{{1, 1}, {3, 7}, {7, 1000}, {1, 1024}} {
			run := f.run
			run.Chain = f.chain(t, []abi.Launch{{Kernel: m.Chain[0].Kernel, Grid: shape[0], Block: shape[1]}})
			run.Output = make([]byte, m.OutBytes)
			for _, i := range []int{0, len(ds) / 2, len(ds) - 1} {
				run.Input = ds[i].Pixels[:]
				if err := f.inst.Run(&run); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(run.Output, ds[i].Input()) {
					t.Fatalf("grid %d block %d, digit %d: output differs from digits.Digit.Input", shape[0], shape[1], i)
				}
			}
		}
	})
}

// TestPipelineHeldout runs every held-out digit through the three functions
// step by step, each step's response the next one's request, as a pipeline
// does: digits-top1 must name model.Argmax of the cnn's scores and copy that
// score bit for bit, the label must be the Go model's, and the accuracy must
// hold.
func TestPipelineHeldout(t *testing.T) {
	ds := readHeldout(t)
	params, err := model.Load(weightsFile)
	if err != nil {
		t.Fatal(err)
	}
	p := loadPipeline(t)
	correct, nearTies := 0, 0
	for i := range ds {
		img := p.normalize.mustCall(t, ds[i].Pixels[:])
		scoreBytes := p.cnn.mustCall(t, img)
		label, score := decodeTop1(t, p.top1.mustCall(t, scoreBytes))

		scores, err := model.DecodeScores(scoreBytes)
		if err != nil {
			t.Fatal(err)
		}
		if want := model.Argmax(scores); int(label) != want || math.Float32bits(score) != math.Float32bits(scores[want]) {
			t.Fatalf("digit %d: top1 gives (%d, %v), the cnn's scores %v have argmax %d (%v)", i, label, score, scores, want, scores[want])
		}
		ref := params.Scores(ds[i].Image())
		if want := model.Argmax(ref); int(label) != want {
			// Only expf vs math.Exp rounding separates the two score
			// vectors, so they may disagree only on a near tie.
			if d := math.Abs(float64(ref[label]) - float64(ref[want])); d > 2*scoreTolerance {
				t.Fatalf("digit %d: pipeline says %d, the Go model %d (Go scores %v)", i, label, want, ref)
			}
			nearTies++
		}
		if d := math.Abs(float64(score) - float64(ref[label])); !(d <= scoreTolerance) {
			t.Fatalf("digit %d: top1 score %v, Go model's score for %d is %v", i, score, label, ref[label])
		}
		if int(label) == int(ds[i].Label) {
			correct++
		}
	}
	acc := float64(correct) / float64(len(ds))
	t.Logf("%d held-out digits: accuracy %.2f%% (%d correct), labels equal to the Go model's for %d (near ties: %d)",
		len(ds), 100*acc, correct, len(ds)-nearTies, nearTies)
	if acc < minAccuracy {
		t.Errorf("accuracy %.2f%% < %.0f%%", 100*acc, 100*minAccuracy)
	}
}

// TestTop1Crafted: ties, negatives, infinities, NaN and the maximum at either
// end, against model.Argmax and the exact bits of the chosen score.
func TestTop1Crafted(t *testing.T) {
	dir, m := build(t, top1Src)
	f := load(t, dir, m)
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	negZero := math.Float32frombits(1 << 31)
	for _, c := range []struct {
		name   string
		scores [model.Classes]float32
		label  int32
	}{
		{"max at 9", [10]float32{0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9}, 9},
		{"max at 0", [10]float32{0.9, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.1}, 0},
		{"all equal: lowest index", [10]float32{0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5}, 0},
		{"tie at 3 and 7: lowest index", [10]float32{0.1, 0.2, 0.3, 0.8, 0.5, 0.6, 0.7, 0.8, 0.1, 0.2}, 3},
		{"tie at 8 and 9", [10]float32{0, 0, 0, 0, 0, 0, 0, 0, 1, 1}, 8},
		{"all negative", [10]float32{-5, -4, -3, -2, -1.5, -1, -0.25, -0.5, -2, -9}, 6},
		{"negative, max at 9", [10]float32{-9, -8, -7, -6, -5, -4, -3, -2, -1, -1e-30}, 9},
		{"+0 and -0 tie", [10]float32{negZero, 0, -1, -1, -1, -1, -1, -1, -1, -1}, 0},
		{"denormal beats zero", [10]float32{0, 0, 0, 0, math.SmallestNonzeroFloat32, 0, 0, 0, 0, 0}, 4},
		{"+Inf", [10]float32{1, 2, 3, inf, 4, 5, inf, 7, 8, 9}, 3},
		{"all -Inf", [10]float32{-inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf}, 0},
		{"NaN first: never beaten (as model.Argmax)", [10]float32{nan, 1, 2, 3, 4, 5, 6, 7, 8, 9}, 0},
		{"NaN later: never wins", [10]float32{0.1, 0.2, nan, 0.3, 0.05, 0, 0, 0, 0, 0}, 3},
		{"largest float", [10]float32{math.MaxFloat32, 0, 0, 0, 0, 0, 0, 0, 0, math.MaxFloat32}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			if want := model.Argmax(c.scores); int(c.label) != want {
				t.Fatalf("test case wrong: model.Argmax gives %d, case says %d", want, c.label)
			}
			label, score := decodeTop1(t, f.mustCall(t, bytesOf(c.scores[:])))
			if label != c.label {
				t.Errorf("label %d, want %d", label, c.label)
			}
			if got, want := math.Float32bits(score), math.Float32bits(c.scores[c.label]); got != want {
				t.Errorf("score bits %#08x (%v), want %#08x (%v)", got, score, want, c.scores[c.label])
			}
		})
	}

	// Only thread 0 of block 0 works: any launch shape gives the same answer.
	t.Run("launch shapes", func(t *testing.T) {
		in := bytesOf([]float32{0.1, 0.9, 0.2, 0.95, 0.3, 0.1, 0.95, 0, 0, 0})
		for _, shape := range [][2]int{{1, 1}, {1, 32}, {4, 7}, {16, 1024}} {
			run := f.run
			run.Chain = f.chain(t, []abi.Launch{{Kernel: m.Chain[0].Kernel, Grid: shape[0], Block: shape[1]}})
			run.Output, run.Input = make([]byte, m.OutBytes), in
			if err := f.inst.Run(&run); err != nil {
				t.Fatal(err)
			}
			if label, score := decodeTop1(t, run.Output); label != 3 || score != 0.95 {
				t.Errorf("grid %d block %d: (%d, %v), want (3, 0.95)", shape[0], shape[1], label, score)
			}
		}
	})
}

// TestWrongLengths: each entry refuses a request of the wrong size as the
// client's fault (plover_reject) and fails on an out buffer of the wrong
// size (plover_fail), instead of reading or writing past a buffer.
// The instances hold more input than max_input_bytes so that the entries
// themselves see the long requests (the server refuses those first, 413).
func TestWrongLengths(t *testing.T) {
	for _, c := range []struct {
		src      source
		inputs   []int  // wrong request sizes
		wantIn   string // their error
		okIn     int    // the right request size
		shortOut int    // a wrong out size
		wantOut  string // its error
	}{
		{normalizeSrc, []int{0, 1, 783, 785, 3136}, "digits-normalize: input must be 784 bytes", 784, 3132, "digits-normalize: out_bytes must be 3136"},
		{top1Src, []int{0, 4, 39, 41, 784, 3136}, "digits-top1: input must be 40 bytes", 40, 4, "digits-top1: out_bytes must be 8"},
	} {
		dir, m := build(t, c.src)
		f := load(t, dir, m)
		inst := f.instance(t, 4096)
		check := func(name string, run device.Run, want string, rejected bool) {
			t.Run(m.Name+"/"+name, func(t *testing.T) {
				err := inst.Run(&run)
				var ke *device.KernelError
				if !errors.As(err, &ke) || !strings.Contains(ke.Msg, want) || ke.Rejected != rejected {
					t.Fatalf("Run: %v, want a kernel error containing %q, a refusal: %v", err, want, rejected)
				}
			})
		}
		for _, n := range c.inputs {
			run := f.run
			run.Input, run.Output = make([]byte, n), make([]byte, m.OutBytes)
			check(fmt.Sprintf("input %d bytes", n), run, c.wantIn, true)
		}
		run := f.run
		run.Input, run.Output = make([]byte, c.okIn), make([]byte, c.shortOut)
		check(fmt.Sprintf("out %d bytes", c.shortOut), run, c.wantOut, false)
		// The right sizes still work on the same instance afterwards.
		run.Output = make([]byte, m.OutBytes)
		if err := inst.Run(&run); err != nil {
			t.Errorf("%s: right sizes after failures: %v", m.Name, err)
		}
	}
}

// TestManifests: the two functions' plover.json parse, describe these
// bundles (byte counts, chain, tensors), and fit the cnn sample between
// them; the pipeline manifest names the three functions in order.
func TestManifests(t *testing.T) {
	norm := readManifest(t, filepath.Join(normalizeSrc.dir, abi.ManifestFile))
	top1 := readManifest(t, filepath.Join(top1Src.dir, abi.ManifestFile))
	cnn := readManifest(t, filepath.Join(cnnDir, abi.ManifestFile))
	for _, c := range []struct {
		field     string
		got, want any
	}{
		{"normalize name", norm.Name, "digits-normalize"},
		{"normalize abi", norm.ABI, 2},
		{"normalize target", norm.Target, abi.TargetHost},
		{"normalize library", norm.Library, "normalize.so"},
		{"normalize max_input_bytes", norm.MaxInputBytes, int64(model.Pixels)},
		{"normalize out_bytes", norm.OutBytes, int64(model.InputBytes)},
		{"normalize kernels", fmt.Sprint(abi.Kernels(norm.Chain)), "[digits_normalize]"},
		{"normalize tensors", norm.Tensors, &abi.Tensors{
			Inputs:  []abi.Tensor{{Name: "pixels", Datatype: "UINT8", Shape: []int64{1, model.Side, model.Side}}},
			Outputs: []abi.Tensor{{Name: "image", Datatype: "FP32", Shape: []int64{1, model.Side, model.Side}}},
		}},
		{"top1 name", top1.Name, "digits-top1"},
		{"top1 abi", top1.ABI, 2},
		{"top1 target", top1.Target, abi.TargetHost},
		{"top1 library", top1.Library, "top1.so"},
		{"top1 max_input_bytes", top1.MaxInputBytes, int64(model.OutBytes)},
		{"top1 out_bytes", top1.OutBytes, int64(top1Bytes)},
		{"top1 kernels", fmt.Sprint(abi.Kernels(top1.Chain)), "[digits_top1]"},
		{"top1 tensors", top1.Tensors, &abi.Tensors{
			Inputs: []abi.Tensor{{Name: "scores", Datatype: "FP32", Shape: []int64{model.Classes}}},
			Outputs: []abi.Tensor{
				{Name: "label", Datatype: "INT32", Shape: []int64{1}},
				{Name: "score", Datatype: "FP32", Shape: []int64{1}},
			},
		}},
		// Each step's response is the next one's whole request.
		{"normalize out_bytes = cnn max_input_bytes", norm.OutBytes, cnn.MaxInputBytes},
		{"cnn out_bytes = top1 max_input_bytes", cnn.OutBytes, top1.MaxInputBytes},
	} {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s = %v, want %v", c.field, c.got, c.want)
		}
	}
	// The tensors cover the buffers exactly: inputs max_input_bytes, outputs out_bytes.
	for _, m := range []*abi.Manifest{norm, top1} {
		for _, side := range []struct {
			what  string
			ts    []abi.Tensor
			bytes int64
		}{{"inputs", m.Tensors.Inputs, m.MaxInputBytes}, {"outputs", m.Tensors.Outputs, m.OutBytes}} {
			var n int64
			for _, x := range side.ts {
				n += abi.Elements(x.Shape) * abi.DatatypeSize[x.Datatype]
			}
			if n != side.bytes {
				t.Errorf("%s: tensors.%s hold %d bytes, the buffer is %d", m.Name, side.what, n, side.bytes)
			}
		}
	}

	// The pipeline manifest is read as plain JSON here: parsing it is the
	// abi package's business.
	raw, err := os.ReadFile(abi.ManifestFile)
	if err != nil {
		t.Fatal(err)
	}
	var pm struct {
		Name  string   `json:"name"`
		Kind  string   `json:"kind"`
		Steps []string `json:"steps"`
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&pm); err != nil {
		t.Fatalf("pipeline %s: %v", abi.ManifestFile, err)
	}
	if want := []string{norm.Name, cnn.Name, top1.Name}; pm.Name != "digits" || pm.Kind != "pipeline" || !reflect.DeepEqual(pm.Steps, want) {
		t.Errorf("pipeline %s = %+v, want name digits, kind pipeline, steps %v", abi.ManifestFile, pm, want)
	}
}

// TestKernelsDeclared: each library, built as the .mk builds it, declares
// target host, ABI 2 and the entries its chain names (static checks only).
func TestKernelsDeclared(t *testing.T) {
	for _, src := range []source{normalizeSrc, top1Src} {
		dir, m := build(t, src)
		so := filepath.Join(dir, m.Library)
		info, err := loader.Inspect(so)
		if err != nil {
			t.Fatal(err)
		}
		if err := info.Check(so, abi.TargetHost, abi.Kernels(m.Chain)); err != nil {
			t.Error(err)
		}
		if want := abi.Kernels(m.Chain); !reflect.DeepEqual(info.Declared, want) {
			t.Errorf("%s declares %v, want exactly %v", m.Library, info.Declared, want)
		}
		if _, err := loader.CheckBundle(dir, m, abi.TargetHost); err != nil {
			t.Error(err)
		}
	}
}

// TestBuiltBundles checks what `make digits-normalize-host digits-top1-host
// digits-pipeline` left under build/samples: the manifests are the sources'
// and each bundle passes the deploy-time checks.
func TestBuiltBundles(t *testing.T) {
	for _, c := range []struct{ built, src string }{
		{"digits-normalize-host", normalizeSrc.dir},
		{"digits-top1-host", top1Src.dir},
		{"digits-pipeline", "."},
	} {
		dir := filepath.Join(builtDir, c.built)
		raw, err := os.ReadFile(filepath.Join(dir, abi.ManifestFile))
		if errors.Is(err, os.ErrNotExist) {
			t.Skipf("%s is not built: run make digits-normalize-host digits-top1-host digits-pipeline", dir)
		} else if err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(filepath.Join(c.src, abi.ManifestFile))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(raw, want) {
			t.Errorf("%s/%s differs from %s/%s: rerun make", dir, abi.ManifestFile, c.src, abi.ManifestFile)
		}
		if c.built == "digits-pipeline" {
			continue
		}
		m := readManifest(t, filepath.Join(dir, abi.ManifestFile))
		if _, err := loader.CheckBundle(dir, m, abi.TargetHost); err != nil {
			t.Error(err)
		}
	}
}

// TestCUDABuild compiles both sources with nvcc, as for a CUDA bundle, and
// checks statically that they declare target "cuda" and their entries
// (nothing runs without a GPU; skipped without nvcc and in -short mode).
func TestCUDABuild(t *testing.T) {
	for _, src := range []source{normalizeSrc, top1Src} {
		m := readManifest(t, filepath.Join(src.dir, abi.ManifestFile))
		so := testkit.BuildCUDALib(t, filepath.Join(src.dir, src.cu), t.TempDir(), m.Library)
		info, err := loader.Inspect(so)
		if err != nil {
			t.Fatal(err)
		}
		if err := info.Check(so, abi.TargetCUDA, abi.Kernels(m.Chain)); err != nil {
			t.Error(err)
		}
	}
}
