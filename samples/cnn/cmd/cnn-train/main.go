// Command cnn-train trains the CNN sample with per-sample SGD on the fixed
// 8,000-digit training split, reports accuracy on the other 2,000, and
// writes the bundle's constants (weights.bin) and the committed held-out
// digit file. The same seed and flags give byte-identical weights.
//
//	cnn-train -data build/mnist/digits.bin -seed 1 -epochs 20
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/plover-run/plover/samples/cnn/digits"
	"github.com/plover-run/plover/samples/cnn/model"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "cnn-train:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("cnn-train", flag.ContinueOnError)
	data := fs.String("data", "build/mnist/digits.bin", "converted MNIST digit file (make cnn-data)")
	seed := fs.Uint64("seed", 1, "seed for initial weights and sample order")
	epochs := fs.Int("epochs", 20, "passes over the training split")
	lr := fs.Float64("lr", 0.1, "SGD learning rate")
	weights := fs.String("weights", "samples/cnn/weights.bin", "weights file to write")
	heldout := fs.String("heldout", "samples/cnn/testdata/heldout.bin", "held-out digit file to write (empty: skip)")
	evalEvery := fs.Int("eval-every", 5, "report held-out accuracy every N epochs (0: only at the end)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: cnn-train [flags]\n\nTrains the CNN sample; see samples/cnn/README.md.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *epochs < 0 {
		return fmt.Errorf("-epochs %d", *epochs)
	}

	all, err := digits.ReadFile(*data)
	if err != nil {
		return err
	}
	trainDigits, testDigits := digits.Split(all)
	train := digits.Samples(trainDigits)
	fmt.Fprintf(stdout, "data %s: %d digits, %d train, %d held out; seed %d, %d epochs, lr %g\n",
		*data, len(all), len(trainDigits), len(testDigits), *seed, *epochs, *lr)

	rng := model.NewRNG(*seed)
	p := model.Init(rng)
	start := time.Now()
	for e := 1; e <= *epochs; e++ {
		loss, correct := p.Epoch(train, float32(*lr), rng)
		line := fmt.Sprintf("epoch %3d  loss %.4f  train %6.2f%%", e, loss, pct(correct, len(train)))
		// Held-out evaluation costs a fifth of an epoch, so it is sampled.
		if *evalEvery > 0 && e%*evalEvery == 0 {
			line += fmt.Sprintf("  held-out %6.2f%%", pct(digits.Accuracy(p, testDigits), len(testDigits)))
		}
		fmt.Fprintf(stdout, "%s  %s\n", line, time.Since(start).Round(time.Second))
	}
	held := digits.Accuracy(p, testDigits)
	fmt.Fprintf(stdout, "held-out accuracy: %.2f%% (%d/%d) after %d epochs, seed %d, %s\n",
		pct(held, len(testDigits)), held, len(testDigits), *epochs, *seed, time.Since(start).Round(time.Second))

	if err := p.Save(*weights); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s\n", *weights)
	if *heldout != "" {
		committed := digits.Committed(testDigits)
		if err := digits.WriteFile(*heldout, committed); err != nil {
			return err
		}
		c := digits.Accuracy(p, committed)
		fmt.Fprintf(stdout, "wrote %s: %d held-out digits, accuracy %.2f%% (%d/%d)\n",
			*heldout, len(committed), pct(c, len(committed)), c, len(committed))
	}
	return nil
}

func pct(n, of int) float64 {
	if of == 0 {
		return 0
	}
	return 100 * float64(n) / float64(of)
}
