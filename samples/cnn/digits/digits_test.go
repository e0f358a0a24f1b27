package digits

import (
	"bytes"
	"strings"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	ds := []Digit{{Label: 3}, {Label: 9}}
	ds[0].Pixels[0], ds[1].Pixels[783] = 255, 7
	var b bytes.Buffer
	if err := Write(&b, ds); err != nil {
		t.Fatal(err)
	}
	if b.Len() != 12+2*RecordBytes || !strings.HasPrefix(b.String(), Magic) {
		t.Fatalf("file is %d bytes starting %q", b.Len(), b.Bytes()[:8])
	}
	got, err := Read(bytes.NewReader(b.Bytes()))
	if err != nil || len(got) != 2 || got[0] != ds[0] || got[1] != ds[1] {
		t.Fatalf("read back %v, %v", len(got), err)
	}
	for name, bad := range map[string][]byte{
		"truncated": b.Bytes()[:b.Len()-1],
		"trailing":  append(bytes.Clone(b.Bytes()), 0),
		"magic":     append([]byte("XXXXXXXX"), b.Bytes()[8:]...),
		"label":     func() []byte { c := bytes.Clone(b.Bytes()); c[12] = 10; return c }(),
	} {
		if _, err := Read(bytes.NewReader(bad)); err == nil {
			t.Errorf("%s file accepted", name)
		}
	}
}

func TestValue(t *testing.T) {
	for _, c := range []struct {
		k    uint8
		want float32
	}{{0, 0}, {255, 1}, {51, 0.2}} {
		if got := Value(c.k); got != c.want {
			t.Errorf("Value(%d) = %v, want %v", c.k, got, c.want)
		}
	}
	d := Digit{}
	d.Pixels[1] = 255
	in := d.Input()
	if len(in) != 3136 || !bytes.Equal(in[4:8], []byte{0, 0, 0x80, 0x3f}) {
		t.Errorf("Input: %d bytes, pixel 1 = % x", len(in), in[4:8])
	}
}

func TestSplit(t *testing.T) {
	all := make([]Digit, 10000)
	for i := range all {
		all[i].Pixels[0] = uint8(i % 5)
	}
	train, held := Split(all)
	if len(train) != 8000 || len(held) != 2000 {
		t.Fatalf("split %d/%d, want 8000/2000", len(train), len(held))
	}
	for _, d := range held {
		if d.Pixels[0] != 4 {
			t.Fatal("held-out digit not from i%5 == 4")
		}
	}
	if n := len(Committed(held)); n != 500 {
		t.Errorf("committed %d, want 500", n)
	}
}
