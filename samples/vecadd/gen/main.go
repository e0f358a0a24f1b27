// Command gen writes vecadd's data: the constants vector B, an input vector
// A and the expected output A+B, as little-endian float32. Values are
// deterministic so outputs can be compared byte for byte across devices.
package main

import (
	"encoding/binary"
	"flag"
	"fmt"
	"math"
	"os"
)

func main() {
	n := flag.Int("n", 1_000_000, "vector length")
	consts := flag.String("consts", "", "write B here")
	input := flag.String("input", "", "write A here")
	expect := flag.String("expect", "", "write A+B here")
	flag.Parse()
	a, b, c := make([]float32, *n), make([]float32, *n), make([]float32, *n)
	for i := range a {
		a[i] = float32(math.Sin(float64(i) * 0.001))
		b[i] = float32(i%1000) * 0.25
		c[i] = a[i] + b[i]
	}
	for _, f := range []struct {
		path string
		v    []float32
	}{{*consts, b}, {*input, a}, {*expect, c}} {
		if f.path == "" {
			continue
		}
		buf := make([]byte, 4*len(f.v))
		for i, x := range f.v {
			binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(x))
		}
		if err := os.WriteFile(f.path, buf, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "gen:", err)
			os.Exit(1)
		}
	}
}
