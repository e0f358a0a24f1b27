package model

import (
	"encoding/binary"
	"math"
	"testing"
)

// TestLayout pins weights.bin's byte offsets (README.md documents them and
// cnn.cu's W_*/B_* use them) by marking one value per field.
func TestLayout(t *testing.T) {
	var p Params
	p.C1W[0][0][0], p.C1W[5][4][4] = 1, 2
	p.C1B[0], p.C1B[5] = 3, 4
	p.S1W[0][0], p.S1W[3][3] = 5, 6
	p.S1B = 7
	p.FW[0][0], p.FW[0][1], p.FW[1][0], p.FW[9][215] = 8, 9, 10, 11
	p.FB[0], p.FB[9] = 12, 13
	b, err := p.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != 9372 {
		t.Fatalf("weights.bin is %d bytes, want 9372", len(b))
	}
	for _, c := range []struct {
		name   string
		offset int // bytes
		want   float32
	}{
		{"c1 w[0][0][0]", 0, 1},
		{"c1 w[5][4][4]", 596, 2},
		{"c1 b[0]", 600, 3},
		{"c1 b[5]", 620, 4},
		{"s1 w[0][0]", 624, 5},
		{"s1 w[3][3]", 684, 6},
		{"s1 b", 688, 7},
		{"f w[0][0]", 692, 8},
		{"f w[0][1]", 696, 9},
		{"f w[1][0]", 692 + 216*4, 10},
		{"f w[9][215]", 9328, 11},
		{"f b[0]", 9332, 12},
		{"f b[9]", 9368, 13},
	} {
		if got := math.Float32frombits(binary.LittleEndian.Uint32(b[c.offset:])); got != c.want {
			t.Errorf("%s at byte %d = %v, want %v", c.name, c.offset, got, c.want)
		}
	}
	for name, off := range map[string]int{"OffC1B": OffC1B * 4, "OffS1W": OffS1W * 4, "OffS1B": OffS1B * 4, "OffFW": OffFW * 4, "OffFB": OffFB * 4} {
		want := map[string]int{"OffC1B": 600, "OffS1W": 624, "OffS1B": 688, "OffFW": 692, "OffFB": 9332}[name]
		if off != want {
			t.Errorf("%s = byte %d, want %d", name, off, want)
		}
	}
	var q Params
	if err := q.UnmarshalBinary(b); err != nil || q != p {
		t.Errorf("round trip: err %v, equal %v", err, q == p)
	}
	if err := q.UnmarshalBinary(b[:len(b)-4]); err == nil {
		t.Error("short weights accepted")
	}
}

func testImage(r *RNG) *[Pixels]float32 {
	var img [Pixels]float32
	for i := range img {
		if r.Float32() < 0.3 {
			img[i] = r.Float32()
		}
	}
	return &img
}

// lossAt is the loss Backward reports, computed from a fresh forward pass
// in float64 so finite differences are not swamped by float32 rounding.
func lossAt(p *Params, in *[Pixels]float32, label int) float64 {
	var a Activations
	p.Forward(in, &a)
	var loss float64
	for o, v := range a.Out {
		if o == label {
			loss -= math.Log(float64(v))
		} else {
			loss -= math.Log(1 - float64(v))
		}
	}
	return loss
}

// TestGradient checks Backward against central finite differences for a
// sample of weights in every layer.
func TestGradient(t *testing.T) {
	r := NewRNG(7)
	p := Init(r)
	in := testImage(r)
	const label = 3
	var a Activations
	p.Forward(in, &a)
	g := new(Params)
	loss := p.Backward(in, &a, label, g)
	if d := math.Abs(loss - lossAt(p, in, label)); d > 1e-5 {
		t.Fatalf("Backward's loss %v differs from the forward loss by %v", loss, d)
	}
	pf, gf := p.floats(), g.floats()
	const h = 1e-2
	checked := 0
	for _, i := range []int{0, 7, 24, 149, OffC1B, OffC1B + 5, OffS1W, OffS1W + 9, OffS1B, OffFW, OffFW + 300, OffFW + 2159, OffFB, OffFB + 3, OffFB + 9} {
		orig := pf[i]
		pf[i] = orig + h
		up := lossAt(p, in, label)
		pf[i] = orig - h
		down := lossAt(p, in, label)
		pf[i] = orig
		num := (up - down) / (2 * h)
		if diff := math.Abs(num - float64(gf[i])); diff > 2e-3+0.02*math.Abs(num) {
			t.Errorf("weight %d: analytic gradient %.6f, numeric %.6f", i, gf[i], num)
		}
		checked++
	}
	t.Logf("checked %d weights", checked)
}

func TestStepClearsGradient(t *testing.T) {
	p, g := new(Params), new(Params)
	g.FB[2], g.C1W[1][2][3] = 1, -2
	p.Step(g, 0.5)
	if p.FB[2] != -0.5 || p.C1W[1][2][3] != 1 {
		t.Errorf("step: FB[2] = %v, C1W[1][2][3] = %v", p.FB[2], p.C1W[1][2][3])
	}
	if *g != (Params{}) {
		t.Error("gradient not cleared")
	}
}

func TestArgmax(t *testing.T) {
	for _, c := range []struct {
		scores [Classes]float32
		want   int
	}{
		{[Classes]float32{}, 0},
		{[Classes]float32{9: 1}, 9},
		{[Classes]float32{0.1, 0.9, 0.9, 0.2}, 1},
	} {
		if got := Argmax(c.scores); got != c.want {
			t.Errorf("Argmax(%v) = %d, want %d", c.scores, got, c.want)
		}
	}
}

// TestTrainingDeterministic: the same seed gives identical weights, a
// different seed does not.
func TestTrainingDeterministic(t *testing.T) {
	data := make([]Sample, 40)
	r := NewRNG(99)
	for i := range data {
		data[i] = Sample{Image: testImage(r), Label: i % Classes}
	}
	train := func(seed uint64) []byte {
		rng := NewRNG(seed)
		p := Init(rng)
		for range 2 {
			p.Epoch(data, 0.1, rng)
		}
		b, _ := p.MarshalBinary()
		return b
	}
	a, b, c := train(5), train(5), train(6)
	if string(a) != string(b) {
		t.Error("same seed gave different weights")
	}
	if string(a) == string(c) {
		t.Error("different seeds gave identical weights")
	}
}

func TestDecodeScores(t *testing.T) {
	out := make([]byte, 4*Classes)
	for i := 0; i < Classes; i++ {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(float32(i)/10))
	}
	s, err := DecodeScores(out)
	if err != nil || s[3] != 0.3 || Argmax(s) != Classes-1 {
		t.Fatalf("DecodeScores = %v, %v", s, err)
	}
	if _, err := DecodeScores(out[:39]); err == nil {
		t.Fatal("39 bytes accepted")
	}
}
