// Command gen writes the softmax sample's data: the constants file (W then
// b, float32), a request of -rows rows, and the expected response (the Go
// reference's probabilities, float32; the bundle's agree to about 1e-6, not
// bit for bit). Everything is deterministic.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/plover-run/plover/samples/softmax/model"
)

func main() {
	weights := flag.String("weights", "", "write the constants file (weights.bin) here")
	input := flag.String("input", "", "write a request here")
	expect := flag.String("expect", "", "write the expected response here")
	rows := flag.Int("rows", 8, fmt.Sprintf("rows in the request (1..%d)", model.MaxRows))
	seed := flag.Uint64("seed", 1, "weights seed")
	flag.Parse()
	if *rows < 1 || *rows > model.MaxRows {
		fail(fmt.Errorf("-rows %d: want 1..%d", *rows, model.MaxRows))
	}
	p := model.NewParams(*seed)
	in := model.Input(*rows, *seed+1)
	probs, err := model.Forward(p, in)
	if err != nil {
		fail(err)
	}
	for _, f := range []struct {
		path string
		data []byte
	}{{*weights, p.Bytes()}, {*input, in}, {*expect, model.Float32Bytes(probs)}} {
		if f.path == "" {
			continue
		}
		if err := os.WriteFile(f.path, f.data, 0o644); err != nil {
			fail(err)
		}
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "gen:", err)
	os.Exit(1)
}
