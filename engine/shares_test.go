package engine_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
)

// Two backlogged functions with shares 3:1 split the device's time 3:1
// through the engine (runs that sleep, so that the CPU is not what divides
// them: make bench-fair measures the CPU-bound case).
func TestSharesSplitDeviceTime(t *testing.T) {
	e := testkit.Engine(t, engine.Config{Sched: engine.SchedConfig{MaxRuns: 2}})
	for _, n := range []struct {
		name  string
		share float64
	}{{"a", 3}, {"b", 1}} {
		m := testkit.Slow(n.name, 5)
		m.MaxInstances, m.Share = 4, n.share
		testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	var wg sync.WaitGroup
	for _, fn := range []string{"a", "a", "a", "a", "a", "a", "a", "a", "b", "b", "b", "b", "b", "b", "b", "b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				e.Invoke(context.Background(), fn, &call.Request{Input: []byte{1}})
			}
		}()
	}
	wg.Wait()
	a, b := info(t, e, "a"), info(t, e, "b")
	part := a.DeviceSeconds / (a.DeviceSeconds + b.DeviceSeconds)
	if part < 0.68 || part > 0.82 {
		t.Fatalf("a (share 3) had %.3f of the device time (a %.3fs in %d requests, b %.3fs in %d), want 0.75", part, a.DeviceSeconds, a.Requests, b.DeviceSeconds, b.Requests)
	}
}
