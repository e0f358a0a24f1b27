package engine_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
)

// plover ls's REQUESTS and MEAN count requests that ended, as
// plover_requests_total does: a request was counted when it started and
// its latency when it succeeded, so one still running read as a success
// of no time (after one 1 s request, three more running showed a mean of
// a quarter of it), and a first request still running showed a mean of 0
// where none had succeeded (cli shows "-" only when the requests less the
// failed are none).
func TestLsCountsEndedRequests(t *testing.T) {
	const runMs = 1000
	dir := func() string {
		m := testkit.Slow("slow", runMs)
		m.MaxInstances = 4
		return testkit.BundleDir(t, m, nil)
	}()
	for _, tc := range []struct {
		name           string
		done, inFlight int
	}{
		{"first request running", 0, 1},
		{"one done, three running", 1, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := testkit.Engine(t, engine.Config{})
			testkit.Deploy(t, e, dir)
			ctx := context.Background()
			for range tc.done {
				if err := e.Invoke(ctx, "slow", &call.Request{Input: []byte{1}}); err != nil {
					t.Fatal(err)
				}
			}
			var wg sync.WaitGroup
			for range tc.inFlight {
				wg.Go(func() {
					if err := e.Invoke(ctx, "slow", &call.Request{Input: []byte{1}}); err != nil {
						t.Error(err)
					}
				})
			}
			// One look at the function with all of them running: its
			// counters are read before its instances, so the busy ones
			// had not ended when the counters were read.
			var fi api.FunctionInfo
			waitInfo(t, e, "slow", fmt.Sprintf("%d instances busy", tc.inFlight), func(got api.FunctionInfo) bool {
				fi = got
				return got.Busy == tc.inFlight
			})
			if ok := fi.Requests - fi.ClientErrors - fi.Errors; fi.Requests != int64(tc.done) || ok != int64(tc.done) {
				t.Errorf("with %d done and %d running: requests %d, %d succeeded; want %d and %d (the ended ones)",
					tc.done, tc.inFlight, fi.Requests, ok, tc.done, tc.done)
			}
			if tc.done == 0 && fi.MeanUs != 0 {
				t.Errorf("none done: mean %d µs, want 0", fi.MeanUs)
			}
			if tc.done > 0 && fi.MeanUs < runMs*1000 {
				t.Errorf("with %d done and %d running: mean %v, want at least the run's %d ms", tc.done, tc.inFlight, time.Duration(fi.MeanUs)*time.Microsecond, runMs)
			}
			wg.Wait()
			fi, err := e.Control().Function(ctx, "slow")
			if err != nil {
				t.Fatal(err)
			}
			n := int64(tc.done + tc.inFlight)
			if fi.Requests != n || fi.Requests-fi.ClientErrors-fi.Errors != n || fi.MeanUs < runMs*1000 {
				t.Errorf("all ended: requests %d, %d client errors, %d errors, mean %d µs; want %d succeeded, mean at least %d ms",
					fi.Requests, fi.ClientErrors, fi.Errors, fi.MeanUs, n, runMs)
			}
		})
	}
}
