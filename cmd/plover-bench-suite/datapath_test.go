package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// shortDatapath shrinks the data path's blocks for a test.
func shortDatapath(t *testing.T) {
	r, b := dpRequests, dpBlockTime
	dpRequests, dpBlockTime = 5, 100*time.Millisecond
	t.Cleanup(func() { dpRequests, dpBlockTime = r, b })
}

// The data path's rounds take the targets in turn, the order reversed in
// every other round: the floor went last in every round, so whatever
// going last does fell on it alone.
func TestDatapathAlternatesOrder(t *testing.T) {
	shortDatapath(t)
	var mu sync.Mutex
	var seq []string
	target := func(name string) *dpTarget {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			if len(seq) == 0 || seq[len(seq)-1] != name {
				seq = append(seq, name)
			}
			mu.Unlock()
			w.Write([]byte("ok"))
		}))
		t.Cleanup(srv.Close)
		return &dpTarget{Name: name, url: srv.URL}
	}
	if err := dpMeasure(context.Background(), []*dpTarget{target("P"), target("F")}, &workload{Input: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	// Rounds P F | F P | P F | F P: the turns run together at the joins.
	if got := strings.Join(seq, ""); got != "PFPFP" {
		t.Fatalf("turns %q, want PFPFP (rounds PF, FP, PF, FP)", got)
	}
}

// A request that fails in a four-client block fails the run, as one in
// the one-client block does: its block's throughput counted the rest
// only, and nothing said so. The server fails a request only while
// another is in flight, so the one-client blocks all pass.
func TestDatapathFailsOnFourClientErrors(t *testing.T) {
	shortDatapath(t)
	var inFlight atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer inFlight.Add(-1)
		if inFlight.Add(1) > 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		time.Sleep(time.Millisecond)
		w.Write([]byte("ok"))
	}))
	defer srv.Close()
	err := dpMeasure(context.Background(), []*dpTarget{{Name: "plover", url: srv.URL}}, &workload{Input: []byte("x")})
	if err == nil || !strings.Contains(err.Error(), "4 clients") {
		t.Fatalf("err %v, want the four-client block's failures", err)
	}
}

// The payload-copy target says met or missed from the bytes copied, the
// 8 KiB explanation only where they are within it, and n/a for a build
// that does not count copies: it printed "-1 B per request, all of it
// the first 8 KiB" and the same sentence for any count, never a verdict.
func TestDatapathCopiedTarget(t *testing.T) {
	for _, tt := range []struct {
		copied float64
		want   string
	}{
		{-1, "payload copied 0 per request on the default path: n/a (this build does not count its copies).\n"},
		{0, "payload copied 0 per request on the default path: 0 B per request, met.\n"},
		{8192, "payload copied 0 per request on the default path: 8192 B per request, missed: at most the first 8 KiB of each body, which fasthttp reads with the headers before any handler runs and copies once into the slot.\n"},
		{0.5, "payload copied 0 per request on the default path: 0.5 B per request, missed: at most the first 8 KiB"},
		{4000000, "payload copied 0 per request on the default path: 4000000 B per request, missed.\n"},
	} {
		p := &dpTarget{Name: "plover", Client: []float64{1}, Thru: []float64{100}, Copied: tt.copied}
		floor := &dpTarget{Name: "floor", Client: []float64{1}, Thru: []float64{100}, Copied: -1}
		out := renderDatapath(&options{isolation: "process"}, &results{}, []*dpTarget{p, floor}, 1)
		if !strings.Contains(out, tt.want) {
			t.Errorf("copied %v: the targets' line lacks %q:\n%s", tt.copied, tt.want, out)
		}
	}
}
