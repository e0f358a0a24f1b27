// Command cnn-classify sends a digit image to a Plover server that runs the
// CNN sample and prints the predicted digit and the ten scores.
//
// It uses only the standard library, so it can be copied out as a starting
// point for a client of any Plover function.
package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"image"
	_ "image/gif"
	_ "image/jpeg"
	_ "image/png"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/plover-run/plover/samples/cnn/model"
)

const (
	side       = model.Side
	pixels     = model.Pixels
	classes    = model.Classes
	defaultURL = "http://127.0.0.1:8080"
)

const usage = `usage: cnn-classify [flags] IMAGE

Classifies a handwritten digit with the "cnn" sample function on a Plover
server. IMAGE is a PNG (JPEG and GIF also work) of any size. It is turned
into what the network was trained on: 28×28 grayscale, values 0..1, ink 1
on background 0 (MNIST's polarity). An image whose border is light (dark
ink on paper) is inverted first; transparent pixels count as white. A
non-square image is padded to a square with background, then box-filtered
to 28×28.

The request is POST {server}/v1/functions/{function}/invoke with 784
little-endian float32s; the response is 10 float32 scores and the
prediction is the highest.

A server with --auth-file needs a token with the invoke scope: set
PLOVER_TOKEN (or --token; the variable is better, flags show in ps), sent
as Authorization: Bearer TOKEN.

Example:
  cnn-classify --server http://127.0.0.1:8080 samples/cnn/testdata/digit7.png
  PLOVER_SERVER=http://gpu-box:8080 cnn-classify --fit --show my-digit.png

Flags:
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("cnn-classify", flag.ContinueOnError)
	fs.SetOutput(stderr)
	server := defaultURL
	if s := os.Getenv("PLOVER_SERVER"); s != "" {
		server = s
	}
	fs.StringVar(&server, "server", server, "Plover server URL (env PLOVER_SERVER)")
	token := os.Getenv("PLOVER_TOKEN")
	fs.StringVar(&token, "token", token, "bearer token for a server with --auth-file (env PLOVER_TOKEN; prefer the variable: flags show in ps)")
	function := fs.String("function", "cnn", "name the CNN sample is deployed under")
	fit := fs.Bool("fit", false, "normalise like MNIST: crop to the ink, scale it into 20×20, centre its mass in 28×28 (for drawings and photos)")
	show := fs.Bool("show", false, "print the 28×28 input the network sees")
	timeout := fs.Duration("timeout", 30*time.Second, "request timeout")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintln(stderr, "cnn-classify:", err)
		return 1
	}

	img, err := loadImage(fs.Arg(0))
	if err != nil {
		return fail(err)
	}
	in, inverted, err := preprocess(img, *fit)
	if err != nil {
		return fail(fmt.Errorf("%s: %w", fs.Arg(0), err))
	}
	if *show {
		fmt.Fprint(stdout, render(in))
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	start := time.Now()
	scores, err := classify(ctx, http.DefaultClient, server, token, *function, in)
	if err != nil {
		return fail(err)
	}
	elapsed := time.Since(start)

	best := model.Argmax(scores)
	fmt.Fprintf(stdout, "predicted: %d\n", best)
	note := ""
	if inverted {
		note = ", light background inverted"
	}
	fmt.Fprintf(stdout, "scores (%s, %s round trip%s):\n", fs.Arg(0), elapsed.Round(10*time.Microsecond), note)
	for d, s := range scores {
		mark := ""
		if d == best {
			mark = "  <-"
		}
		fmt.Fprintf(stdout, "  %d  %.6f%s\n", d, s, mark)
	}
	return 0
}

func loadImage(path string) (image.Image, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	img, _, err := image.Decode(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return img, nil
}

// gray is an image as ink-positive levels 0..65535, row-major.
type gray struct {
	w, h int
	v    []float64
}

func (g *gray) at(x, y int) float64 {
	if x < 0 || y < 0 || x >= g.w || y >= g.h {
		return 0 // outside is background
	}
	return g.v[y*g.w+x]
}

// toGray converts img to 16-bit luminance over white and inverts it when
// the border is light, so ink is high whatever the image's polarity. The
// integer arithmetic keeps an 8-bit level k at exactly k*257, which makes
// an MNIST digit saved as PNG come back as exactly k/255.
func toGray(img image.Image) (*gray, bool) {
	b := img.Bounds()
	g := &gray{w: b.Dx(), h: b.Dy(), v: make([]float64, b.Dx()*b.Dy())}
	for y := range g.h {
		for x := range g.w {
			r, gg, bb, a := img.At(b.Min.X+x, b.Min.Y+y).RGBA()
			// Premultiplied colour over white: add the uncovered part.
			lum := (19595*r + 38470*gg + 7471*bb + 1<<15) >> 16
			g.v[y*g.w+x] = float64(min(lum+(0xffff-a), 0xffff))
		}
	}
	var border float64
	n := 0
	for y := range g.h {
		for x := range g.w {
			if x == 0 || y == 0 || x == g.w-1 || y == g.h-1 {
				border += g.v[y*g.w+x]
				n++
			}
		}
	}
	invert := border/float64(n) > 0xffff/2
	if invert {
		for i, v := range g.v {
			g.v[i] = 0xffff - v
		}
	}
	return g, invert
}

// resample box-filters the square region of side size at (x0, y0) of g
// into an n×n grid, as ink-positive levels; area outside g is background.
func resample(g *gray, x0, y0, size float64, n int) []float64 {
	out := make([]float64, n*n)
	step := size / float64(n)
	for oy := range n {
		ylo, yhi := y0+float64(oy)*step, y0+float64(oy+1)*step
		for ox := range n {
			xlo, xhi := x0+float64(ox)*step, x0+float64(ox+1)*step
			var sum float64
			for y := int(math.Floor(ylo)); float64(y) < yhi; y++ {
				wy := math.Min(yhi, float64(y+1)) - math.Max(ylo, float64(y))
				for x := int(math.Floor(xlo)); float64(x) < xhi; x++ {
					wx := math.Min(xhi, float64(x+1)) - math.Max(xlo, float64(x))
					sum += wx * wy * g.at(x, y)
				}
			}
			out[oy*n+ox] = sum / (step * step)
		}
	}
	return out
}

// preprocess turns img into the network's input: 28×28, row-major, values
// in 0..1 with ink 1. It reports whether the image was inverted.
func preprocess(img image.Image, fit bool) ([pixels]float32, bool, error) {
	var in [pixels]float32
	g, inverted := toGray(img)
	if g.w == 0 || g.h == 0 {
		return in, inverted, errors.New("empty image")
	}
	var levels []float64
	if fit {
		var err error
		if levels, err = fitMNIST(g); err != nil {
			return in, inverted, err
		}
	} else {
		size := float64(max(g.w, g.h))
		levels = resample(g, (float64(g.w)-size)/2, (float64(g.h)-size)/2, size, side)
	}
	for i, v := range levels {
		in[i] = float32(min(max(v, 0), 0xffff) / 0xffff)
	}
	return in, inverted, nil
}

// fitMNIST normalises like the MNIST set was made: the ink's bounding box,
// scaled (aspect kept) to fit 20×20, placed in 28×28 with its centre of mass
// at the centre.
func fitMNIST(g *gray) ([]float64, error) {
	peak := 0.0
	for _, v := range g.v {
		peak = max(peak, v)
	}
	if peak == 0 {
		return nil, errors.New("no ink found")
	}
	x0, y0, x1, y1 := g.w, g.h, -1, -1
	for y := range g.h {
		for x := range g.w {
			if g.v[y*g.w+x] >= peak/5 {
				x0, y0, x1, y1 = min(x0, x), min(y0, y), max(x1, x), max(y1, y)
			}
		}
	}
	bw, bh := float64(x1-x0+1), float64(y1-y0+1)
	size := max(bw, bh)
	box := resample(g, float64(x0)-(size-bw)/2, float64(y0)-(size-bh)/2, size, 20)
	var mass, mx, my float64
	for y := range 20 {
		for x := range 20 {
			v := box[y*20+x]
			mass += v
			mx += v * (float64(x) + 0.5)
			my += v * (float64(y) + 0.5)
		}
	}
	offX := min(max(int(math.Round(side/2-mx/mass)), 0), side-20)
	offY := min(max(int(math.Round(side/2-my/mass)), 0), side-20)
	out := make([]float64, pixels)
	for y := range 20 {
		copy(out[(y+offY)*side+offX:], box[y*20:(y+1)*20])
	}
	return out, nil
}

// classify POSTs the input, with token as a bearer token unless it is
// empty, and decodes the 10 scores.
func classify(ctx context.Context, client *http.Client, server, token, function string, in [pixels]float32) ([classes]float32, error) {
	var scores [classes]float32
	body := make([]byte, 0, 4*pixels)
	for _, v := range in {
		body = binary.LittleEndian.AppendUint32(body, math.Float32bits(v))
	}
	u := strings.TrimRight(server, "/") + "/v1/functions/" + url.PathEscape(function) + "/invoke"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return scores, err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return scores, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return scores, fmt.Errorf("POST %s: reading response: %w", u, err)
	}
	if resp.StatusCode != http.StatusOK {
		msg := strings.TrimSpace(string(out))
		if len(msg) > 500 {
			msg = msg[:500] + "…"
		}
		if resp.StatusCode == http.StatusUnauthorized && token == "" {
			msg += " (no token was sent: set $PLOVER_TOKEN or --token)"
		}
		return scores, fmt.Errorf("POST %s: %s: %s", u, resp.Status, msg)
	}
	if scores, err = model.DecodeScores(out); err != nil {
		return scores, fmt.Errorf("POST %s: %w; is %q the cnn sample?", u, err, function)
	}
	return scores, nil
}

// render draws the input as text, darkest to brightest ink.
func render(in [pixels]float32) string {
	const ramp = " .:-=+*#%@"
	var b strings.Builder
	for y := range side {
		for x := range side {
			i := int(in[y*side+x] * float32(len(ramp)-1))
			c := ramp[min(max(i, 0), len(ramp)-1)]
			b.WriteByte(c)
			b.WriteByte(c)
		}
		b.WriteByte('\n')
	}
	return b.String()
}
