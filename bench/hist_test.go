package bench

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestBucketsAreContiguous(t *testing.T) {
	prevHi := int64(0)
	for i := 0; i < nBuckets; i++ {
		lo, hi := bucketRange(i)
		if lo != prevHi {
			t.Fatalf("bucket %d starts at %d, previous ended at %d", i, lo, prevHi)
		}
		if hi <= lo && i != nBuckets-1 {
			t.Fatalf("bucket %d is empty: [%d,%d)", i, lo, hi)
		}
		if bucketOf(lo) != i || (hi-1 >= lo && bucketOf(hi-1) != i) {
			t.Fatalf("bucket %d [%d,%d): bucketOf(lo)=%d bucketOf(hi-1)=%d", i, lo, hi, bucketOf(lo), bucketOf(hi-1))
		}
		prevHi = hi
		if i == nBuckets-1 {
			break
		}
	}
	if b := bucketOf(1<<63 - 1); b != nBuckets-1 {
		t.Fatalf("largest value in bucket %d, want %d", b, nBuckets-1)
	}
}

// The histogram's percentiles must agree with sorting the samples, within
// its stated resolution.
func TestQuantileMatchesSortedSamples(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 2, 7, 100, 10000} {
		var h Histogram
		vals := make([]int64, n)
		for i := range vals {
			// log-uniform from 1µs to 10s: every magnitude the tool sees
			v := int64(1000 * math.Pow(10, rng.Float64()*7))
			vals[i] = v
			h.Record(time.Duration(v))
		}
		slices.Sort(vals)
		for _, q := range []float64{0, 0.5, 0.9, 0.99, 0.999, 1} {
			rank := int(math.Ceil(q * float64(n)))
			if rank < 1 {
				rank = 1
			}
			want := vals[rank-1]
			got := int64(h.Quantile(q))
			if d := got - want; d > want/256+1 || -d > want/256+1 {
				t.Errorf("n=%d q=%v: got %d, sorted samples say %d", n, q, got, want)
			}
		}
		if int64(h.Max()) != vals[n-1] || int64(h.Min()) != vals[0] {
			t.Errorf("n=%d: min/max %v/%v, want %d/%d", n, h.Min(), h.Max(), vals[0], vals[n-1])
		}
		var sum int64
		for _, v := range vals {
			sum += v
		}
		if int64(h.Mean()) != sum/int64(n) {
			t.Errorf("n=%d: mean %d, want %d", n, h.Mean(), sum/int64(n))
		}
	}
}

func TestHistogramSmallAndEmpty(t *testing.T) {
	var h Histogram
	if h.Quantile(0.5) != 0 || h.Mean() != 0 || h.Max() != 0 || h.Min() != 0 {
		t.Fatal("empty histogram should report zeros")
	}
	for _, v := range []time.Duration{3, 1, 2, -5} { // negative counts as 0
		h.Record(v)
	}
	if h.Quantile(0.5) != 1 || h.Quantile(1) != 3 || h.Min() != 0 {
		t.Fatalf("p50 %v p100 %v min %v", h.Quantile(0.5), h.Quantile(1), h.Min())
	}
}
