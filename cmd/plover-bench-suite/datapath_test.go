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
