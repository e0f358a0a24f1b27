// Package model is the CNN sample's network in plain Go loops: the weights
// layout shared with cnn.cu, the reference forward pass the bundle is tested
// against, and the per-sample SGD the trainer runs.
//
// The forward pass mirrors cnn.cu's fused kernels loop for loop, in float32
// with the same summation order, so the bundle's scores match it to within
// float32 rounding of the sigmoid (under 1e-6), not merely in the argmax.
package model

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"unsafe"
)

// Shapes.
const (
	Side    = 28 // input is Side×Side
	Pixels  = Side * Side
	C1Maps  = 6  // c1: 6 filters 5×5, stride 1
	C1K     = 5  //
	C1Side  = 24 // Side - C1K + 1
	S1K     = 4  // s1: one 4×4 filter, stride 4, per channel
	S1Side  = 6  // C1Side / S1K
	FCIn    = C1Maps * S1Side * S1Side
	Classes = 10
)

// Offsets into weights.bin, in float32s; cnn.cu's W_*/B_* must agree.
const (
	OffC1W     = 0
	OffC1B     = OffC1W + C1Maps*C1K*C1K // 150
	OffS1W     = OffC1B + C1Maps         // 156
	OffS1B     = OffS1W + S1K*S1K        // 172
	OffFW      = OffS1B + 1              // 173
	OffFB      = OffFW + Classes*FCIn    // 2333
	NumWeights = OffFB + Classes         // 2343

	WeightsBytes = NumWeights * 4
	InputBytes   = Pixels * 4
	OutBytes     = Classes * 4
)

// Params holds every weight and bias. Its fields are in weights.bin order
// and encoding/binary packs them without padding, so the struct is the file
// layout; TestLayout pins the offsets.
type Params struct {
	C1W [C1Maps][C1K][C1K]float32
	C1B [C1Maps]float32
	S1W [S1K][S1K]float32
	S1B float32
	FW  [Classes][FCIn]float32 // FW[o][c*36 + y*6 + x]
	FB  [Classes]float32
}

