package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"flag"
	"image"
	"image/color"
	"image/png"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/plover-run/plover/samples/cnn/digits"
	"github.com/plover-run/plover/samples/cnn/model"
)

var update = flag.Bool("update", false, "rewrite the demo PNGs in samples/cnn/testdata from the held-out file")

// demoIndex is the held-out digit rendered as the demo PNGs: a 7.
const demoIndex = 353

const (
	heldoutFile = "../../testdata/heldout.bin"
	weightsFile = "../../weights.bin"
	demoMNIST   = "../../testdata/digit7.png"       // 28×28, white ink on black, as MNIST
	demoPaper   = "../../testdata/digit7-paper.png" // 84×84, black ink on white
)

// mnistImage renders a digit as 8-bit gray, optionally on paper (inverted)
// and scaled up by an integer factor.
func mnistImage(d *digits.Digit, scale int, paper bool) *image.Gray {
	img := image.NewGray(image.Rect(0, 0, 28*scale, 28*scale))
	for y := range 28 * scale {
		for x := range 28 * scale {
			k := d.Pixels[(y/scale)*28+x/scale]
			if paper {
				k = 255 - k
			}
			img.SetGray(x, y, color.Gray{Y: k})
		}
	}
	return img
}

func heldout(t *testing.T) []digits.Digit {
	t.Helper()
	ds, err := digits.ReadFile(heldoutFile)
	if err != nil {
		t.Fatal(err)
	}
	return ds
}

// TestPreprocess: images of an MNIST digit in either polarity, at several
// sizes, come back as exactly the digit's network input; other shapes and
// alpha behave as documented.
func TestPreprocess(t *testing.T) {
	d := &heldout(t)[demoIndex]
	want := *d.Image()

	exact := []struct {
		name         string
		img          image.Image
		wantInverted bool
	}{
		{"28x28 white on black", mnistImage(d, 1, false), false},
		{"28x28 black on white", mnistImage(d, 1, true), true},
		{"112x112 white on black", mnistImage(d, 4, false), false},
		{"84x84 black on white", mnistImage(d, 3, true), true},
		{"84x84 as 16-bit RGBA", toRGBA64(mnistImage(d, 3, true)), true},
	}
	for _, c := range exact {
		t.Run(c.name, func(t *testing.T) {
			got, inverted, err := preprocess(c.img, false)
			if err != nil {
				t.Fatal(err)
			}
			if inverted != c.wantInverted {
				t.Errorf("inverted = %v, want %v", inverted, c.wantInverted)
			}
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("pixel %d = %v, want %v (exactly)", i, got[i], want[i])
				}
			}
		})
	}

	t.Run("downscale averages", func(t *testing.T) {
		// 56×56 checkerboard of 2×2 cells: every output pixel covers one
		// whole cell, so they are 0 or 1; a 1-pixel checkerboard averages
		// to 0.5 everywhere.
		for _, c := range []struct {
			cell int
			want func(x, y int) float32
		}{
			{2, func(x, y int) float32 { return float32((x + y) % 2) }},
			{1, func(x, y int) float32 { return 0.5 }},
		} {
			img := image.NewGray(image.Rect(0, 0, 56, 56))
			for y := range 56 {
				for x := range 56 {
					if (x/c.cell+y/c.cell)%2 == 1 {
						img.SetGray(x, y, color.Gray{Y: 255})
					}
				}
			}
			got, inverted, err := preprocess(img, false)
			if err != nil {
				t.Fatal(err)
			}
			for i, v := range got {
				w := c.want(i%28, i/28)
				if inverted { // half the border is ink: either polarity is fair
					w = 1 - w
				}
				if math.Abs(float64(v-w)) > 1e-6 {
					t.Fatalf("cell %d: pixel (%d,%d) = %v, want %v", c.cell, i%28, i/28, v, w)
				}
			}
		}
	})

	t.Run("non-square is padded, not stretched", func(t *testing.T) {
		// A 28 wide, 14 high all-ink image lands in rows 7..20.
		img := image.NewGray(image.Rect(0, 0, 28, 14))
		for i := range img.Pix {
			img.Pix[i] = 255
		}
		// An all-ink border would read as paper; frame it in background.
		for x := range 28 {
			img.Pix[x], img.Pix[13*28+x] = 0, 0
		}
		for y := range 14 {
			img.Pix[y*28], img.Pix[y*28+27] = 0, 0
		}
		got, inverted, err := preprocess(img, false)
		if err != nil || inverted {
			t.Fatalf("err %v, inverted %v", err, inverted)
		}
		for y := range 28 {
			ink := y >= 8 && y <= 19 // rows 1..12 of the image
			if v := got[y*28+14]; (v == 1) != ink {
				t.Errorf("row %d centre = %v, want ink %v", y, v, ink)
			}
		}
	})

	t.Run("transparent background counts as white", func(t *testing.T) {
		// Black ink on a transparent canvas, as drawing apps save it.
		img := image.NewNRGBA(image.Rect(0, 0, 28, 28))
		img.Set(14, 14, color.NRGBA{A: 255})
		got, inverted, err := preprocess(img, false)
		if err != nil {
			t.Fatal(err)
		}
		if !inverted || got[14*28+14] != 1 || got[0] != 0 {
			t.Errorf("inverted %v, ink %v, background %v; want true, 1, 0", inverted, got[14*28+14], got[0])
		}
	})

	t.Run("fit centres and scales the ink", func(t *testing.T) {
		// A 10×40 bar at the left of a 200×100 canvas becomes 5×20
		// centred: columns 11..15 (mass at 14 rounds the offset), rows 4..23.
		img := image.NewGray(image.Rect(0, 0, 200, 100))
		for y := 30; y < 70; y++ {
			for x := 5; x < 15; x++ {
				img.SetGray(x, y, color.Gray{Y: 255})
			}
		}
		got, _, err := preprocess(img, true)
		if err != nil {
			t.Fatal(err)
		}
		var mass, mx, my float64
		for i, v := range got {
			mass += float64(v)
			mx += float64(v) * (float64(i%28) + 0.5)
			my += float64(v) * (float64(i/28) + 0.5)
		}
		if math.Abs(mass-100) > 1e-3 {
			t.Errorf("ink mass %v, want 100 (a 5×20 bar)", mass)
		}
		if cx, cy := mx/mass, my/mass; math.Abs(cx-14) > 0.5 || math.Abs(cy-14) > 0.5 {
			t.Errorf("centre of mass (%.2f, %.2f), want within 0.5 of (14, 14)", cx, cy)
		}
		if _, _, err := preprocess(image.NewGray(image.Rect(0, 0, 5, 5)), true); err == nil {
			t.Error("fit of a blank image: no error")
		}
	})
}

