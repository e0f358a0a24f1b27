package bench

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// An open loop interrupted partway reports the interrupt, and counts as
// due only the requests due before it: with 64 workers each holding a
// ticket ahead of the schedule, the one that took the first ticket past
// the deadline stopped the run "by --duration" up to 64 intervals before
// the end, so a later ^C reported --duration, rate × duration due and the
// difference as never sent; and an interrupt's time was taken only after
// the requests in flight had drained, which counted the drain as due.
// The server cancels the run as its 100th request comes in, 1 s into a
// run at 100/s.
func TestOpenLoopInterruptCountsOnlyWhatWasDue(t *testing.T) {
	for _, tt := range []struct {
		name     string
		delay    time.Duration
		duration time.Duration
	}{
		// Ticket 150, past the deadline, is taken about 0.9 s in.
		{"tickets ahead past the deadline", 20 * time.Millisecond, 1500 * time.Millisecond},
		// 40 requests in flight at the interrupt, 0.4 s to drain.
		{"requests in flight drain", 400 * time.Millisecond, 10 * time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			const rate, at = 100, 100
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var hits atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if hits.Add(1) == at {
					cancel()
				}
				time.Sleep(tt.delay)
			}))
			defer srv.Close()
			res, err := Run(ctx, Config{Server: srv.URL, Function: "echo", Rate: rate, Duration: tt.duration})
			if err != nil {
				t.Fatal(err)
			}
			o := res.Open
			// Request 99 (the 100th) is due at 0.99 s; the interrupt
			// follows its arrival by a loopback round trip and a
			// goroutine's wake-up, a few ms on a busy machine.
			if res.Stopped != "interrupted" || o.Scheduled < at || o.Scheduled > at+5 || o.Unsent > 3 {
				t.Fatalf("stopped by %q, %d due, %d sent, %d never sent; want interrupted, %d to %d due, all but a few sent",
					res.Stopped, o.Scheduled, o.Sent, o.Unsent, at, at+5)
			}
		})
	}
}
