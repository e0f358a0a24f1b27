package main

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

func TestWaitingPieces(t *testing.T) {
	text := `# HELP plover_io_pieces ...
plover_io_pieces{function="vecadd-a",state="moving"} 2
plover_io_pieces{function="vecadd-a",state="waiting"} 3
plover_io_pieces{function="vecadd-ab",state="waiting"} 7
plover_io_pieces_other{function="vecadd-b",state="waiting"} 9
plover_io_pieces{state="waiting",function="vecadd-b"} 1
`
	for fn, want := range map[string]float64{"vecadd-a": 3, "vecadd-ab": 7, "vecadd-b": 1, "cnn": 0} {
		if got := metricValue(text, "plover_io_pieces", fn, "waiting"); got != want {
			t.Errorf("%s: %v, want %v", fn, got, want)
		}
	}
}

// contention counts the readings in which both functions wait, of those
// it made, until its context ends (none made: NaN), and a's part of the
// I/O time charged between two such readings in a row, not across a
// reading in which one waited alone.
func TestContention(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Readings go in threes: both waiting, both waiting, a alone.
		// Between the first two a is charged 3 ms and b 1 ms; into
		// and out of the third, b alone 10 ms and then 10 ms more.
		k := n.Add(1)
		b, ia, ib := 1, 3*(k/3)+3*min(k%3, 1), 21*(k/3)+min(k%3, 1)
		if k%3 == 2 {
			b, ib = 0, 21*(k/3)+11
		}
		fmt.Fprintf(w, "plover_io_pieces{function=\"a\",state=\"waiting\"} 1\nplover_io_pieces{function=\"b\",state=\"waiting\"} %d\n", b)
		fmt.Fprintf(w, "plover_io_seconds_total{function=\"a\"} %g\nplover_io_seconds_total{function=\"b\"} %g\n", float64(ia)/1000, float64(ib)/1000)
	}))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan contended)
	go func() { done <- contention(ctx, srv.URL, "a", "b", time.Millisecond) }()
	for n.Load() < 30 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	got := <-done
	if math.Abs(got.Both-2.0/3) > 0.1 {
		t.Errorf("both waiting in %.2f of the readings, want about two thirds", got.Both)
	}
	if math.Abs(got.IOA-0.75) > 0.05 {
		t.Errorf("a's part of the I/O time while both waited %.3f, want 0.75 (b's time while a waited alone left out)", got.IOA)
	}
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	if got := contention(ctx, srv.URL, "a", "b", time.Hour); !math.IsNaN(got.Both) || got.IOA != 0 {
		t.Fatalf("no reading: %+v, want NaN and 0", got)
	}
}