func toRGBA64(src image.Image) *image.RGBA64 {
	b := src.Bounds()
	dst := image.NewRGBA64(b)
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			dst.Set(x, y, src.At(x, y))
		}
	}
	return dst
}

func writePNG(t *testing.T, path string, img image.Image) {
	t.Helper()
	var b bytes.Buffer
	if err := (&png.Encoder{CompressionLevel: png.BestCompression}).Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestDemoPNGs: the committed demo images decode to exactly held-out digit
// demoIndex, which the committed weights classify correctly. go test -update
// rewrites them.
func TestDemoPNGs(t *testing.T) {
	d := &heldout(t)[demoIndex]
	if *update {
		writePNG(t, demoMNIST, mnistImage(d, 1, false))
		writePNG(t, demoPaper, mnistImage(d, 3, true))
	}
	p, err := model.Load(weightsFile)
	if err != nil {
		t.Fatal(err)
	}
	if got := model.Argmax(p.Scores(d.Image())); got != int(d.Label) || d.Label != 7 {
		t.Fatalf("held-out digit %d is a %d classified as %d; pick a correctly classified 7 and run go test -update", demoIndex, d.Label, got)
	}
	for _, path := range []string{demoMNIST, demoPaper} {
		img, err := loadImage(path)
		if err != nil {
			t.Fatal(err)
		}
		got, _, err := preprocess(img, false)
		if err != nil {
			t.Fatal(err)
		}
		if got != *d.Image() {
			t.Errorf("%s does not preprocess to held-out digit %d", path, demoIndex)
		}
	}
}

// fakeServer answers invoke requests by running the Go reference model, as
// a Plover server running the cnn bundle would.
func fakeServer(t *testing.T, p *model.Params) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/functions/cnn/invoke" {
			http.Error(w, "no such route "+r.Method+" "+r.URL.Path, http.StatusNotFound)
			return
		}
		if ct := r.Header.Get("Content-Type"); ct != "application/octet-stream" {
			http.Error(w, "content type "+ct, http.StatusUnsupportedMediaType)
			return
		}
		body, _ := io.ReadAll(r.Body)
		if len(body) != model.InputBytes {
			http.Error(w, "kernel failed: cnn: input must be 784 little-endian float32 (3136 bytes)", http.StatusInternalServerError)
			return
		}
		var in [model.Pixels]float32
		for i := range in {
			in[i] = math.Float32frombits(binary.LittleEndian.Uint32(body[4*i:]))
		}
		out := make([]byte, 0, model.OutBytes)
		for _, s := range p.Scores(&in) {
			out = binary.LittleEndian.AppendUint32(out, math.Float32bits(s))
		}
		w.Write(out)
	}))
}

