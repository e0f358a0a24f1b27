// Package model is the softmax sample's layer in plain Go: the shapes and
// the weights layout shared with softmax.cu, deterministic weights and
// inputs, and the reference forward pass the bundle is tested against.
package model

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
)

// Shapes; softmax.cu's K_IN, N_OUT and MAX_ROWS must agree.
const (
	In      = 256 // features per row (K)
	Out     = 128 // classes per row (N)
	MaxRows = 64  // rows per request (M <= MaxRows)

	RowBytes      = 4 * In
	OutRowBytes   = 4 * Out
	WeightsBytes  = 4 * (In*Out + Out) // W (In×Out, row-major), then b (Out)
	MaxInputBytes = MaxRows * RowBytes
)

// Params are the layer's weights: W[k*Out+n] and b[n].
type Params struct {
	W []float32
	B []float32
}

// NewParams makes the weights from seed: W ~ N(0, 3/sqrt(In)) so that
// logits spread over a few units and the softmax is neither flat nor one-hot.
func NewParams(seed uint64) *Params {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	p := &Params{W: make([]float32, In*Out), B: make([]float32, Out)}
	for i := range p.W {
		p.W[i] = float32(rng.NormFloat64() * 3 / math.Sqrt(In))
	}
	for i := range p.B {
		p.B[i] = float32(rng.NormFloat64() * 0.5)
	}
	return p
}

// Bytes is the constants file: W then b, little-endian float32.
func (p *Params) Bytes() []byte {
	return f32Bytes(append(append([]float32{}, p.W...), p.B...))
}

// Input makes rows rows of In features in [-1, 1) from seed, as request bytes.
func Input(rows int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, 0x1a9e7))
	x := make([]float32, rows*In)
	for i := range x {
		x[i] = float32(rng.Float64()*2 - 1)
	}
	return f32Bytes(x)
}

// Forward is the chain's result for input (rows of In float32s): per row,
// logits = x·W + b summed in float32 in k order as the dense kernel does,
// then softmax in float64. The bundle's probabilities match it to within
// float32 rounding of expf and of the reductions' order.
func Forward(p *Params, input []byte) ([]float64, error) {
	if len(input) == 0 || len(input)%RowBytes != 0 || len(input) > MaxInputBytes {
		return nil, fmt.Errorf("input is %d bytes, want a positive multiple of %d up to %d", len(input), RowBytes, MaxInputBytes)
	}
	rows := len(input) / RowBytes
	out := make([]float64, rows*Out)
	logits := make([]float32, Out)
	for r := 0; r < rows; r++ {
		x := input[r*RowBytes:]
		for n := 0; n < Out; n++ {
			var acc float32
			for k := 0; k < In; k++ {
				xk := math.Float32frombits(binary.LittleEndian.Uint32(x[4*k:]))
				acc = float32(acc + float32(xk*p.W[k*Out+n])) // conversions: no fused multiply-add
			}
			logits[n] = float32(acc + p.B[n])
		}
		m := math.Inf(-1)
		for _, l := range logits {
			m = math.Max(m, float64(l))
		}
		sum := 0.0
		for n, l := range logits {
			out[r*Out+n] = math.Exp(float64(l) - m)
			sum += out[r*Out+n]
		}
		for n := range logits {
			out[r*Out+n] /= sum
		}
	}
	return out, nil
}

// Probabilities decodes the bundle's output: rows×Out float32s.
func Probabilities(out []byte) []float32 {
	v := make([]float32, len(out)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(out[4*i:]))
	}
	return v
}

func f32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

// Float32Bytes encodes v as little-endian float32s (the expected-output file).
func Float32Bytes(v []float64) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(x)))
	}
	return b
}
