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
// is still cut after a write bound, and a drain or a revoked token ends
// a burst that does not end by itself.
func TestLogsFollowOutlivesALongBurst(t *testing.T) {
	defer httpapi.SetFollowTimes(time.Second, time.Hour)()
	adm := logAdmin{store: funclog.New(nil), followers: make(chan *funclog.Follower, 1)}
	srv := httpapi.New(frontdoor.New(frontdoor.Config{}), adm, httpapi.Options{})
	url := testkit.ServeWith(t, srv) + "/v1/functions/f/logs?follow=true"
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	<-adm.followers
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
	// A drain ends it, though the burst goes on.
	srv.SetReady(false)
	for drained := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		if _, err := resp.Body.Read(buf); err != nil {
			break
		}
		if time.Since(drained) > 5*time.Second {
			t.Fatal("the stream still goes on 5 s after the server stopped being ready")
		}
	}
	// And the bound still holds: a client that stops reading is cut.
	srv.SetReady(true)
	resp2, err := (&http.Client{Timeout: 30 * time.Second}).Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp2.Body.Close()
	closedWithin(t, <-adm.followers, 10*time.Second, "a client that stopped reading")
}
