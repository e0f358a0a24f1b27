package bench

import (
	"fmt"
	"html"
	"math"
	"strconv"
	"strings"
)

// SVG is a self-contained SVG chart being written: what plover bench's
// latency histogram (HistogramSVG) and plover-bench-suite's load charts
// share.
type SVG struct{ b strings.Builder }

// NewSVG starts a w×h chart on white with a bold title and a grey
// subtitle at x = left.
func NewSVG(w, h float64, title, subtitle string, left float64) *SVG {
	s := &SVG{}
	s.Printf(`<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" viewBox="0 0 %g %g" font-family="sans-serif" font-size="12">`+"\n", w, h, w, h)
	s.Printf(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	s.Printf(`<text x="%g" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", left, Esc(title))
	s.Printf(`<text x="%g" y="40" fill="#555">%s</text>`+"\n", left, Esc(subtitle))
	return s
}

// Printf appends to the chart; text in it must go through Esc.
func (s *SVG) Printf(format string, a ...any) { fmt.Fprintf(&s.b, format, a...) }

// String closes the chart and returns it.
func (s *SVG) String() string { return s.b.String() + "</svg>\n" }

// Esc escapes text for SVG.
func Esc(s string) string { return html.EscapeString(s) }

// NiceCeil rounds v up to 1, 2 or 5 times a power of ten.
func NiceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	e := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*e >= v {
			return m * e
		}
	}
	return 10 * e
}

// Ticks are 0, step, 2·step, ... up to max.
func Ticks(max, step float64) []float64 {
	var out []float64
	for i := 0.0; i*step <= max*(1+1e-9); i++ {
		out = append(out, i*step)
	}
	return out
}

// LogTick is a grid line of a log axis; Major ones are powers of ten.
type LogTick struct {
	V     float64
	Major bool
}

// LogTicks are 1, 2 and 5 times each power of ten from 10^lo up to 10^hi.
func LogTicks(lo, hi float64) []LogTick {
	var out []LogTick
	for e := lo; e <= hi; e++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, e)
			if math.Log10(v) > hi+1e-9 {
				continue
			}
			out = append(out, LogTick{V: v, Major: m == 1})
		}
	}
	return out
}

// HistogramSVG draws a run's client latency distribution (its
// LatencyHistogram) as bars over a log latency axis, with p50, p90 and
// p99 marked. It returns "" when the run has no successful response.
func HistogramSVG(res *Result) string {
	bins := res.LatencyHistogram
	if len(bins) == 0 {
		return ""
	}
	const (
		W, H                   = 760.0, 420.0
		left, right, top, bott = 72.0, 24.0, 58.0, 62.0
	)
	pw, ph := W-left-right, H-top-bott
	var peak int64
	for _, b := range bins {
		peak = max(peak, b.Count)
	}
	yStep := NiceCeil(float64(peak) / 5)
	yMax := yStep * math.Ceil(float64(peak)/yStep)
	lo, hi := math.Log10(bins[0].LoMs), math.Log10(bins[len(bins)-1].HiMs)
	x := func(ms float64) float64 { return left + pw*(math.Log10(ms)-lo)/(hi-lo) }
	y := func(n float64) float64 { return top + ph*(1-n/yMax) }

	mode := fmt.Sprintf("closed loop, %d connection%s", res.Concurrency, plural(res.Concurrency))
	if res.Mode == "open" {
		mode = fmt.Sprintf("open loop at %g req/s", res.Rate)
	}
	s := NewSVG(W, H, fmt.Sprintf("%s: client latency of %d successful requests", res.Function, res.Latency.N),
		fmt.Sprintf("%s, %s, %d-byte input; plover bench", res.Server, mode, res.InputBytes), left)

	for _, v := range Ticks(yMax, yStep) {
		s.Printf(`<line x1="%g" y1="%.1f" x2="%g" y2="%.1f" stroke="#eee"/>`+"\n", left, y(v), left+pw, y(v))
		s.Printf(`<text x="%g" y="%.1f" text-anchor="end" dominant-baseline="middle">%s</text>`+"\n", left-6, y(v), strconv.FormatFloat(v, 'f', -1, 64))
	}
	for _, t := range LogTicks(math.Floor(lo), math.Ceil(hi)) {
		if l := math.Log10(t.V); l < lo-1e-9 || l > hi+1e-9 {
			continue
		}
		stroke := "#eee"
		if t.Major {
			stroke = "#ccc"
		}
		s.Printf(`<line x1="%.1f" y1="%g" x2="%.1f" y2="%g" stroke="%s"/>`+"\n", x(t.V), top, x(t.V), top+ph, stroke)
		s.Printf(`<text x="%.1f" y="%g" text-anchor="middle">%s</text>`+"\n", x(t.V), top+ph+18, Esc(FormatDuration(t.V)))
	}
	for _, b := range bins {
		if b.Count == 0 {
			continue
		}
		x0, x1 := x(b.LoMs), x(b.HiMs)
		s.Printf(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#1f77b4" stroke="white"><title>%s</title></rect>`+"\n",
			x0, y(float64(b.Count)), x1-x0, y(0)-y(float64(b.Count)),
			Esc(fmt.Sprintf("%s to %s: %d requests (%.1f%%)", FormatDuration(b.LoMs), FormatDuration(b.HiMs), b.Count, 100*float64(b.Count)/float64(res.Latency.N))))
	}
	for i, q := range []struct {
		name  string
		v     float64
		color string
	}{{"p50", res.Latency.P50, "#2ca02c"}, {"p90", res.Latency.P90, "#ff7f0e"}, {"p99", res.Latency.P99, "#d62728"}} {
		if q.v <= 0 || math.Log10(q.v) < lo || math.Log10(q.v) > hi {
			continue
		}
		s.Printf(`<line x1="%.1f" y1="%g" x2="%.1f" y2="%g" stroke="%s" stroke-width="1.5" stroke-dasharray="5 3"/>`+"\n", x(q.v), top, x(q.v), top+ph, q.color)
		s.Printf(`<text x="%.1f" y="%g" fill="%s" text-anchor="start">%s</text>`+"\n", x(q.v)+3, top+12+14*float64(i), q.color, Esc(q.name+" "+FormatDuration(q.v)))
	}
	s.Printf(`<rect x="%g" y="%g" width="%g" height="%g" fill="none" stroke="#333"/>`+"\n", left, top, pw, ph)
	s.Printf(`<text x="%g" y="%g" text-anchor="middle">latency (log scale)</text>`+"\n", left+pw/2, H-18)
	s.Printf(`<text transform="translate(18 %g) rotate(-90)" text-anchor="middle">requests</text>`+"\n", top+ph/2)
	return s.String()
}
