package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"

	"github.com/plover-run/plover/samples/cnn/digits"
	"github.com/plover-run/plover/samples/cnn/model"
)

// workload is one function the suite measures, with its input and a
// check of its output (a benchmark of wrong answers is worthless).
type workload struct {
	Name      string // function name, as in its manifest
	Title     string
	Dir       string // bundle directory
	Input     []byte
	InputNote string
	// check describes out and says whether it is right.
	check func(out []byte) (string, bool)
	ref   *pyploverRef
}

// pyploverRef is PyPlover's published table (shared/README.md): times in
// ms per start kind; nil columns were not published.
type pyploverRef struct {
	Note    string
	Columns []string // "cold", "warm", "hot"
	// Rows: load kernel, load constants, run kernel, platform overhead, total.
	Values [][5]float64
}

var (
	pyVecadd = &pyploverRef{
		Note:    "PyPlover (SRK/OpenLambda, K20C GPU, i7-4765T) runs vecAdd in a cold container every time",
		Columns: []string{"cold"},
		Values:  [][5]float64{{1.5, 62, 20.8, 2830.7, 2915}},
	}
	pyCNN = &pyploverRef{
		Note:    "PyPlover (K20C GPU, i7-4765T), MNIST CNN",
		Columns: []string{"cold", "warm", "hot"},
		Values: [][5]float64{
			{0.015, 0.62, 0.208, 2154.9, 2155.74},
			{0.015, 0, 0.208, 93.3, 94.14},
			{0.015, 0, 0.208, 0.2, 1.04},
		},
	}
)

func vecaddWorkload(samples, suffix string) (*workload, error) {
	w := &workload{Name: "vecadd", Title: "vecadd, n = 1,000,000 float32", Dir: filepath.Join(samples, "vecadd-"+suffix), ref: pyVecadd}
	in, err := os.ReadFile(filepath.Join(samples, "vecadd-input.bin"))
	if err != nil {
		return w, fmt.Errorf("input: %w (run make samples)", err)
	}
	w.Input = in
	w.InputNote = fmt.Sprintf("%s: %d float32 (%s), response %s", filepath.Join(samples, "vecadd-input.bin"), len(in)/4, humanBytes(len(in)), humanBytes(len(in)))
	expect, err := os.ReadFile(filepath.Join(samples, "vecadd-expected.bin"))
	w.check = func(out []byte) (string, bool) {
		if err != nil {
			return "not checked (no vecadd-expected.bin)", true
		}
		if bytes.Equal(out, expect) {
			return fmt.Sprintf("all %d sums equal vecadd-expected.bin", len(out)/4), true
		}
		return fmt.Sprintf("output (%d bytes) differs from vecadd-expected.bin (%d bytes)", len(out), len(expect)), false
	}
	return w, nil
}

// firstDigit is the first digit of the committed held-out set (or of the
// converted MNIST set) and the file it came from. Every benchmark of the
// CNN sends it as its model expects it (Digit.Input: 784 float32 pixels
// k/255): the file's raw bytes read as floats are mostly denormals, on
// which the host kernels run several times slower than on a digit.
func firstDigit(repo string) (*digits.Digit, string, error) {
	var err error
	for _, p := range []string{filepath.Join(repo, "samples", "cnn", "testdata", "heldout.bin"), filepath.Join(repo, "build", "mnist", "digits.bin")} {
		var ds []digits.Digit
		if ds, err = digits.ReadFile(p); err == nil && len(ds) > 0 {
			return &ds[0], p, nil
		}
	}
	return nil, "", fmt.Errorf("no digit to send: %v", err)
}

// cnnWorkload sends one MNIST digit as 784 float32s, the first of the
// committed held-out set (or of the converted MNIST set).
func cnnWorkload(repo, samples, suffix string) (*workload, error) {
	w := &workload{Name: "cnn", Title: "CNN (MNIST), one 28×28 digit", Dir: filepath.Join(samples, "cnn-"+suffix), ref: pyCNN}
	d, src, err := firstDigit(repo)
	if err != nil {
		return w, err
	}
	label := int(d.Label)
	w.Input = d.Input()
	w.InputNote = fmt.Sprintf("the first digit of %s (label %d): 784 float32 (%s), response 10 float32", src, label, humanBytes(len(w.Input)))
	w.check = func(out []byte) (string, bool) {
		scores, err := model.DecodeScores(out)
		if err != nil {
			return err.Error(), false
		}
		if best := model.Argmax(scores); best != label {
			// A wrong guess on one digit is possible for a 97% network; the
			// timing is still valid, so report it rather than fail.
			return fmt.Sprintf("predicts %d, the digit's label is %d", best, label), true
		}
		return fmt.Sprintf("predicts %d, the digit's label", label), true
	}
	return w, nil
}

func humanBytes(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
