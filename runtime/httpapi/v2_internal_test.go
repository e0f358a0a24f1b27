package httpapi

import (
	"math"
	"testing"
)

func TestFloat16(t *testing.T) {
	for _, tt := range []struct {
		f    float32
		bits uint16
	}{
		{0, 0x0000}, {1, 0x3c00}, {-2, 0xc000}, {0.5, 0x3800}, {65504, 0x7bff},
		{1e6, 0x7c00}, {float32(math.Inf(-1)), 0xfc00}, {5.960464477539063e-08, 0x0001}, {0.333251953125, 0x3555},
	} {
		if got := float16bits(tt.f); got != tt.bits {
			t.Errorf("float16bits(%v) = %#04x, want %#04x", tt.f, got, tt.bits)
		}
		if back := float16to32(tt.bits); tt.f < 65520 && tt.f > -65520 && back != tt.f {
			t.Errorf("float16to32(%#04x) = %v, want %v", tt.bits, back, tt.f)
		}
	}
}