// MarshalBinary encodes p as weights.bin: 2343 little-endian float32s.
func (p *Params) MarshalBinary() ([]byte, error) {
	var b bytes.Buffer
	b.Grow(WeightsBytes)
	if err := binary.Write(&b, binary.LittleEndian, p); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// UnmarshalBinary decodes weights.bin; any length but 9372 bytes is an error,
// since a short or long file means a different layout, not fewer weights.
func (p *Params) UnmarshalBinary(data []byte) error {
	if len(data) != WeightsBytes {
		return fmt.Errorf("weights are %d bytes, want %d (%d float32)", len(data), WeightsBytes, NumWeights)
	}
	return binary.Read(bytes.NewReader(data), binary.LittleEndian, p)
}

// Load reads a weights file.
func Load(path string) (*Params, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	p := new(Params)
	if err := p.UnmarshalBinary(data); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}

// Save writes a weights file.
func (p *Params) Save(path string) error {
	data, err := p.MarshalBinary()
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

// Activations are every layer's outputs for one input; training needs them
// all for the backward pass.
type Activations struct {
	C1  [C1Maps][C1Side][C1Side]float32
	S1  [C1Maps][S1Side][S1Side]float32
	Out [Classes]float32
}

func sigmoid(x float32) float32 { return float32(1 / (1 + math.Exp(-float64(x)))) }

// Forward runs the network on one 28×28 image (row-major, ink 1, background
// 0) and fills a.
func (p *Params) Forward(in *[Pixels]float32, a *Activations) {
	for m := range C1Maps {
		for y := range C1Side {
			for x := range C1Side {
				var acc float32
				for i := range C1K {
					for j := range C1K {
						acc += p.C1W[m][i][j] * in[(y+i)*Side+x+j]
					}
				}
				a.C1[m][y][x] = sigmoid(acc + p.C1B[m])
			}
		}
	}
	for c := range C1Maps {
		for y := range S1Side {
			for x := range S1Side {
				var acc float32
				for i := range S1K {
					for j := range S1K {
						acc += p.S1W[i][j] * a.C1[c][y*S1K+i][x*S1K+j]
					}
				}
				a.S1[c][y][x] = sigmoid(acc + p.S1B)
			}
		}
	}
	s1 := flatS1(&a.S1)
	for o := range Classes {
		var acc float32
		for k := range FCIn {
			acc += p.FW[o][k] * s1[k]
		}
		a.Out[o] = sigmoid(acc + p.FB[o])
	}
}

func flatS1(s *[C1Maps][S1Side][S1Side]float32) *[FCIn]float32 {
	return (*[FCIn]float32)(unsafe.Pointer(s))
}

// Scores returns the 10 sigmoid scores for one image.
func (p *Params) Scores(in *[Pixels]float32) [Classes]float32 {
	var a Activations
	p.Forward(in, &a)
	return a.Out
}

// DecodeScores reads the cnn function's output: Classes little-endian
// float32 scores.
func DecodeScores(out []byte) ([Classes]float32, error) {
	var s [Classes]float32
	if len(out) != 4*Classes {
		return s, fmt.Errorf("output is %d bytes, want %d (%d float32 scores)", len(out), 4*Classes, Classes)
	}
	for i := range s {
		s[i] = math.Float32frombits(binary.LittleEndian.Uint32(out[4*i:]))
	}
	return s, nil
}

// Argmax is the predicted digit: the index of the highest score, the lowest
// index on ties.
func Argmax(scores [Classes]float32) int {
	best := 0
	for i, s := range scores {
		if s > scores[best] {
			best = i
		}
	}
	return best
}

// Backward adds to g the gradient, for input in with activations a (from
// Forward) and the true label, of the summed binary cross-entropy of the 10
// sigmoid outputs against the one-hot label. With that loss the output
// layer's error is simply out - target, as in CUDA-CNN's makeError.
// It returns the loss.
func (p *Params) Backward(in *[Pixels]float32, a *Activations, label int, g *Params) float64 {
	var loss float64
	var dF [Classes]float32 // dL/d preactivation of f
	for o := range Classes {
		var t float32
		if o == label {
			t = 1
		}
		out := float64(a.Out[o])
		if o == label {
			loss -= math.Log(max(out, 1e-12))
		} else {
			loss -= math.Log(max(1-out, 1e-12))
		}
		dF[o] = a.Out[o] - t
	}

	s1 := flatS1(&a.S1)
	var dS1 [FCIn]float32 // dL/d preactivation of s1
	for o := range Classes {
		g.FB[o] += dF[o]
		for k := range FCIn {
			g.FW[o][k] += dF[o] * s1[k]
			dS1[k] += p.FW[o][k] * dF[o]
		}
	}
	for k := range FCIn {
		dS1[k] *= s1[k] * (1 - s1[k])
	}

	var dC1 [C1Maps][C1Side][C1Side]float32 // dL/d preactivation of c1
	for c := range C1Maps {
		for y := range S1Side {
			for x := range S1Side {
				d := dS1[(c*S1Side+y)*S1Side+x]
				g.S1B += d
				for i := range S1K {
					for j := range S1K {
						v := a.C1[c][y*S1K+i][x*S1K+j]
						g.S1W[i][j] += d * v
						dC1[c][y*S1K+i][x*S1K+j] = p.S1W[i][j] * d * v * (1 - v)
					}
				}
			}
		}
	}

	for m := range C1Maps {
		for y := range C1Side {
			for x := range C1Side {
				d := dC1[m][y][x]
				g.C1B[m] += d
				for i := range C1K {
					for j := range C1K {
						g.C1W[m][i][j] += d * in[(y+i)*Side+x+j]
					}
				}
			}
		}
	}
	return loss
}

// Params must be exactly the 2343 floats with no padding for floats() to
// be valid; these fail to compile otherwise.
var (
	_ [unsafe.Sizeof(Params{}) - WeightsBytes]byte
	_ [WeightsBytes - unsafe.Sizeof(Params{})]byte
)

// floats views p as its 2343 values, in file order, so whole-model updates
// need no per-field loops.
func (p *Params) floats() *[NumWeights]float32 {
	return (*[NumWeights]float32)(unsafe.Pointer(p))
}

// Step applies p -= lr*g and clears g.
func (p *Params) Step(g *Params, lr float32) {
	pf, gf := p.floats(), g.floats()
	for i := range pf {
		pf[i] -= lr * gf[i]
		gf[i] = 0
	}
}
