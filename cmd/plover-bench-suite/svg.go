package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/plover-run/plover/bench"
)

// renderChart draws p50, p90 and p99 latency against offered load as a
// self-contained SVG: a log latency axis, because latency past saturation
// is orders of magnitude above latency below it.
func renderChart(sw *sweepResult, r *results) string {
	var series []chartSeries
	for _, s := range []struct {
		name, color string
		get         func(*sweepPoint) float64
	}{
		{"p50", "#1f77b4", func(p *sweepPoint) float64 { return p.P50 }},
		{"p90", "#ff7f0e", func(p *sweepPoint) float64 { return p.P90 }},
		{"p99", "#d62728", func(p *sweepPoint) float64 { return p.P99 }},
	} {
		series = append(series, sweepSeries(s.name, s.color, false, sw.Points, s.get))
	}
	return drawChart(chart{
		title:    fmt.Sprintf("%s on the %s device: latency against offered load (open loop)", sw.Function, r.Device),
		subtitle: machineLine(r),
		vline:    sw.Capacity, vlabel: fmt.Sprintf("closed-loop throughput %.0f/s ", sw.Capacity),
		series: series, note: sw.Note,
	})
}

func machineLine(r *results) string {
	return fmt.Sprintf("%s, %d cores; %s; client and server on the same machine", r.Machine.CPU, r.Machine.Cores, r.Started.Format("2006-01-02"))
}

// sweepSeries is one latency percentile of a sweep as a chart line.
func sweepSeries(name, color string, dashed bool, pts []sweepPoint, get func(*sweepPoint) float64) chartSeries {
	s := chartSeries{name: name, color: color, dashed: dashed}
	for k := range pts {
		pt := &pts[k]
		s.points = append(s.points, chartPoint{x: pt.Offered, y: get(pt), hollow: pt.saturated(),
			tip: fmt.Sprintf("%s at %g/s: %s ms", name, pt.Offered, fmtMs(get(pt)))})
	}
	return s
}

type chart struct {
	title, subtitle string
	vline           float64 // a marked load (0: none)
	vlabel          string
	series          []chartSeries
	note            string
}

type chartSeries struct {
	name, color string
	dashed      bool
	points      []chartPoint
}

type chartPoint struct {
	x, y   float64
	hollow bool // the schedule was not kept here
	tip    string
}

// drawChart draws latency series against offered load.
func drawChart(c chart) string {
	const (
		W, H                   = 760.0, 460.0
		left, right, top, bott = 72.0, 170.0, 58.0, 62.0
	)
	pw, ph := W-left-right, H-top-bott
	xMax := c.vline
	yMin, yMax := math.Inf(1), math.Inf(-1)
	for _, s := range c.series {
		for _, p := range s.points {
			xMax = math.Max(xMax, p.x)
			if p.y > 0 {
				yMin, yMax = math.Min(yMin, p.y), math.Max(yMax, p.y)
			}
		}
	}
	if math.IsInf(yMin, 0) {
		yMin, yMax = 0.1, 1
	}
	step := bench.NiceCeil(xMax * 1.05 / 8)
	xMax = step * math.Ceil(xMax*1.05/step)
	lo, hi := math.Floor(math.Log10(yMin)), math.Ceil(math.Log10(yMax))
	if hi <= lo {
		hi = lo + 1
	}
	x := func(v float64) float64 { return left + pw*v/xMax }
	y := func(v float64) float64 {
		if v <= 0 {
			v = math.Pow(10, lo)
		}
		return top + ph*(1-(math.Log10(v)-lo)/(hi-lo))
	}

	svg := bench.NewSVG(W, H, c.title, c.subtitle, left)
	p := svg.Printf

	// Grid and axes.
	for _, t := range bench.LogTicks(lo, hi) {
		yy := y(t.V)
		stroke := "#eee"
		if t.Major {
			stroke = "#ccc"
		}
		p(`<line x1="%g" y1="%.1f" x2="%g" y2="%.1f" stroke="%s"/>`+"\n", left, yy, left+pw, yy, stroke)
		p(`<text x="%g" y="%.1f" text-anchor="end" dominant-baseline="middle">%s</text>`+"\n", left-6, yy, strconv.FormatFloat(t.V, 'g', 4, 64))
	}
	for _, v := range bench.Ticks(xMax, step) {
		xx := x(v)
		p(`<line x1="%.1f" y1="%g" x2="%.1f" y2="%g" stroke="#eee"/>`+"\n", xx, top, xx, top+ph)
		p(`<text x="%.1f" y="%g" text-anchor="middle">%g</text>`+"\n", xx, top+ph+18, v)
	}
	p(`<rect x="%g" y="%g" width="%g" height="%g" fill="none" stroke="#333"/>`+"\n", left, top, pw, ph)
	p(`<text x="%g" y="%g" text-anchor="middle">offered load (requests/s)</text>`+"\n", left+pw/2, H-18)
	p(`<text transform="translate(18 %g) rotate(-90)" text-anchor="middle">latency (ms, log scale)</text>`+"\n", top+ph/2)

	if c.vline > 0 {
		cx := x(c.vline)
		p(`<line x1="%.1f" y1="%g" x2="%.1f" y2="%g" stroke="#888" stroke-dasharray="5 4"/>`+"\n", cx, top, cx, top+ph)
		p(`<text x="%.1f" y="%g" fill="#555" text-anchor="end">%s</text>`+"\n", cx, top+14, bench.Esc(c.vlabel))
	}
	for i, s := range c.series {
		dash := ""
		if s.dashed {
			dash = ` stroke-dasharray="6 3"`
		}
		var pts []string
		for _, pt := range s.points {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(pt.x), y(pt.y)))
		}
		p(`<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", s.color, dash, strings.Join(pts, " "))
		for _, pt := range s.points {
			fill := s.color
			if pt.hollow {
				fill = "white"
			}
			p(`<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s" stroke="%s" stroke-width="1.5"><title>%s</title></circle>`+"\n",
				x(pt.x), y(pt.y), fill, s.color, bench.Esc(pt.tip))
		}
		ly := top + 10 + float64(i)*20
		p(`<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="%s" stroke-width="2"%s/>`+"\n", left+pw+16, ly, left+pw+40, ly, s.color, dash)
		p(`<text x="%g" y="%g" dominant-baseline="middle">%s</text>`+"\n", left+pw+46, ly, bench.Esc(s.name))
	}
	ly := top + 20 + float64(len(c.series))*20
	p(`<circle cx="%g" cy="%g" r="3.5" fill="white" stroke="#333" stroke-width="1.5"/>`+"\n", left+pw+28, ly)
	p(`<text x="%g" y="%g" dominant-baseline="middle">schedule not kept</text>`+"\n", left+pw+46, ly)
	p(`<text x="%g" y="%g" dominant-baseline="middle" fill="#555">(&gt;1%% unsent)</text>`+"\n", left+pw+46, ly+16)
	if c.note != "" {
		p(`<text x="%g" y="%g" fill="#a00">%s</text>`+"\n", left, H-2, bench.Esc(c.note))
	}
	return svg.String()
}
