package httpapi_test

import (
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/funclog"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// The write bound is each write's (followWrite): a client that keeps
// reading, only more slowly than its function prints, is followed for as
// long as it reads (missing lines, told so by "dropped"), not cut once a
// burst has lasted the bound. A function printing without a pause keeps
// its follower's channel from ever emptying, so one burst went on under
// the deadline set at its start, and the stream was cut mid-chunk after
// followWrite (30 s), again and again: the console said [output stream
// ended] and followed again, twice a minute. A client that stops reading
// is still cut after a write bound.
func TestLogsFollowOutlivesALongBurst(t *testing.T) {
	defer httpapi.SetFollowTimes(time.Second, time.Hour)()
	adm := logAdmin{store: funclog.New(nil), followers: make(chan *funclog.Follower, 1)}
	url := testkit.ServeWith(t, httpapi.New(frontdoor.New(frontdoor.Config{}), adm, httpapi.Options{})) + "/v1/functions/f/logs?follow=true"
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	f := <-adm.followers
	var done atomic.Bool
	defer done.Store(true)
	go func() { // a function printing without a pause
		sink, line := adm.store.Sink("f"), strings.Repeat("x", 1000)
		for !done.Load() {
			sink.Add(logLine(line))
		}
	}()
	const read = 4 * time.Second // four write bounds
	buf := make([]byte, 32<<10)
	n, start := 0, time.Now()
	for time.Since(start) < read {
		k, err := resp.Body.Read(buf)
		n += k
		if err != nil {
			if err == io.EOF || err == io.ErrUnexpectedEOF {
				t.Fatalf("the stream ended after %v (%v; %d bytes read, the client reading all along), under a write bound of 1s a write",
					time.Since(start).Round(time.Millisecond), err, n)
			}
			t.Fatalf("after %v: %v", time.Since(start), err)
		}
		time.Sleep(10 * time.Millisecond) // ~3 MB/s: slower than the function prints
	}
	// And the bound still holds: a client that stops reading is cut.
	closedWithin(t, f, 10*time.Second, "a client that stopped reading")
}
