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
		if got := waitingPieces(text, fn); got != want {
			t.Errorf("%s: %v, want %v", fn, got, want)
		}
	}
}

// bothWaiting counts the readings in which both functions wait, of those
// it made, until its context ends; none made is NaN.
func TestBothWaiting(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Readings alternate: both waiting, then a alone.
		b := 0
		if n.Add(1)%2 == 1 {
			b = 1
		}
		fmt.Fprintf(w, "plover_io_pieces{function=\"a\",state=\"waiting\"} 1\nplover_io_pieces{function=\"b\",state=\"waiting\"} %d\n", b)
	}))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan float64)
	go func() { done <- bothWaiting(ctx, srv.URL, "a", "b", time.Millisecond) }()
	for n.Load() < 20 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if got := <-done; math.Abs(got-0.5) > 0.1 {
		t.Fatalf("both waiting in %.2f of the readings, want about half", got)
	}
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	if got := bothWaiting(ctx, srv.URL, "a", "b", time.Hour); !math.IsNaN(got) {
		t.Fatalf("no reading: %v, want NaN", got)
	}
}
