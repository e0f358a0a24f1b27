package bench

import (
	"math"
	"math/bits"
	"sort"
	"sync/atomic"
	"time"
)

// subBits sets the histogram's resolution: 2^subBits buckets per power of
// two, so a recorded value is known to within 1/2^subBits of itself (0.4%
// for 8) whatever its magnitude, from nanoseconds to hours.
const subBits = 8

const (
	subCount = 1 << subBits
	nBuckets = (64 - subBits) << subBits
)

// Histogram is a log-linear (HDR-style) histogram of non-negative durations
// in nanoseconds. Recording is lock-free and allocation-free, so every worker
// of a run records into the same Histogram; memory is fixed (≈ 110 KiB)
// however many values are recorded, which keeps a run's memory bounded
// independently of its request count.
type Histogram struct {
	counts [nBuckets]atomic.Uint64
	n      atomic.Int64
	sum    atomic.Int64
	max    atomic.Int64
	min    atomic.Int64 // stored as ^v so the zero value means "none yet"
}

func bucketOf(v int64) int {
	if v < subCount {
		return int(v)
	}
	shift := bits.Len64(uint64(v)) - subBits - 1
	return (shift+1)<<subBits + int(uint64(v)>>shift) - subCount
}

// bucketRange is the half-open range of values bucket i holds.
func bucketRange(i int) (lo, hi int64) {
	b, m := i>>subBits, int64(i&(subCount-1))
	if b == 0 {
		return m, m + 1
	}
	lo = (subCount + m) << (b - 1)
	return lo, lo + 1<<(b-1)
}

// Record adds one value; negative values count as 0.
func (h *Histogram) Record(d time.Duration) {
	v := int64(d)
	if v < 0 {
		v = 0
	}
	h.counts[bucketOf(v)].Add(1)
	h.n.Add(1)
	h.sum.Add(v)
	for {
		m := h.max.Load()
		if v <= m || h.max.CompareAndSwap(m, v) {
			break
		}
	}
	for {
		m := h.min.Load()
		if (m != 0 && v >= ^m) || h.min.CompareAndSwap(m, ^v) {
			break
		}
	}
}

// Count is the number of values recorded.
func (h *Histogram) Count() int64 { return h.n.Load() }

// Max is the largest value recorded, exactly.
func (h *Histogram) Max() time.Duration { return time.Duration(h.max.Load()) }

// Min is the smallest value recorded, exactly (0 when empty).
func (h *Histogram) Min() time.Duration {
	if m := h.min.Load(); m != 0 {
		return time.Duration(^m)
	}
	return 0
}

// Mean is the exact mean of the values recorded.
func (h *Histogram) Mean() time.Duration {
	n := h.n.Load()
	if n == 0 {
		return 0
	}
	return time.Duration(h.sum.Load() / n)
}

// Quantile returns the value at quantile q (0..1): the middle of the
// bucket holding the ceil(q·n)-th smallest value, clamped to the exact min
// and max. Call it after recording has stopped.
func (h *Histogram) Quantile(q float64) time.Duration {
	var total uint64
	for i := range h.counts {
		total += h.counts[i].Load()
	}
	if total == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(total)))
	if rank < 1 {
		rank = 1
	}
	if rank > total {
		rank = total
	}
	var seen uint64
	for i := range h.counts {
		seen += h.counts[i].Load()
		if seen >= rank {
			lo, hi := bucketRange(i)
			v := lo + (hi-lo-1)/2
			return min(max(time.Duration(v), h.Min()), h.Max())
		}
	}
	return h.Max()
}

// Bin is one bar of a distribution: the Count values in [LoMs, HiMs)
// milliseconds.
type Bin struct {
	LoMs  float64 `json:"lo_ms"`
	HiMs  float64 `json:"hi_ms"`
	Count int64   `json:"count"`
}

// binSteps are the edges within a decade, finest first: each list is
// spaced about evenly on a log scale, and every edge is a round number.
var binSteps = [][]float64{
	{1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8},
	{1, 1.5, 2, 3, 5, 7},
	{1, 2, 5},
	{1},
}

// LogBins groups the values recorded into at most maxBins bins spaced
// evenly on a log scale, with round edges (the finest of binSteps that
// fits), from the edge at or below Min to the edge above Max. Empty
// bins inside the range are kept: a gap is part of the shape. Call it
// after recording has stopped; nil when nothing was recorded.
func (h *Histogram) LogBins(maxBins int) []Bin {
	if h.Count() == 0 || maxBins < 1 {
		return nil
	}
	lo, hi := float64(max(h.Min(), 1)), float64(max(h.Max(), 1))
	var edges []float64
	for _, steps := range binSteps {
		edges = logEdges(lo, hi, steps)
		if len(edges)-1 <= maxBins {
			break
		}
	}
	bins := make([]Bin, len(edges)-1)
	for i := range bins {
		bins[i] = Bin{LoMs: edges[i] / 1e6, HiMs: edges[i+1] / 1e6}
	}
	for i := range h.counts {
		n := h.counts[i].Load()
		if n == 0 {
			continue
		}
		blo, bhi := bucketRange(i)
		v := float64(min(max(time.Duration(blo+(bhi-blo-1)/2), h.Min()), h.Max()))
		// The last edge at or below v; values below the first edge (a
		// bucket's middle below Min cannot be) go to the first bin.
		k := max(sort.Search(len(edges), func(i int) bool { return edges[i] > v })-1, 0) // the last edge at or below v
		bins[min(k, len(bins)-1)].Count += int64(n)
	}
	return bins
}

// logEdges are the edges m·10^e (m from steps) from the largest at or
// below lo to the smallest above hi.
func logEdges(lo, hi float64, steps []float64) []float64 {
	var edges []float64
	for e := math.Floor(math.Log10(lo)) - 1; ; e++ {
		p := math.Pow(10, e)
		for _, m := range steps {
			v := m * p
			if v <= lo {
				edges = append(edges[:0], v) // the start, so far
				continue
			}
			edges = append(edges, v)
			if v > hi {
				return edges
			}
		}
	}
}