func TestClassify(t *testing.T) {
	p, err := model.Load(weightsFile)
	if err != nil {
		t.Fatal(err)
	}
	srv := fakeServer(t, p)
	defer srv.Close()
	d := &heldout(t)[demoIndex]

	scores, err := classify(context.Background(), srv.Client(), srv.URL+"/", "", "cnn", *d.Image())
	if err != nil {
		t.Fatal(err)
	}
	if scores != p.Scores(d.Image()) {
		t.Errorf("scores %v, want the reference's %v", scores, p.Scores(d.Image()))
	}

	if _, err := classify(context.Background(), srv.Client(), srv.URL, "", "other", *d.Image()); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("unknown function: err %v, want the 404 reported", err)
	}

	short := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(make([]byte, 12)) }))
	defer short.Close()
	if _, err := classify(context.Background(), short.Client(), short.URL, "", "cnn", *d.Image()); err == nil || !strings.Contains(err.Error(), "12 bytes") {
		t.Errorf("short response: err %v", err)
	}
}

// TestRun drives the command as a user would: a PNG, a server, the output.
func TestRun(t *testing.T) {
	p, err := model.Load(weightsFile)
	if err != nil {
		t.Fatal(err)
	}
	srv := fakeServer(t, p)
	defer srv.Close()
	t.Setenv("PLOVER_SERVER", "http://127.0.0.1:1") // the flag must win

	for _, c := range []struct {
		name     string
		args     []string
		wantCode int
		wantOut  []string
		wantErr  string
	}{
		{"mnist png", []string{"--server", srv.URL, demoMNIST}, 0, []string{"predicted: 7\n", "  7  "}, ""},
		{"paper png", []string{"--server", srv.URL, "--show", demoPaper}, 0, []string{"predicted: 7\n", "light background inverted", "@@"}, ""},
		{"help", []string{"--help"}, 0, nil, "Example:"},
		{"no image", []string{"--server", srv.URL}, 2, nil, "usage:"},
		{"missing file", []string{"--server", srv.URL, "nope.png"}, 1, nil, "nope.png"},
		{"not an image", []string{"--server", srv.URL, "main.go"}, 1, nil, "unknown format"},
		{"server down", []string{demoMNIST}, 1, nil, "127.0.0.1:1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(c.args, &stdout, &stderr)
			if code != c.wantCode {
				t.Errorf("exit %d, want %d; stderr: %s", code, c.wantCode, stderr.String())
			}
			for _, w := range c.wantOut {
				if !strings.Contains(stdout.String(), w) {
					t.Errorf("stdout lacks %q:\n%s", w, stdout.String())
				}
			}
			if !strings.Contains(stderr.String(), c.wantErr) {
				t.Errorf("stderr lacks %q:\n%s", c.wantErr, stderr.String())
			}
		})
	}
}

// TestToken: the token comes from --token, else $PLOVER_TOKEN, and goes as
// Authorization: Bearer; without one a 401 says how to send one.
func TestToken(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if got := r.Header.Get("Authorization"); got != "Bearer sekrit" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="plover"`)
			http.Error(w, `{"error":{"code":"unauthenticated","message":"got `+got+`"}}`, http.StatusUnauthorized)
			return
		}
		w.Write(make([]byte, model.OutBytes))
	}))
	defer srv.Close()
	for _, c := range []struct {
		name, env string
		args      []string
		wantCode  int
		wantErr   string
	}{
		{"env", "sekrit", nil, 0, ""},
		{"flag", "", []string{"--token", "sekrit"}, 0, ""},
		{"flag wins", "stale", []string{"--token", "sekrit"}, 0, ""},
		{"wrong", "stale", nil, 1, "401"},
		{"none", "", nil, 1, "no token was sent: set $PLOVER_TOKEN or --token"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("PLOVER_TOKEN", c.env)
			var stdout, stderr bytes.Buffer
			args := append(append([]string{"--server", srv.URL}, c.args...), demoMNIST)
			if code := run(args, &stdout, &stderr); code != c.wantCode {
				t.Errorf("exit %d, want %d; stderr: %s", code, c.wantCode, stderr.String())
			}
			if !strings.Contains(stderr.String(), c.wantErr) {
				t.Errorf("stderr lacks %q:\n%s", c.wantErr, stderr.String())
			}
		})
	}
}
