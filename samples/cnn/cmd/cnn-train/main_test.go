package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/plover-run/plover/samples/cnn/digits"
	"github.com/plover-run/plover/samples/cnn/model"
)

// TestDeterministic runs the trainer on a tiny data set: the same seed
// must write byte-identical weights, another seed different ones.
func TestDeterministic(t *testing.T) {
	ds, err := digits.ReadFile("../../testdata/heldout.bin")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	data := filepath.Join(dir, "tiny.bin")
	if err := digits.WriteFile(data, ds[:100]); err != nil {
		t.Fatal(err)
	}
	train := func(name, seed string) []byte {
		t.Helper()
		w, h := filepath.Join(dir, name+".weights"), filepath.Join(dir, name+".heldout")
		var out bytes.Buffer
		if err := run([]string{"-data", data, "-seed", seed, "-epochs", "2", "-weights", w, "-heldout", h}, &out); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), "held-out accuracy:") || !strings.Contains(out.String(), "80 train, 20 held out") {
			t.Errorf("unexpected output:\n%s", out.String())
		}
		b, err := os.ReadFile(w)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) != model.WeightsBytes {
			t.Fatalf("weights are %d bytes", len(b))
		}
		held, err := digits.ReadFile(h)
		if err != nil || len(held) != 5 { // every 4th of the 20 held out
			t.Fatalf("held-out file: %d digits, %v", len(held), err)
		}
		return b
	}
	a, b, c := train("a", "3"), train("b", "3"), train("c", "4")
	if !bytes.Equal(a, b) {
		t.Error("seed 3 twice gave different weights")
	}
	if bytes.Equal(a, c) {
		t.Error("seeds 3 and 4 gave identical weights")
	}
}

func TestFlags(t *testing.T) {
	for _, args := range [][]string{{"extra"}, {"-epochs", "-1"}, {"-data", "/nonexistent"}} {
		if err := run(args, &bytes.Buffer{}); err == nil {
			t.Errorf("run(%q): no error", args)
		}
	}
}
